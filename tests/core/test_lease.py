"""One lease per call: whatever a call acquired is released once, on every path (virtual time, both backends)."""

from __future__ import annotations

import asyncio
import functools
import gc
from typing import Any

import anyio
import httpx
import pytest

from llmguard_client import (
    BudgetPolicy,
    Bulkhead,
    Guard,
    GuardClosed,
    HedgePolicy,
    PhaseRecord,
    RetryPolicy,
    Tier,
)
from llmguard_client._core.lease import CallLease, LeaseRegistry, close_quietly
from tests.virtual import BACKENDS, FakeReplica, Plan, now, run_virtual, virtual_guard

CHAT = "/v1/chat/completions"
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
A, B = "http://a.test", "http://b.test"


def make(plans: dict[str, list[Plan]], records: list[PhaseRecord], **kwargs: Any) -> tuple[Guard, dict[str, Any]]:
    fakes = {url: FakeReplica(url[7], p) for url, p in plans.items()}
    kwargs.setdefault("tiers", {"i": Tier(ttft=10.0, total=30.0, stall=5.0)})
    kwargs.setdefault("hedge", HedgePolicy(delay=1.0))
    return virtual_guard(fakes, records, **kwargs), fakes


def assert_released(guard: Guard, fakes: dict[str, FakeReplica]) -> None:
    snap = guard.snapshot()
    assert snap.idle, snap
    assert all(f.open_streams == 0 for f in fakes.values()), {u: f.open_streams for u, f in fakes.items()}


async def read_a_stream(client: httpx.AsyncClient, errors: list[BaseException]) -> None:
    """One streamed call read to its end; the `GuardClosed` that ends it, if one does, kept in ``errors``."""
    try:
        async with client.stream("POST", A + CHAT, json=BODY) as response:
            await response.aread()
    except GuardClosed as exc:
        errors.append(exc)


PHASES = {
    # phase: (plans, guard options, seconds after which the caller cancels)
    "waiting_for_a_bulkhead_slot": ({A: [Plan(first_token_after=50)]}, {"bulkheads": {"i": Bulkhead(1, 5)}}, 0.5),
    "before_headers": ({A: [Plan(headers_after=50)], B: [Plan(headers_after=50)]}, {}, 0.5),
    "between_headers_and_first_token": ({A: [Plan(first_token_after=50)], B: [Plan(first_token_after=50)]}, {}, 0.5),
    "while_hedged": ({A: [Plan(first_token_after=50)], B: [Plan(first_token_after=50)]}, {}, 2.0),
    "in_retry_backoff": (
        {A: [Plan(status=500)], B: [Plan(status=500)]},
        {"retry": RetryPolicy(backoff_initial=5.0, backoff_max=5.0, max_attempts=5), "hedge": None},
        0.5,
    ),
}


@pytest.mark.parametrize("phase", sorted(PHASES))
@BACKENDS
def test_caller_cancel_releases_everything(phase: str, backend: str) -> None:
    plans, options, cancel_after = PHASES[phase]
    records: list[PhaseRecord] = []
    guard, fakes = make(plans, records, budget=BudgetPolicy(floor=5), **options)

    async def main() -> None:
        async with guard, guard.http_client() as client:
            async with anyio.create_task_group() as tg:
                if phase == "waiting_for_a_bulkhead_slot":  # a first call takes the only slot
                    tg.start_soon(functools.partial(client.post, A + CHAT, json=BODY))
                    await anyio.sleep(0.1)
                with anyio.move_on_after(cancel_after):
                    await client.post(A + CHAT, json=BODY)
                tg.cancel_scope.cancel()
            assert_released(guard, fakes)
            budget = guard.snapshot().budget
            assert budget is not None and budget.pending == 0

    run_virtual(main, backend)
    assert records and all(r.status == "cancelled" for r in records)


@BACKENDS
def test_caller_cancel_mid_stream_then_close_releases_everything(backend: str) -> None:
    records: list[PhaseRecord] = []
    guard, fakes = make({A: [Plan(tokens=50, gap=0.5)]}, records)

    async def main() -> None:
        async with guard, guard.http_client() as client:
            async with client.stream("POST", A + CHAT, json=BODY) as response:
                with anyio.move_on_after(2.0):
                    async for _ in response.aiter_raw():
                        pass
                assert guard.snapshot().calls_in_flight == 1  # still open until the caller closes it
            assert_released(guard, fakes)

    run_virtual(main, backend)
    assert records[0].status == "cancelled" and records[0].cause == "cancelled_by_caller"


@BACKENDS
def test_an_unclosed_stream_is_released_when_garbage_collected(backend: str) -> None:
    records: list[PhaseRecord] = []
    guard, fakes = make({A: [Plan(tokens=50, gap=0.5)]}, records)

    async def main() -> None:
        async with guard, guard.http_client() as client:
            response = await client.send(client.build_request("POST", A + CHAT, json=BODY), stream=True)
            assert guard.snapshot().calls_in_flight == 1
            del response
            gc.collect()
            await anyio.sleep(0.01)  # the connection is closed by a system task on the loop
            assert_released(guard, fakes)

    run_virtual(main, backend)
    assert records[0].status == "abandoned" and records[0].cause == "garbage_collected"


