"""How long the servers' waiting queues take to come back to their pre-spike depth after a spike ends.

Read from the simulated replicas' history (``/sim/stats``: ``[t, running, waiting, kv_used]`` samples on each
engine's own clock, which starts with the client's first request): the replicas' waiting queues are summed
sample by sample; the depth before the spike is the deepest sum before the peak segment of the plan's rate
profile begins; the recovery is the first sample at or after the peak segment's end whose sum is no deeper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmguard_tools.bench.rates import RateProfile

__all__ = ["QueueRecovery", "queue_recovery"]


@dataclass(frozen=True)
class QueueRecovery:
    before: float
    """Deepest summed waiting queue before the spike."""
    at_end: float
    """Summed waiting queue at the spike's end (the first sample at or after it)."""
    seconds: float | None
    """From the spike's end to the first sample back at ``before`` or less (None: not within ``observed``)."""
    observed: float
    """Seconds of history after the spike's end."""


def spike_window(profile: RateProfile | None) -> tuple[float, float] | None:
    """(start, end) of the peak segment, when it has a lower segment on both sides; else None."""
    if profile is None or len(profile.segments) < 3:
        return None
    rates = [r for r, _ in profile.segments]
    peak = rates.index(max(rates))
    if peak in (0, len(rates) - 1):
        return None
    start = sum(d for _, d in profile.segments[:peak])
    return start, start + profile.segments[peak][1]


def queue_recovery(replicas: list[dict[str, Any]], profile: RateProfile | None) -> QueueRecovery | None:
    """The recovery of the summed waiting queues after the spike of ``profile`` (None: no spike or no history)."""
    window = spike_window(profile)
    found = [r.get("history") for r in replicas]
    histories: list[list[list[float]]] = [h for h in found if isinstance(h, list) and len(h) > 1]
    if window is None or not histories or len(histories) != len(found):
        return None
    start, end = window
    summed: dict[int, float] = {}
    every = min(h[1][0] - h[0][0] for h in histories)
    for history in histories:
        for t, _running, waiting, *_ in history:
            key = round(t / every)
            summed[key] = summed.get(key, 0.0) + waiting
    samples = sorted((k * every, w) for k, w in summed.items())
    before = max((w for t, w in samples if t < start), default=0.0)
    after = [(t, w) for t, w in samples if t >= end]
    if not after:
        return None
    back = next((t - end for t, w in after if w <= before), None)
    return QueueRecovery(before, after[0][1], back, after[-1][0] - end)
