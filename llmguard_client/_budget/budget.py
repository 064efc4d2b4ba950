"""A sliding-window budget shared by retries and hedges (Finagle/Envoy/gRPC-style retry throttling)."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = ["BUCKETS_PER_WINDOW", "BudgetSnapshot", "BudgetTicket", "FleetBudgetSnapshot", "RetryBudget", "SharedWindow"]

BUCKETS_PER_WINDOW = 10
"""Time resolution of :class:`RetryBudget`: a bucket spans ``window / BUCKETS_PER_WINDOW`` seconds."""


@dataclass(frozen=True, slots=True)
class FleetBudgetSnapshot:
    """The fleet's totals for a ``BudgetPolicy(scope="fleet")`` budget, as last read from the fleet store."""

    in_force: bool
    """Whether the fleet totals decide now (False: the store is not connected; the process's own window does)."""
    window_requests: int
    """Logical calls of every process of the fleet in the window, as last read (a conservative under-count)."""
    window_extras: int
    """Extra attempts of every process of the fleet in the window, as last read (a conservative over-count)."""
    age: float | None
    """Seconds since that read (None: never read)."""
    syncs: int
    """Completed syncs: this process's counts added to the fleet's and the totals read back."""
    processes: int
    """Processes of the fleet syncing a budget, as last read: each may spend its share of what the fleet has left
    (``level`` is this process's share, plus what its own calls since the read earned)."""


class SharedWindow(Protocol):
    """What a fleet-scoped budget consults (``llmguard_client._budget.fleet_sync``)."""

    def totals(self) -> tuple[float, float] | None:
        """(requests, extras) of the fleet in the window, this process's unsynced ones included; None: the
        fleet's totals are not in force (the budget decides on its own window)."""

    def view(self) -> FleetBudgetSnapshot:
        """The snapshot of the last read."""


@dataclass(frozen=True, slots=True)
class BudgetSnapshot:
    """The retry budget's state (``guard.snapshot().budget``, per tier ``tier_budgets``)."""

    level: float
    """Extra attempts (retries + hedges) that could be acquired right now."""
    spent: int
    """Lifetime extra attempts acquired and not refunded."""
    refused: int
    """Lifetime :meth:`RetryBudget.try_acquire` calls that were refused."""
    requests: int
    """Lifetime logical requests recorded."""
    window_requests: int
    """Logical requests credited to the current window (a conservative under-count)."""
    window_extras: int
    """Extra attempts charged to the current window (a conservative over-count)."""
    paced: int = 0
    """Lifetime retries admitted past the bound, and not refunded, because they are paced as the plain SDK's
    retry would be (`RetryBudget.try_acquire`); in ``spent`` too."""
    pending: int = 0
    """Tickets acquired but neither used (`BudgetTicket.settle`) nor refunded: 0 when no call is live."""
    scope: Literal["process", "fleet"] = "process"
    """``BudgetPolicy.scope``: whose calls and extra attempts the budget counts."""
    fleet: FleetBudgetSnapshot | None = None
    """The fleet's totals last read (None for ``scope="process"``); ``level`` is computed from them while
    ``fleet.in_force``."""


def _as_float(value: object) -> float:
    """``value`` as a float; NaN for non-numbers (including bool) and ints too large for a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return math.nan


class _Bucket:
    """Events whose timestamps lie in ``[first, last]``; tickets ``seq_lo..seq_hi`` were issued in it."""

    __slots__ = ("extras", "first", "last", "requests", "seq_hi", "seq_lo")

    def __init__(self, now: float, seq: int) -> None:
        self.first = now
        self.last = now
        self.requests = 0
        self.extras = 0
        self.seq_lo = seq
        self.seq_hi = seq - 1  # empty ticket range until a ticket is issued


class BudgetTicket:
    """One reserved extra attempt: :meth:`settle` it when the attempt is sent, :meth:`refund` it if it
    never is. Until one of the two, it counts as ``pending`` in the budget's snapshot."""

    __slots__ = ("_budget", "_paced", "_refunded", "_seq", "_settled")

    def __init__(self, budget: RetryBudget, seq: int, paced: bool = False) -> None:
        self._budget = budget
        self._seq = seq
        self._paced = paced
        """Admitted past the bound (a paced retry)."""
        self._refunded = False
        self._settled = False

    def settle(self) -> None:
        """The attempt was sent: the ticket stays spent and is no longer pending. Idempotent."""
        if not self._settled and not self._refunded:
            self._settled = True
            self._budget._pending -= 1

    @property
    def refunded(self) -> bool:
        """Whether :meth:`refund` has been called."""
        return self._refunded

    def refund(self) -> None:
        """Return the attempt to the budget; it no longer counts. Idempotent; no-op once settled."""
        if not self._refunded and not self._settled:
            self._refunded = True
            self._budget._pending -= 1
            self._budget._refund(self._seq, self._paced)

    def __repr__(self) -> str:
        return f"BudgetTicket(seq={self._seq}, refunded={self._refunded})"


