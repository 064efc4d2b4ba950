"""Quantiles, one definition for the whole package: of a sample (`percentile`), over a sliding window
of the most recent samples in bounded memory (`StreamingQuantile`), and the lower median across
replicas (`lower_median`) that the router and the hedge delay compare replicas by.

Both interpolate linearly between order statistics (Hyndman & Fan type 7: numpy's default,
``statistics.quantiles(method="inclusive")``).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Sequence

__all__ = ["StreamingQuantile", "lower_median", "percentile"]


def lower_median(values: list[float]) -> float | None:
    """The lower middle value (``values`` is sorted in place), or None if there is none: robust to a
    slow minority, and with two values the faster one."""
    if not values:
        return None
    values.sort()
    return values[(len(values) - 1) // 2]


def _interpolate(ordered: Sequence[float], q: float) -> float:
    """The type-7 ``q``-quantile (0 <= q <= 1) of non-empty, sorted ``ordered``."""
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    return min(ordered[low] + (ordered[high] - ordered[low]) * fraction, ordered[high])  # no overshoot


def percentile(values: Iterable[float], p: float) -> float | None:
    """The ``p``-th percentile (0..100) of ``values`` (any order), or None when there are none."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 100:
        raise ValueError(f"percentile p must be a number in [0, 100], got {p!r}")
    ordered = sorted(values)
    if not ordered:
        return None
    return _interpolate(ordered, p / 100.0)


class StreamingQuantile:
    """Quantiles of the last ``size`` samples (e.g. p95 of recent time-to-first-token per tier).

    Keeps a ring buffer of the last ``size`` samples (arrival order, to know which one ages out)
    and the same samples as a sorted list, updated incrementally on every :meth:`add` (binary
    search plus one C-level ``memmove`` to insert the new sample and remove the evicted one). So
    :meth:`quantile` is O(1) and exact, memory is two containers of at most ``size`` entries, and there is no
    sort on the hot path even when every request both adds a sample and asks for the hedge delay,
    which a "sorted copy cached until the next insert" would re-sort each time.

    Why not a sketch (P-squared, t-digest, KLL, decaying histograms)? They trade exactness for
    sub-linear memory, which buys nothing at a few hundred samples, and P-squared summarises all
    history with no forgetting, so it would not follow a replica that just got slower. A count-based
    window forgets at the traffic's own pace; an idle tier keeps its last known distribution.

    Quantiles are `percentile`'s (type 7).
    """

    __slots__ = ("_ring", "_size", "_sorted")

    def __init__(self, size: int = 256) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be an int >= 1, got {size!r}")
        self._size = size
        self._ring: deque[float] = deque(maxlen=size)
        self._sorted: list[float] = []

    @property
    def size(self) -> int:
        """Maximum number of samples held."""
        return self._size

    @property
    def count(self) -> int:
        """Number of samples currently held (at most ``size``)."""
        return len(self._ring)

    def __len__(self) -> int:
        return len(self._ring)

    def add(self, x: float) -> None:
        """Add a sample (finite and >= 0); the oldest one is dropped once ``size`` are held."""
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise ValueError(f"sample must be a finite number >= 0, got {x!r}")
        try:
            value = float(x) + 0.0  # "+ 0.0" normalises -0.0, so equal samples are indistinguishable
        except OverflowError:  # an int too large for a float
            value = math.inf
        if not (math.isfinite(value) and value >= 0.0):
            raise ValueError(f"sample must be a finite number >= 0, got {x!r}")
        ordered = self._sorted
        if len(self._ring) == self._size:
            del ordered[bisect.bisect_left(ordered, self._ring[0])]  # equal values are interchangeable
        self._ring.append(value)  # deque(maxlen) drops the oldest
        bisect.insort(ordered, value)

    def quantile(self, q: float) -> float | None:
        """The ``q``-quantile (0 < q < 1) of the samples held, or None if there are none."""
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 < q < 1.0:
            raise ValueError(f"q must be a number strictly between 0 and 1, got {q!r}")
        ordered = self._sorted
        return _interpolate(ordered, q) if ordered else None

    def __repr__(self) -> str:
        return f"StreamingQuantile(size={self._size}, count={len(self._ring)})"
