"""What the guard infers of one replica's load from its own attempts (TTFT against its unloaded floor, overload
answers), on the Guard's clock; and vLLM's ORCA load header parsed. What a replica reports of itself (the ORCA
header, ``/metrics``) is kept with its health (`llmguard_client._routing.health`), where the router reads it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["LoadSignal", "parse_orca"]

ORCA_HEADER = "endpoint-load-metrics"
ORCA_FORMAT_HEADER = b"endpoint-load-metrics-format"
_FLOOR_DECAY_S = 30.0
"""The unloaded TTFT floor drifts up by 1 % per this many seconds, so that a stale minimum is forgotten."""


def parse_orca(value: str) -> tuple[float | None, float | None]:
    """(waiting requests, KV use 0-1) from vLLM's ``endpoint-load-metrics: TEXT named_metrics.x=..., ...``."""
    text = value.strip()
    if not text.upper().startswith("TEXT"):
        return None, None
    waiting: float | None = None
    kv: float | None = None
    for part in text[4:].split(","):
        name, _, raw = part.strip().partition("=")
        try:
            number = float(raw)
        except ValueError:
            continue
        if not math.isfinite(number) or number < 0:
            continue
        if name.endswith("num_requests_waiting"):
            waiting = number
        elif name.endswith("kv_cache_usage_perc"):
            kv = number
    return waiting, kv


@dataclass(slots=True)
class LoadSignal:
    """The load of one replica as the guard infers it from its own attempts."""

    ttft_floor: float | None = None
    """The fastest first token seen (the replica unloaded), slowly forgotten."""
    ttft_recent: float | None = None
    """An EWMA of recent first tokens (seconds after the attempt was admitted)."""
    overloaded_at: float = -math.inf
    """When the replica last said it is overloaded (429, 503, in-stream overload)."""
    _floor_at: float = 0.0

    def first_token(self, now: float, ttft: float) -> None:
        """An admitted attempt got its first token ``ttft`` seconds after it was sent."""
        floor = self.ttft_floor
        if floor is not None:
            floor *= 1.0 + 0.01 * max(0.0, now - self._floor_at) / _FLOOR_DECAY_S
        self.ttft_floor = ttft if floor is None else min(floor, ttft)
        self._floor_at = now
        recent = self.ttft_recent
        self.ttft_recent = ttft if recent is None else recent + 0.2 * (ttft - recent)

    def overloaded(self, now: float) -> None:
        self.overloaded_at = now
