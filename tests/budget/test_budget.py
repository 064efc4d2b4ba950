from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st

from llmguard_client._budget.budget import (
    BUCKETS_PER_WINDOW,
    BudgetSnapshot,
    BudgetTicket,
    RetryBudget,
)

MAX_BUCKETS = BUCKETS_PER_WINDOW + 2


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        self.now += dt


@dataclass
class Log:
    """Exact brute-force record of every event's timestamp."""

    requests: list[float] = field(default_factory=list)
    tickets: list[tuple[float, BudgetTicket]] = field(default_factory=list)

    def requests_in(self, lo: float, hi: float) -> int:  # (lo, hi]
        return sum(lo < t <= hi for t in self.requests)

    def extras_in(self, lo: float, hi: float) -> int:  # (lo, hi], refunded tickets do not count
        return sum(lo < t <= hi and not ticket.refunded for t, ticket in self.tickets)


def assert_invariant(budget: RetryBudget, log: Log) -> float:
    """Check the budget invariant at every acquisition time; return the tightest margin seen."""
    tightest = math.inf
    for s in {t for t, _ in log.tickets}:
        allowed = budget.ratio * log.requests_in(s - budget.window, s) + budget.floor
        extras = log.extras_in(s - budget.window, s)
        assert extras <= allowed, s
        tightest = min(tightest, allowed - extras)
    return tightest


# An event happens at a time given in bucket granularities since the start: mostly on a quarter-bucket
# grid spanning 1.5 windows, so bucket and window edges are hit often, sometimes at arbitrary floats.
at = st.one_of(st.integers(0, 4 * 15).map(lambda k: k / 4), st.floats(0, 30))
event = st.one_of(
    st.tuples(at, st.just("req"), st.integers(1, 20)),
    st.tuples(at, st.just("acq"), st.integers(1, 8)),
    st.tuples(at, st.just("refund"), st.floats(0, 1)),  # which ticket, as a fraction of those issued
)
Event = tuple[float, str, float]


def assert_bookkeeping(budget: RetryBudget, log: Log) -> None:
    """Each live bucket charges exactly its non-refunded tickets."""
    for bucket in budget._buckets:
        live = [t for _, t in log.tickets if bucket.seq_lo <= t._seq <= bucket.seq_hi and not t.refunded]
        assert bucket.extras == len(live)


def run(ratio: float, floor: int, window: float, start: float, events: list[Event], max_buckets: int) -> None:
    """Replay ``events`` in time order against a budget and an exact log; check invariant, memory, counters."""
    clock = FakeClock(start)
    budget = RetryBudget(ratio=ratio, floor=floor, window=window, clock=clock)
    budget._max_buckets = max_buckets  # exercise the merging backstop when small
    log = Log()
    refused = 0
    tightest, stingiest = math.inf, -math.inf
    granularity = window / BUCKETS_PER_WINDOW
    for when, kind, arg in sorted(events, key=lambda e: e[0]):
        clock.now = start + when * granularity
        if kind == "req":
            for _ in range(int(arg)):
                budget.record_request()
                log.requests.append(clock.now)
        elif kind == "acq":
            for _ in range(int(arg)):
                ticket = budget.try_acquire()
                s = clock.now
                if ticket is None:
                    refused += 1
                    if max_buckets == MAX_BUCKETS:
                        # Not needlessly stingy: refuse only when even a generously-counted exact log
                        # (requests one bucket less of the window, extras one bucket more) is full.
                        slack = 1.01 * granularity
                        extras = log.extras_in(s - window - slack, s)
                        requests = log.requests_in(s - window + slack, s)
                        assert extras + 1 > ratio * requests + floor
                        stingiest = max(stingiest, ratio * requests + floor - extras - 1)
                else:
                    log.tickets.append((s, ticket))
                    tightest = min(tightest, assert_invariant(budget, log))
        elif log.tickets:
            log.tickets[min(int(arg * len(log.tickets)), len(log.tickets) - 1)][1].refund()
        assert_bookkeeping(budget, log)
        assert len(budget._buckets) <= max_buckets
        assert budget.refused == refused
        assert budget.spent == sum(not ticket.refunded for _, ticket in log.tickets)
    assert_invariant(budget, log)
    if math.isfinite(tightest):
        target(-tightest, label="closeness to the budget limit")  # steer the search to the edges
    if math.isfinite(stingiest):
        target(stingiest, label="closeness to a needless refusal")


