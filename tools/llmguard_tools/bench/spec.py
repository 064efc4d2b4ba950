"""`RunSpec`: what one ``llmguard bench`` run replays and how (the plan, the tier, the clients' settings)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmguard_tools.bench.measure import TierSpec
from llmguard_tools.bench.traffic import TrafficPlan

__all__ = ["RunSpec"]


@dataclass
class RunSpec:
    plan: TrafficPlan
    tier: TierSpec
    model: str | None = None
    deadline: float | None = None
    drain_timeout: float = 15.0
    api_key: str | None = None
    rollout: float | None = None
    """The ``rollout`` client's guarded fraction (bench/rollout.py)."""
    records: str | None = None
    """Where the ``rollout`` client writes its phase records (JSON lines)."""
    tiers: tuple[str, ...] = ()
    """Each planned call's tier, by index (``--tier-mix``); empty: all on ``tier``."""
    hints_every: float | None = None
    """Seconds between the ``guarded-hints`` client's polls (``--hints-every``); ``None``: the poller's default."""
    fleet: tuple[str, str] | None = None
    """``(Redis URL, fleet name)`` for the guarded clients' Guards (``--fleet``)."""
    processes: dict[str, int] = field(default_factory=dict)
    """Client name -> worker processes replaying its plan together (bench/shards.py); absent: this one."""
