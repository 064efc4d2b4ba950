"""Fault injection for the user's own tests (`Chaos`): off unless ``LLMGUARD_CHAOS=1``, applied per attempt."""

from llmguard_client._chaos.injector import ChaosSwitch, ChaosTransport, chaos_switch, refuse_unless_enabled
from llmguard_client._chaos.policy import CHAOS_ENV, Chaos, chaos_enabled

__all__ = [
    "CHAOS_ENV",
    "Chaos",
    "ChaosSwitch",
    "ChaosTransport",
    "chaos_enabled",
    "chaos_switch",
    "refuse_unless_enabled",
]
