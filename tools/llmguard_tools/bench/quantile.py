"""The percentile every report of the tools uses (bench, compare, the simulator's virtual runs).

Type 7 of Hyndman & Fan: linear interpolation between order statistics, numpy's default and
``statistics.quantiles(method="inclusive")``, the definition the guard's own statistics use too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["percentile"]


def percentile(values: Iterable[float], p: float) -> float | None:
    """The ``p``-th percentile (0..100) of ``values`` (any order), or None when there are none."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 100:
        raise ValueError(f"percentile p must be a number in [0, 100], got {p!r}")
    ordered = sorted(values)
    if not ordered:
        return None
    position = p / 100.0 * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return min(ordered[low] + (ordered[high] - ordered[low]) * (position - low), ordered[high])  # no overshoot
