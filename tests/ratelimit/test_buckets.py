"""LocalBucket and RateLimit: exact refill in virtual time, waits and refusals, corrections, bad input."""

from __future__ import annotations

import anyio
import pytest

from llmguard_client import Guard, GuardConfigError, RateLimit, Replica
from llmguard_client._ratelimit.buckets import Grant, LocalBucket, _Scope
from tests.virtual import BACKENDS, run_virtual


@BACKENDS
def test_the_local_bucket_refills_exactly_in_virtual_time(backend: str) -> None:
    async def main() -> None:
        # 2 requests and 10 tokens of capacity; 2 requests and 10 tokens more per second.
        bucket = LocalBucket(RateLimit(requests_per_minute=120, tokens_per_minute=600, burst=1.0), anyio.current_time)
        assert bucket.take(4, max_wait=0.0) == Grant(wait=0.0)
        assert bucket.take(4, max_wait=0.0) == Grant(wait=0.0)
        # No request left: (1 - 0) / 2 per s = 0.5 s; tokens: (4 - 2) / 10 = 0.2 s. The longer one counts.
        assert bucket.take(4, max_wait=0.0).retry_after == pytest.approx(0.5, abs=1e-9)
        assert bucket.levels() == pytest.approx((0.0, 2.0), abs=1e-9)  # a refusal charges nothing
        await anyio.sleep(0.25)
        assert bucket.levels() == pytest.approx((0.5, 4.5), abs=1e-9)
        # Admitted with a wait: reserved now (the level goes negative), sent when the refill has covered it.
        grant = bucket.take(4, max_wait=0.3)
        assert grant.admitted and grant.wait == pytest.approx(0.25, abs=1e-9)
        assert bucket.levels() == pytest.approx((-0.5, 0.5), abs=1e-9)
        # The next caller queues behind the reservation.
        assert bucket.take(1, max_wait=0.0).retry_after == pytest.approx(0.75, abs=1e-9)
        await anyio.sleep(60.0)
        assert bucket.levels() == pytest.approx((2.0, 10.0), abs=1e-9)  # full, never above capacity

    run_virtual(main, backend)


def test_a_charge_larger_than_the_capacity_fits_once_the_bucket_is_full() -> None:
    clock = [0.0]
    bucket = LocalBucket(RateLimit(tokens_per_minute=600, burst=1.0), lambda: clock[0])  # 10 tokens at most
    assert bucket.take(50, max_wait=0.0).admitted
    assert bucket.levels()[1] == -40.0
    assert bucket.take(50, max_wait=0.0).retry_after == pytest.approx(5.0)  # (10 - -40) / 10


@pytest.mark.parametrize("order", ["in-order", "replies-swapped-in-pairs"])
def test_the_share_is_learnt_from_the_fleets_counts_whatever_order_the_replies_come_in(order: str) -> None:
    """Three processes admitting in turn: this one's attempts are every third the fleet admits. Concurrent
    callers' replies may come back swapped; the share is still a third (a swap used to be taken for a restarted
    store, the window cleared each time, and the process kept the whole limit when the store then failed)."""
    clock = [0.0]
    scope = _Scope(LocalBucket(RateLimit(requests_per_minute=60, burst=30.0), lambda: clock[0]), "k")  # 30 full
    counts = [3.0 * n for n in range(1, 17)]
    if order != "in-order":
        counts = [c for pair in zip(counts[1::2], counts[::2], strict=True) for c in pair]
    for count in counts:
        scope.admitted(count)
    clock[0] = 60.0  # refilled: the bucket holds what its share allows
    assert scope.local.levels()[0] == pytest.approx(10.0)  # a third of the capacity: the share, 15 / 45


def test_a_store_counting_from_zero_again_starts_the_share_afresh() -> None:
    scope = _Scope(LocalBucket(RateLimit(requests_per_minute=60, burst=30.0), lambda: 0.0), "k")
    for count in range(100, 116):  # alone: the whole limit
        scope.admitted(float(count))
    for count in range(1, 8):  # a restarted store: 7 samples, fewer than the share needs
        scope.admitted(float(2 * count))
    assert list(scope.admissions) == [2.0 * n for n in range(1, 8)]


def test_corrections_and_the_providers_room_adjust_the_levels() -> None:
    clock = [0.0]
    bucket = LocalBucket(RateLimit(requests_per_minute=60, tokens_per_minute=600, burst=1.0), lambda: clock[0])
    bucket.take(8, max_wait=0.0)
    bucket.adjust(0.0, 5.0)  # used 5 fewer than charged
    assert bucket.levels() == (0.0, 7.0)
    bucket.adjust(0.0, 100.0)
    assert bucket.levels() == (0.0, 10.0)  # never above capacity
    bucket.cap(None, 3)
    assert bucket.levels() == (0.0, 3.0)
    bucket.cap(None, 9)  # the provider's room only ever lowers the bucket
    assert bucket.levels() == (0.0, 3.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs requests_per_minute or tokens_per_minute"),
        ({"requests_per_minute": 0}, "requests_per_minute must be a positive finite number"),
        ({"tokens_per_minute": float("inf")}, "tokens_per_minute must be a positive finite number"),
        ({"tokens_per_minute": True}, "tokens_per_minute must be a positive finite number"),
        ({"requests_per_minute": 10, "burst": 0}, "burst must be a positive finite number"),
    ],
)
def test_a_bad_rate_limit_names_the_field(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(GuardConfigError, match=message):
        RateLimit(**kwargs)


def test_a_guard_or_replica_rate_limit_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(GuardConfigError, match="rate_limit must be a RateLimit"):
        Guard(["http://a"], rate_limit=100, instrumentation=None)  # type: ignore[arg-type]
    with pytest.raises(GuardConfigError, match=r"Replica\.rate_limit must be a RateLimit"):
        Replica("http://a", rate_limit={"rpm": 1})  # type: ignore[arg-type]


def test_a_clock_that_went_back_refills_from_its_new_reading() -> None:
    clock = [1e9]
    bucket = LocalBucket(RateLimit(requests_per_minute=60, burst=1.0), lambda: clock[0])  # 1 request at most
    assert bucket.take(0, 0).wait == 0.0
    clock[0] -= 1e9  # a test's frozen clock let go
    assert bucket.levels()[0] == pytest.approx(0.0)
    clock[0] += 1.0
    assert bucket.levels()[0] == pytest.approx(1.0)  # refilled after a second, not after 1e9
