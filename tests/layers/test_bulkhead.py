"""TierBulkhead: slots, the waiting line, refusals."""

from __future__ import annotations

import anyio
import httpx
import pytest

from llmguard_client import Bulkhead, BulkheadFull, PhaseRecord
from llmguard_client._layers.bulkhead import TierBulkhead
from tests.virtual import BACKENDS, FakeReplica, Plan, now, run_virtual, virtual_guard

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


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


@BACKENDS
def test_a_call_waits_for_a_bulkhead_slot_no_longer_than_its_clients_pool_timeout(backend: str) -> None:
    """In the default tier (no first-token deadline) a call in line for its tier's bulkhead waits no longer than its
    client's pool timeout, then is refused with `BulkheadFull` saying so (it waited for as long as the slot took)."""
    fakes = {"http://a.test": FakeReplica("a", [Plan(headers_after=30.0), Plan()])}
    records: list[PhaseRecord] = []

    async def main() -> None:
        bulkheads = {"default": Bulkhead(max_in_flight=1, max_waiting=1)}
        guard = virtual_guard(fakes, records, tiers=None, hedge=None, bulkheads=bulkheads, failure_mode="raise")
        async with guard, guard.http_client(timeout=httpx.Timeout(600.0, pool=2.0)) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: client.post("http://a.test/v1/chat/completions", json=BODY))
                await anyio.sleep(0.1)
                start = now()
                with pytest.raises(BulkheadFull) as refused:
                    await client.post("http://a.test/v1/chat/completions", json=BODY)
                assert now() - start == pytest.approx(2.0, abs=1e-6)
                tg.cancel_scope.cancel()
        assert "after the 2s of its pool timeout" in str(refused.value)

    run_virtual(main, backend)
