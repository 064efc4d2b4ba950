"""TierBulkhead: slots, the waiting line, refusals."""

from __future__ import annotations

import anyio

from llmguard_client import Bulkhead
from llmguard_client._layers.bulkhead import TierBulkhead


async def test_a_burst_that_finds_free_slots_is_not_counted_as_waiting() -> None:
    # Calls arriving in the same instant used to count as "waiting" while taking a free slot,
    # so the third of three simultaneous calls was refused although only 2 were in flight
    # and the line (1) was empty. Found by benchmarks/soak.py (50 workers starting at once).
    bulkhead = TierBulkhead(Bulkhead(max_in_flight=2, max_waiting=1))
    admitted: list[bool] = []

    async def call() -> None:
        admitted.append(await bulkhead.acquire())

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        assert admitted == [True, True]
        assert (bulkhead.in_flight, bulkhead.waiting, bulkhead.rejected) == (2, 1, 0)
        bulkhead.release()
    assert admitted == [True, True, True]
    assert (bulkhead.in_flight, bulkhead.waiting) == (2, 0)


async def test_a_full_bulkhead_with_a_full_line_refuses_at_once() -> None:
    bulkhead = TierBulkhead(Bulkhead(max_in_flight=1, max_waiting=1))
    assert await bulkhead.acquire()
    async with anyio.create_task_group() as tg:
        tg.start_soon(bulkhead.acquire)  # waits in line
        await anyio.wait_all_tasks_blocked()
        assert not await bulkhead.acquire()
        assert (bulkhead.in_flight, bulkhead.waiting, bulkhead.rejected) == (1, 1, 1)
        bulkhead.release()
    assert (bulkhead.in_flight, bulkhead.waiting) == (1, 0)