params = {
    "ratio": st.one_of(st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0, 10.0]), st.floats(0, 10)),
    "floor": st.integers(0, 4),
    "window": st.one_of(st.sampled_from([0.1, 1.0, 10.0]), st.floats(1e-3, 1e4)),
    "start": st.one_of(st.just(0.0), st.floats(-1e6, 1e6)),
    "events": st.lists(event, max_size=40),
}


@settings(max_examples=300, deadline=None, database=None)
@given(**params)
def test_invariant_against_exact_log(
    ratio: float, floor: int, window: float, start: float, events: list[Event]
) -> None:
    run(ratio, floor, window, start, events, MAX_BUCKETS)


@settings(max_examples=150, deadline=None, database=None)
@given(**params, max_buckets=st.integers(1, 3))
def test_invariant_survives_bucket_merging(
    ratio: float, floor: int, window: float, start: float, events: list[Event], max_buckets: int
) -> None:
    run(ratio, floor, window, start, events, max_buckets)


def test_requests_in_a_bucket_straddling_the_window_edge_are_not_credited() -> None:
    clock = FakeClock(0.0)
    budget = RetryBudget(ratio=1.0, floor=0, window=10.0, clock=clock)  # buckets of 1 s
    for _ in range(10):
        budget.record_request()
    clock.now = 0.5
    budget.record_request()  # same bucket: events in [0, 0.5]
    clock.now = 10.2  # window (0.2, 10.2] holds 1 request; the bucket cannot tell which, so credits none
    assert budget.snapshot().window_requests == 0
    assert budget.try_acquire() is None


def test_extras_in_a_bucket_straddling_the_window_edge_still_count() -> None:
    clock = FakeClock(0.0)
    budget = RetryBudget(ratio=0.0, floor=2, window=10.0, clock=clock)
    assert budget.try_acquire() is not None
    clock.now = 0.5
    assert budget.try_acquire() is not None  # same bucket: events in [0, 0.5]
    clock.now = 10.2  # the extra at 0.5 is still inside (0.2, 10.2]: charge the whole bucket
    assert (budget.level, budget.try_acquire()) == (0.0, None)
    clock.now = 10.5  # (0.5, 10.5]: the bucket's last event left the window
    assert budget.level == 2.0


def test_requests_credited_with_one_bucket_resolution() -> None:
    clock = FakeClock(0.0)
    budget = RetryBudget(ratio=1.0, floor=0, window=10.0, clock=clock)
    budget.record_request()  # bucket [0, 1)
    clock.now = 1.0
    for _ in range(10):
        budget.record_request()  # a new bucket opens exactly one granularity later
    clock.now = 10.5  # window (0.5, 10.5]: the bucket starting at 1.0 is wholly inside
    assert budget.level == 10.0
    clock.now = 11.0  # (1.0, 11.0]: now it is out
    assert budget.level == 0.0


def test_merged_buckets_stay_conservative() -> None:
    clock = FakeClock(0.0)
    budget = RetryBudget(ratio=1.0, floor=1, window=10.0, clock=clock)
    budget._max_buckets = 1  # force every new bucket to absorb the previous one
    for _ in range(10):
        budget.record_request()
    old = budget.try_acquire()
    clock.now = 5.0
    budget.record_request()
    assert len(budget._buckets) == 1
    clock.now = 10.2  # window (0.2, 10.2] holds 1 request and the ticket-free bucket now spans [0, 5]
    assert budget.snapshot().window_requests == 0  # the merged bucket's first event is outside
    assert old is not None
    old.refund()  # a ticket from an absorbed bucket is still found
    assert budget.snapshot().window_extras == 0
    assert budget.level == 1.0


