"""One replica's gate in virtual time: the wait it predicts, and a waiting call refused as soon as its slot can
no longer come in time."""

from __future__ import annotations

import anyio
import pytest

from llmguard_client import Admission
from llmguard_client._admission.controller import LimitController
from llmguard_client._admission.queue import MARGIN, ReplicaGate, Slot, Waiter
from llmguard_client._admission.signal import LoadSignal
from tests.virtual import BACKENDS, now, run_virtual


def gate(limit: int) -> ReplicaGate:
    return ReplicaGate(LimitController(Admission(initial_limit=limit)), LoadSignal(), 64, now)


async def free_at_rate(g: ReplicaGate, slots: list[Slot], every: float) -> None:
    """Give back ``slots`` one every ``every`` seconds (a replica completing at 1/every per s)."""
    for slot in slots:
        await anyio.sleep(every)
        slot.release()


def line_up(g: ReplicaGate, deadline: float, until: float, weight: float = 1.0) -> Waiter | None:
    """A call put in line (None: the line is full)."""
    waiter = Waiter(deadline, until, weight)
    return waiter if g.join(waiter) else None


def taken(g: ReplicaGate, n: int) -> list[Slot]:
    slots = [g.try_take() for _ in range(n)]
    assert all(s is not None for s in slots)
    return [s for s in slots if s is not None]


@BACKENDS
def test_after_a_cut_the_wait_counts_the_slots_in_flight_over_the_limit(backend: str) -> None:
    async def main() -> None:
        g = gate(4)
        slots = taken(g, 4)
        await free_at_rate(g, slots[:2], 0.1)  # 2 freed in 0.1 s each: 10 slots/s
        slots[2:] += taken(g, 2)
        g.controller.limit = 2.0  # cut to 2 with 4 in flight: 2 must free up before anyone in line is served
        assert g.frees_needed(0) == 3
        assert g.wait_for(0) == pytest.approx(MARGIN * 3 / g.rate())
        assert g.frees_needed(1) == 4

    run_virtual(main, backend)


@BACKENDS
def test_a_waiting_call_whose_slot_can_no_longer_come_in_time_is_refused_when_the_line_is_judged(backend: str) -> None:
    async def main() -> None:
        g = gate(2)
        slots = taken(g, 2)
        await free_at_rate(g, slots, 0.1)  # a rate of about 10 slots/s
        slots = taken(g, 2)
        start = now()
        early = line_up(g, deadline=start + 1.0, until=start + 0.5)  # first in line: 1 free away
        late = line_up(g, deadline=start + 2.0, until=start + 0.5 / g.rate())  # less than one free away
        assert early is not None and late is not None
        slots[0].release()  # a slot freed: the first waiter gets it, the second (next in line) is judged again
        assert early.slot is not None
        assert late.event.is_set() and late.slot is None and late.gone
        assert g.waiting == 0 and now() == start  # refused at once, not when its time is up
        early.slot.release()
        slots[1].release()

    run_virtual(main, backend)


@BACKENDS
def test_a_waiting_call_that_still_fits_keeps_its_place(backend: str) -> None:
    async def main() -> None:
        g = gate(2)
        slots = taken(g, 2)
        await free_at_rate(g, slots, 0.1)
        slots = taken(g, 2)
        start = now()
        first: Waiter | None = line_up(g, deadline=start + 1.0, until=start + 0.5)
        second = line_up(g, deadline=start + 2.0, until=start + 0.5)
        assert first is not None and second is not None
        slots[0].release()
        assert first.slot is not None
        assert not second.event.is_set() and g.waiting == 1
        slots[1].release()  # the next slot goes to it
        assert second.slot is not None and g.waiting == 0
        first.slot.release()
        second.slot.release()
        assert g.in_flight == 0

    run_virtual(main, backend)


@BACKENDS
def test_a_replica_holds_more_small_calls_than_large_ones(backend: str) -> None:
    async def main() -> None:
        g = gate(4)
        small = [g.try_take(0.5) for _ in range(8)]
        assert all(s is not None for s in small) and g.try_take(0.5) is None
        assert g.in_flight == 8 and g.load == pytest.approx(4.0)
        for slot in small:
            assert slot is not None
            slot.release()
        assert g.in_flight == 0 and g.load == 0.0
        large = [g.try_take(2.0), g.try_take(2.0)]
        assert all(s is not None for s in large) and g.try_take(0.5) is None
        for slot in large:
            assert slot is not None
            slot.release()
        huge = g.try_take(10.0)  # larger than the limit: a replica with nothing in flight takes it
        assert huge is not None and g.try_take(0.1) is None
        huge.release()
        assert g.in_flight == 0 and g.load == 0.0

    run_virtual(main, backend)


@BACKENDS
def test_a_large_call_in_line_does_not_hold_up_a_smaller_one_behind_it(backend: str) -> None:
    async def main() -> None:
        g = gate(2)
        slots = taken(g, 2)
        await free_at_rate(g, slots[:1], 0.1)
        slots = [*slots[1:], *taken(g, 1)]
        start = now()
        large = line_up(g, deadline=start + 0.5, until=start + 0.4, weight=2.0)  # earlier deadline: first in line
        small = line_up(g, deadline=start + 0.9, until=start + 0.8, weight=0.5)
        assert large is not None and small is not None
        slots[0].release()  # room for 1: the small call gets it, the large one keeps its place
        assert small.slot is not None and large.slot is None and not large.gone
        slots[1].release()
        small.slot.release()  # the replica is empty: the large call gets it
        assert large.slot is not None and g.waiting == 0
        large.slot.release()
        assert g.in_flight == 0 and g.load == 0.0

    run_virtual(main, backend)


def test_the_line_holds_max_waiting_calls_of_every_tier() -> None:
    """A batch call (a far deadline) counts toward ``max_waiting`` as an interactive one does: an unbounded line of a
    batch job held the limit's growth at the job's load, and the interactive calls queued behind it in the engine."""
    g = ReplicaGate(LimitController(Admission(initial_limit=1)), LoadSignal(), 2, now)
    taken(g, 1)
    batch = [line_up(g, deadline=30.0, until=12.0) for _ in range(2)]
    assert all(w is not None for w in batch)
    assert line_up(g, deadline=30.0, until=12.0) is None  # a third batch call: the line is full
    assert line_up(g, deadline=1.0, until=0.08) is None  # and so for an interactive call, ahead of them or not


def test_a_clock_that_went_back_moves_the_freed_slots_back_with_it() -> None:
    clock = [1e9]
    g = ReplicaGate(LimitController(Admission(initial_limit=8)), LoadSignal(), 64, lambda: clock[0])
    slots = [g._take(1.0) for _ in range(6)]
    for slot in slots[:3]:
        slot.release()
        clock[0] += 1.0
    clock[0] -= 1e9  # a test's frozen clock let go
    for slot in slots[3:]:
        slot.release()
        clock[0] += 1.0
    assert g.rate() == pytest.approx(1.0, rel=0.3)  # still about one a second, not nothing for 1e9 s