class RetryBudget:
    """Caps extra attempts (retries and hedges) at ``ratio x recent requests + floor``.

    Over any sliding window of ``window`` seconds, extra attempts may be at most ``ratio`` times the
    logical requests started in that window plus ``floor`` (so a quiet client can still retry
    ``floor`` times). Defaults allow 10 % extra load plus 4 attempts per 10 s, in the spirit of
    Finagle's RetryBudget, Envoy retry budgets and gRPC retry throttling: during an outage retries
    cannot multiply the load on a struggling backend.

    Memory is bounded whatever the event rate: events are counted in at most
    ``BUCKETS_PER_WINDOW + 2`` buckets, each opened at its first event and spanning
    ``window / BUCKETS_PER_WINDOW`` seconds. Each bucket remembers the exact times of its first and
    last event, and counting is conservative: a bucket's requests are credited only if its *first*
    event is inside the window, its extras are charged if its *last* event is. Hence, for every
    acquisition at time ``s``, exactly (no rounding slack)::

        extras acquired in (s - window, s] <= ratio * requests recorded in (s - window, s] + floor

    The price is that up to one bucket (10 % of the window) of requests may go uncredited, so the
    effective ratio at steady state is between ``0.9 * ratio`` and ``ratio``.

    One kind of extra attempt passes the bound: a *paced* retry, one the plain SDK would send, at its pace: back to
    the replica that answered with a Retry-After, no sooner than it asked (or with a 429 without one, once the
    guard's cool-down standing in for it ends); after the replica's own failure, after the backoff of a retry to
    the same replica, to a ready one; after an overload answer without a Retry-After, at once to another replica
    that is ready (the retry layer decides). The bound is on the load the guard adds to the plain SDK's, so an
    empty budget does not end such a call. It is still charged to the window (hedges see the load) and counted in
    ``paced``; the bound above holds for every other extra attempt.

    With ``share`` (``BudgetPolicy(scope="fleet")``) the budget decides on the fleet's totals whenever they are
    in force, and keeps its own window for when they are not.

    Meant for a single event loop: no locks. A clock that goes backwards (a test's frozen clock let go, a loop
    on another time line) moves the window back with it: what it held still counts, and leaves it as time goes
    on. Other threads (a metrics exporter) read only
    :meth:`published_level`.
    """

    __slots__ = (
        "__weakref__",
        "_buckets",
        "_clock",
        "_floor",
        "_granularity",
        "_max_buckets",
        "_next_seq",
        "_now",
        "_paced",
        "_pending",
        "_published",
        "_ratio",
        "_refused",
        "_requests",
        "_shared",
        "_spent",
        "_window",
    )

    def __init__(
        self,
        ratio: float = 0.1,
        floor: int = 4,
        window: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        ratio_f, window_f = _as_float(ratio), _as_float(window)
        if not 0.0 <= ratio_f <= 10.0:
            raise ValueError(f"ratio must be a number in [0, 10], got {ratio!r}")
        if not isinstance(floor, int) or not 0.0 <= _as_float(floor) < math.inf:  # bool -> NaN
            raise ValueError(f"floor must be an int >= 0, got {floor!r}")
        if not 0.0 < window_f < math.inf:
            raise ValueError(f"window must be a finite number of seconds > 0, got {window!r}")
        self._ratio = ratio_f
        self._floor = floor
        self._window = window_f
        self._granularity = self._window / BUCKETS_PER_WINDOW
        self._max_buckets = BUCKETS_PER_WINDOW + 2
        self._clock = clock
        self._buckets: deque[_Bucket] = deque()
        self._now = -math.inf
        self._next_seq = 0
        self._requests = 0
        self._spent = 0
        self._pending = 0
        self._paced = 0
        self._refused = 0
        self._published = float(floor)
        self._shared: SharedWindow | None = None

    @property
    def ratio(self) -> float:
        """Extra attempts allowed per logical request in the window."""
        return self._ratio

    @property
    def floor(self) -> int:
        """Extra attempts allowed per window regardless of traffic."""
        return self._floor

    @property
    def window(self) -> float:
        """Sliding window length in seconds."""
        return self._window

    def share(self, shared: SharedWindow) -> None:
        """Decide against the fleet's totals (``BudgetPolicy(scope="fleet")``) whenever ``shared`` has them."""
        self._shared = shared

    @property
    def requests(self) -> int:
        """Lifetime logical requests recorded."""
        return self._requests

    def record_request(self) -> None:
        """Record that one logical call started (earns ``ratio`` extra attempts for ``window`` s)."""
        now = self._tick()
        self._current(now).requests += 1
        self._requests += 1
        self._publish(now)

    def try_acquire(self, paced: bool = False) -> BudgetTicket | None:
        """Reserve one extra attempt (retry or hedge); None if the budget refuses (counted in ``refused``).
        ``paced``: a retry the server paced (see the class doc), admitted past the bound (counted in ``paced``)."""
        now = self._tick()
        requests, extras = self._counts(now)
        past = extras + 1 > self._ratio * requests + self._floor
        if past and not paced:
            self._refused += 1
            self._publish(now)
            return None
        self._paced += past
        bucket = self._current(now)
        bucket.extras += 1
        seq = self._next_seq
        self._next_seq += 1
        bucket.seq_hi = seq
        self._spent += 1
        self._pending += 1
        self._publish(now)
        return BudgetTicket(self, seq, past)

    @property
    def level(self) -> float:
        """Extra attempts available right now (fractional; ``try_acquire`` succeeds iff ``>= 1``, or for a
        paced retry)."""
        return self._publish(self._tick())

    @property
    def spent(self) -> int:
        """Lifetime extra attempts acquired and not refunded."""
        return self._spent

    @property
    def refused(self) -> int:
        """Lifetime refused acquisitions."""
        return self._refused

    def snapshot(self) -> BudgetSnapshot:
        """Return the current level and counters as an immutable value. Read without moving the window: a snapshot
        may be taken from any thread, on a clock other than the loop's (behind it, under a test's frozen clock)."""
        now = max(self._clock(), self._now)
        requests, extras = self._window_counts(now)
        shared = self._shared
        return BudgetSnapshot(
            level=self._publish(now),
            spent=self._spent,
            refused=self._refused,
            requests=self._requests,
            window_requests=requests,
            window_extras=extras,
            paced=self._paced,
            pending=self._pending,
            scope="process" if shared is None else "fleet",
            fleet=None if shared is None else shared.view(),
        )

    def __repr__(self) -> str:
        return (
            f"RetryBudget(ratio={self._ratio}, floor={self._floor}, window={self._window}, "
            f"spent={self._spent}, refused={self._refused})"
        )

    # -- internals ---------------------------------------------------------------------------------

    def _tick(self) -> float:
        """Read the clock (never backwards) and drop buckets that can no longer matter."""
        now = self._clock()
        if now < self._now:  # the clock went back: so does the window, rather than standing still until it is back
            by = now - self._now
            for bucket in self._buckets:
                bucket.first += by
                bucket.last += by
        self._now = now
        horizon = now - self._window
        buckets = self._buckets
        while buckets and buckets[0].last <= horizon:  # every event in it is outside all future windows
            buckets.popleft()
        return now

    def _window_counts(self, now: float) -> tuple[int, int]:
        """(requests surely inside, extras possibly inside) the window ``(now - window, now]``."""
        horizon = now - self._window
        requests = extras = 0
        for bucket in self._buckets:
            if bucket.last <= horizon:  # outside the window (`_tick` drops such buckets; a snapshot does not)
                continue
            extras += bucket.extras
            if bucket.first > horizon:
                requests += bucket.requests
        return requests, extras

    def _counts(self, now: float) -> tuple[float, float]:
        """What the budget decides on: the fleet's totals while they are in force, else its own window."""
        shared = self._shared
        if shared is not None:
            totals = shared.totals()
            if totals is not None:
                return totals
        return self._window_counts(now)

    def _current(self, now: float) -> _Bucket:
        """The bucket that events at ``now`` go into, opening one if needed."""
        buckets = self._buckets
        if buckets and now - buckets[-1].first < self._granularity:
            bucket = buckets[-1]
        else:
            bucket = _Bucket(now, self._next_seq)
            buckets.append(bucket)
            if len(buckets) > self._max_buckets:
                self._merge_oldest()
        bucket.last = now
        return bucket

    def _merge_oldest(self) -> None:
        """Fold the oldest bucket into the next. Safe: widening [first, last] only adds conservatism.

        Cannot happen with a monotonic clock (live buckets start >= granularity apart within
        ``window + granularity``); it is a hard backstop on memory against float edge cases.
        """
        old = self._buckets.popleft()
        nxt = self._buckets[0]
        nxt.first = min(old.first, nxt.first)
        nxt.last = max(old.last, nxt.last)
        nxt.requests += old.requests
        nxt.extras += old.extras
        nxt.seq_lo = min(old.seq_lo, nxt.seq_lo)
        nxt.seq_hi = max(old.seq_hi, nxt.seq_hi)

    def _refund(self, seq: int, paced: bool) -> None:
        self._spent -= 1
        self._paced -= paced
        for bucket in self._buckets:
            if bucket.seq_lo <= seq <= bucket.seq_hi:
                bucket.extras -= 1
                self._publish(self._now)
                return
        # The bucket already aged out of every window: only the lifetime counter changes.

    # -- the published level: the one value another thread may read ---------------------------

    def published_level(self) -> float:
        """The level as of the budget's last operation; safe to call from any thread (a metrics exporter).

        Every operation on the loop (a call recorded, an attempt acquired, refused or refunded, a read
        of `level` or `snapshot`) publishes the level it leaves; this only reads that float, never the
        window. While no call runs it is not refreshed as old attempts age out of the window.
        """
        return self._published

    def _publish(self, now: float) -> float:
        """Compute the level at ``now`` (on the loop) and publish it; return it."""
        requests, extras = self._counts(now)
        level = self._published = max(0.0, self._ratio * requests + self._floor - extras)
        return level