def test_memory_bounded_whatever_the_rate() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.5, floor=2, window=1.0, clock=clock)
    for _ in range(50_000):
        budget.record_request()
        budget.try_acquire()
        clock.advance(1e-4)
        assert len(budget._buckets) <= MAX_BUCKETS
    assert budget.snapshot().requests == 50_000


def test_quiet_client_can_retry_floor_times() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.1, floor=3, window=10.0, clock=clock)
    tickets = [budget.try_acquire() for _ in range(3)]
    assert all(isinstance(t, BudgetTicket) for t in tickets)
    assert budget.try_acquire() is None
    assert (budget.spent, budget.refused, budget.level) == (3, 1, 0.0)
    clock.advance(9.9)
    assert budget.try_acquire() is None
    clock.advance(0.1)  # the first acquisitions leave the window (s - 10, s]
    assert budget.level == 3.0
    assert budget.try_acquire() is not None


def test_level_grows_with_requests() -> None:
    budget = RetryBudget(ratio=0.1, floor=3, window=10.0, clock=FakeClock())
    for _ in range(100):
        budget.record_request()
    assert budget.level == pytest.approx(13.0)
    granted = 0
    while budget.try_acquire() is not None:
        granted += 1
    assert granted == 13
    assert budget.level == pytest.approx(0.0, abs=1e-9)


def test_ratio_honoured_at_steady_state() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.1, floor=3, window=10.0, clock=clock)
    granted = requests = 0
    for _ in range(6_000):  # 60 s at 100 requests/s, every request wants one extra attempt
        budget.record_request()
        requests += 1
        if budget.try_acquire() is not None:
            granted += 1
        clock.advance(0.01)
    # At most ratio x requests + floor per window (6 windows); at least 0.9 x ratio (conservative bucketing).
    assert granted <= 0.1 * requests + 3 * 6
    assert granted >= 0.085 * requests
    assert budget.spent == granted
    assert budget.refused == requests - granted


def test_zero_ratio_zero_floor_refuses_everything() -> None:
    budget = RetryBudget(ratio=0.0, floor=0, clock=FakeClock())
    for _ in range(1000):
        budget.record_request()
    assert budget.try_acquire() is None
    assert budget.level == 0.0
    assert budget.refused == 1


def test_a_paced_retry_is_paid_while_there_is_room_and_passes_the_bound_when_there_is_none() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.0, floor=1, window=10.0, clock=clock)
    assert budget.try_acquire(paced=True) is not None  # room: paid like any extra attempt
    assert budget.snapshot().paced == 0
    assert budget.try_acquire() is None  # the bound holds for every other extra attempt
    past = budget.try_acquire(paced=True)
    assert past is not None
    snap = budget.snapshot()
    assert (snap.paced, snap.spent, snap.refused, snap.window_extras, snap.level) == (1, 2, 1, 2, 0.0)
    clock.advance(10.0)  # charged to the window like the others: it ages out with them
    assert budget.level == 1.0


def test_refund_returns_capacity_and_is_idempotent() -> None:
    budget = RetryBudget(ratio=0.0, floor=1, clock=FakeClock())
    ticket = budget.try_acquire()
    assert ticket is not None and not ticket.refunded
    assert budget.try_acquire() is None
    ticket.refund()
    assert ticket.refunded
    assert (budget.spent, budget.level) == (0, 1.0)
    ticket.refund()  # idempotent: no double credit
    assert (budget.spent, budget.level) == (0, 1.0)
    again = budget.try_acquire()
    assert again is not None
    assert budget.try_acquire() is None
    assert (budget.spent, budget.refused) == (1, 2)


def test_refund_after_ticket_aged_out() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.0, floor=2, window=1.0, clock=clock)
    ticket = budget.try_acquire()
    assert ticket is not None
    clock.advance(5.0)
    assert budget.level == 2.0
    ticket.refund()
    assert (budget.spent, budget.level) == (0, 2.0)  # never exceeds ratio x requests + floor


