"""One replica's load signal: what the replica reported (ORCA header, ``/metrics``), with its age, and what the
guard infers from its own attempts (TTFT against its unloaded floor, overload answers).

Every time is on the Guard's clock. A report older than ``fresh_for`` is ignored (`server_waiting` is None).
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
    """The load of one replica as the guard knows it now."""

    fresh_for: float
    reported_at: float = -math.inf
    reported_waiting: float | None = None
    reported_kv: float | None = None
    ttft_floor: float | None = None
    """The fastest first token seen (the replica unloaded), slowly forgotten."""
    ttft_recent: float | None = None
    """An EWMA of recent first tokens (seconds after the attempt was admitted)."""
    overloaded_at: float = -math.inf
    """When the replica last said it is overloaded (429, 503, in-stream overload)."""
    _floor_at: float = 0.0

    def report(self, now: float, waiting: float | None, kv: float | None) -> None:
        """The replica's own report (ORCA header or ``/metrics``), read at ``now``."""
        if waiting is None and kv is None:
            return
        self.reported_at = now
        self.reported_waiting = waiting
        self.reported_kv = kv

    def age(self, now: float) -> float:
        """Seconds since the replica's last report (inf: never)."""
        return now - self.reported_at

    def server_waiting(self, now: float) -> float | None:
        """The waiting queue the replica reported, if the report is fresh."""
        return self.reported_waiting if self.age(now) <= self.fresh_for else None

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