@BACKENDS
def test_aclose_aborts_calls_waiting_and_streaming(backend: str) -> None:
    records: list[PhaseRecord] = []
    guard, fakes = make({A: [Plan(first_token_after=50)], B: [Plan(tokens=100, gap=0.5)]}, records, hedge=None)
    errors: list[BaseException] = []

    async def main() -> None:
        client = guard.http_client()
        call = functools.partial(read_a_stream, client, errors)

        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(call)
            await anyio.sleep(2.0)
            assert guard.snapshot().calls_in_flight == 10
            closed_at = now()
            await guard.aclose()
            assert now() == closed_at  # no waiting without a grace period
        assert_released(guard, fakes)
        with pytest.raises(GuardClosed):
            await client.post(A + CHAT, json=BODY)
        await client.aclose()

    run_virtual(main, backend)
    assert len(errors) == 10
    assert {r.cause for r in records} == {"guard_closed"}
    assert sum(f.requests for f in fakes.values()) == 10  # nothing was sent after the close


@BACKENDS
def test_aclose_with_grace_lets_calls_finish(backend: str) -> None:
    records: list[PhaseRecord] = []
    guard, fakes = make({A: [Plan(tokens=4, gap=0.5)]}, records, hedge=None)

    async def main() -> None:
        async with guard.http_client() as client, anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(client.post, A + CHAT, json=BODY))
            await anyio.sleep(0.1)
            await guard.aclose(grace=10.0)
        assert_released(guard, fakes)

    run_virtual(main, backend)
    assert records[0].status == "ok"


@pytest.mark.parametrize(
    ("bound", "backend"), [("asyncio.wait_for", "asyncio"), ("move_on_after", "asyncio"), ("move_on_after", "trio")]
)
def test_a_close_cancelled_during_its_grace_still_closes_everything(bound: str, backend: str) -> None:
    """A bound on the close (``asyncio.wait_for``'s ``Task.cancel()``, which an anyio shield does not stop on
    asyncio, or a cancel scope) ends the grace there: the calls in flight are aborted and the pools closed, then
    the cancellation is raised (before: asyncio's stopped the close half-way, the stream read on to its end; a
    cancel scope was ignored until the grace ended)."""
    records: list[PhaseRecord] = []
    guard, fakes = make({A: [Plan(tokens=100, gap=0.5)]}, records, hedge=None)
    errors: list[BaseException] = []

    async def main() -> None:
        client = guard.http_client()
        call = functools.partial(read_a_stream, client, errors)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await anyio.sleep(1.0)
            closing_at = now()
            if bound == "asyncio.wait_for":
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(guard.aclose(grace=30.0), 2.0)
            else:
                with anyio.move_on_after(2.0):
                    await guard.aclose(grace=30.0)
            assert now() == closing_at + 2.0  # aborted when the bound ended, not after the grace
            assert_released(guard, fakes)
        await client.aclose()

    run_virtual(main, backend)
    assert len(errors) == 1 and [r.cause for r in records] == ["guard_closed"]


def test_aclose_rejects_a_bad_grace() -> None:
    guard = Guard(["http://a.test"], instrumentation=None)
    with pytest.raises(ValueError, match="grace must be a finite number of seconds >= 0"):
        anyio.run(guard.aclose, -1.0)


def test_a_hold_is_released_exactly_once() -> None:
    released: list[str] = []

    async def main() -> None:
        registry = LeaseRegistry()
        lease = CallLease(registry)
        first = lease.hold(lambda: released.append("slot"))
        lease.hold(lambda: released.append("ticket")).discharge()
        first.release()
        first.release()
        lease.hold(lambda: released.append("in_flight"))
        await lease.aclose("ok", None)
        await lease.aclose("error", "again")  # idempotent
        lease.hold(lambda: released.append("late"))  # acquired after the end: given straight back
        assert not registry.live

    anyio.run(main)
    assert released == ["slot", "in_flight", "late"]


def test_response_closed_by_the_lease_even_if_the_attempt_never_returned() -> None:
    closed: list[bool] = []

    class Stream(httpx.AsyncByteStream):
        async def __aiter__(self):  # type: ignore[override]
            yield b""

        async def aclose(self) -> None:
            closed.append(True)

    async def main() -> None:
        lease = CallLease(LeaseRegistry())
        lease.own(httpx.Response(200, stream=Stream()))
        lease.abort()
        await lease.aclose("error", "guard_closed")

    anyio.run(main)
    assert closed == [True]


def test_a_response_owned_after_the_end_is_refused_and_closed_with_its_body() -> None:
    """An answer that arrives after ``Guard.aclose()`` closed the call: `own` raises `GuardClosed` (the
    attempt fails, never wins), and the attempt's `close_response` closes it and its body iterator."""
    body = _Body()

    async def main() -> None:
        lease = CallLease(LeaseRegistry())
        lease.abort()
        await lease.aclose("error", "guard_closed")
        response = httpx.Response(200, stream=body)
        reading = body.__aiter__()
        await reading.__anext__()
        with pytest.raises(GuardClosed, match="before this answer arrived"):
            lease.own(response, reading)
        await lease.close_response(response)
        assert response.is_closed

    anyio.run(main)
    assert body.closed