def test_refund_in_older_bucket() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.0, floor=2, window=10.0, clock=clock)
    first = budget.try_acquire()
    clock.advance(3.0)
    second = budget.try_acquire()
    assert first is not None and second is not None
    assert budget.try_acquire() is None
    first.refund()
    assert budget.level == 1.0
    assert budget.try_acquire() is not None


def test_snapshot() -> None:
    budget = RetryBudget(ratio=0.5, floor=1, window=10.0, clock=FakeClock())
    budget.record_request()
    budget.record_request()
    assert budget.try_acquire() is not None
    snap = budget.snapshot()
    assert snap == BudgetSnapshot(
        level=1.0, spent=1, refused=0, requests=2, window_requests=2, window_extras=1, pending=1
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.level = 5.0  # type: ignore[misc]
    assert not hasattr(snap, "__dict__")


def test_a_clock_going_backwards_moves_the_window_back_with_it() -> None:
    clock = FakeClock(100.0)
    budget = RetryBudget(ratio=0.0, floor=1, window=1.0, clock=clock)
    assert budget.try_acquire() is not None
    clock.now = 50.0  # the extra taken at 100.0 is now taken at 50.0
    budget.record_request()
    assert budget.try_acquire() is None
    clock.now = 50.5  # still inside (49.5, 50.5]
    assert budget.try_acquire() is None
    clock.now = 51.0
    assert budget.try_acquire() is not None


def test_budgets_are_independent() -> None:
    a = RetryBudget(ratio=0.0, floor=1, clock=FakeClock())
    b = RetryBudget(ratio=0.0, floor=1, clock=FakeClock())
    assert a.try_acquire() is not None
    assert b.try_acquire() is not None
    assert a.try_acquire() is None


def test_defaults_and_real_clock() -> None:
    budget = RetryBudget()
    assert (budget.ratio, budget.floor, budget.window) == (0.1, 4, 10.0)
    assert budget.level == 4.0
    assert "RetryBudget(ratio=0.1" in repr(budget)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ratio": -0.1}, "ratio must be a number in \\[0, 10\\], got -0.1"),
        ({"ratio": 10.5}, "ratio must be a number in \\[0, 10\\]"),
        ({"ratio": math.nan}, "ratio"),
        ({"ratio": math.inf}, "ratio"),
        ({"ratio": "0.1"}, "ratio"),
        ({"ratio": True}, "ratio"),
        ({"floor": -1}, "floor must be an int >= 0, got -1"),
        ({"floor": 1.5}, "floor must be an int >= 0, got 1.5"),
        ({"floor": True}, "floor"),
        ({"floor": 10**400}, "floor"),
        ({"window": 0}, "window must be a finite number of seconds > 0, got 0"),
        ({"window": -1.0}, "window"),
        ({"window": math.nan}, "window"),
        ({"window": math.inf}, "window"),
        ({"window": 10**400}, "window"),
        ({"window": "10"}, "window"),
        ({"ratio": 10**400}, "ratio"),
    ],
)
def test_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryBudget(**kwargs)  # type: ignore[arg-type]


def test_boundary_values_accepted() -> None:
    RetryBudget(ratio=0, floor=0, window=1e-6)
    RetryBudget(ratio=10, floor=1000, window=3600)


def test_a_clock_that_went_back_moves_the_window_back_with_it() -> None:
    # A test's frozen clock let go: the budget's window must not stand still until the clock is back (1e9 s).
    clock = FakeClock(1e9)
    budget = RetryBudget(ratio=0.0, floor=2, window=10.0, clock=clock)
    assert budget.try_acquire() is not None and budget.try_acquire() is not None
    assert budget.try_acquire() is None  # spent
    clock.now -= 1e9
    assert budget.try_acquire() is None  # what the window held still counts...
    clock.advance(10.0 + 10.0 / BUCKETS_PER_WINDOW)
    assert budget.try_acquire() is not None  # ...and leaves it as time goes on