@BACKENDS
def test_a_second_close_waits_until_the_first_has_closed_everything(backend: str) -> None:
    events: list[str] = []

    class SlowStream(httpx.AsyncByteStream):
        async def __aiter__(self):  # type: ignore[override]
            yield b""

        async def aclose(self) -> None:
            await anyio.sleep(1.0)
            events.append("response closed")

    async def main() -> None:
        lease = CallLease(LeaseRegistry(), finish=lambda status, cause: events.append(f"finished {status}"))
        lease.own(httpx.Response(200, stream=SlowStream()))

        async def close(name: str, status: Any) -> None:
            await lease.aclose(status, None)
            events.append(f"{name} returned")

        async with anyio.create_task_group() as tg:
            tg.start_soon(close, "first", "ok")
            await anyio.sleep(0.1)
            tg.start_soon(close, "second", "error")

    run_virtual(main, backend)
    assert events == ["response closed", "finished ok", "first returned", "second returned"]


@BACKENDS
def test_a_finish_that_raises_reaches_the_first_closer_and_never_leaves_the_second_waiting(backend: str) -> None:
    """The call's last act raised (a bug in what it reports to): the first closer gets the error, every hold is
    still released, and a second closer waiting for the first returns instead of waiting forever (shielded)."""
    released: list[str] = []

    class SlowStream(httpx.AsyncByteStream):
        async def __aiter__(self):  # type: ignore[override]
            yield b""

        async def aclose(self) -> None:
            await anyio.sleep(1.0)

    def finish(status: Any, cause: Any) -> None:
        raise RuntimeError("the record's reporter is broken")

    async def main() -> None:
        lease = CallLease(LeaseRegistry(), finish=finish)
        lease.hold(lambda: released.append("hold"))
        lease.own(httpx.Response(200, stream=SlowStream()))
        outcomes: list[str] = []

        async def close(name: str) -> None:
            try:
                await lease.aclose("ok", None)
                outcomes.append(f"{name} returned")
            except RuntimeError:
                outcomes.append(f"{name} raised")

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(close, "first")
                await anyio.sleep(0.1)
                tg.start_soon(close, "second")
        assert sorted(outcomes) == ["first raised", "second returned"]

    run_virtual(main, backend)
    assert released == ["hold"]


class _Body(httpx.AsyncByteStream):
    def __init__(self) -> None:
        self.closed = False
        self.read_to_end = False

    async def __aiter__(self) -> Any:
        try:
            yield b"a"
            yield b"b"
            self.read_to_end = True
        finally:
            self.closed = True  # the generator was finished or closed

    async def aclose(self) -> None:
        self.closed = True


@pytest.mark.parametrize("read_to_end", [True, False], ids=["finished", "half-read"])
async def test_close_quietly_closes_the_response_and_a_half_read_body_iterator(read_to_end: bool) -> None:
    body = _Body()
    response = httpx.Response(200, stream=body)
    reading = aiter(body)
    assert await anext(reading) == b"a"
    if read_to_end:
        assert await anext(reading) == b"b"
        with pytest.raises(StopAsyncIteration):
            await anext(reading)
    await close_quietly(response, reading)
    assert response.is_closed and body.closed
    assert body.read_to_end is read_to_end
    assert reading.ag_frame is None  # type: ignore[attr-defined]  # the generator is finished either way


class _Replica:
    """What the lease counts of a replica: its attempts in flight."""

    def __init__(self) -> None:
        self.in_flight = 0

    def leave(self) -> None:
        self.in_flight -= 1


def test_in_flight_counts_are_acquired_and_released_through_the_lease_once() -> None:
    async def main() -> None:
        replica = _Replica()
        lease = CallLease(LeaseRegistry())
        lost, kept = lease.occupy(replica), lease.occupy(replica)
        assert replica.in_flight == 2
        await lease.end_attempt(lost)  # a failed or lost attempt, before the call ends
        await lease.end_attempt(lost)  # idempotent
        assert replica.in_flight == 1 and lost.released and not kept.released
        await lease.aclose("ok", None)  # the winner's count: at the end of the call
        assert replica.in_flight == 0 and kept.released
        late = lease.occupy(replica)  # an attempt that starts after the end gets nothing held
        assert replica.in_flight == 0 and late.released

    anyio.run(main)


def test_end_attempt_closes_the_response_then_releases_the_count() -> None:
    async def main() -> None:
        replica = _Replica()
        lease = CallLease(LeaseRegistry())
        hold = lease.occupy(replica)
        response = httpx.Response(200, stream=httpx.ByteStream(b"x"))
        lease.own(response)
        await lease.end_attempt(hold, response)
        assert response.is_closed and replica.in_flight == 0
        await lease.aclose("ok", None)
        assert replica.in_flight == 0

    anyio.run(main)
