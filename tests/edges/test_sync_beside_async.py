"""Sync calls beside async code on one Guard (a web app's sync handlers in worker threads beside its async ones):
run on the caller's loop that owns the Guard; async code takes the Guard over from its idle home loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest

from llmguard_client import ContinuationPolicy, Guard, GuardClosed, PhaseRecord, Tier, WrongEventLoop
from llmguard_client._core import loop_owner
from llmguard_client._core.event_loops import running_loop, start_soon
from llmguard_client._core.loop_owner import LoopEnded
from llmguard_client.edges import _runner
from llmguard_client.edges._registry import runner_for
from llmguard_client.edges._runner import CallersLoop, wait_for
from tests.edges.conftest import BODY, client_sockets, eventually, pools, sync_threads
from tests.loopback import LoopbackServer, Script

if TYPE_CHECKING:
    from llmguard_client._core.loop_owner import Handed

openai = pytest.importorskip("openai")
MESSAGES: Any = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"


@pytest.fixture
def server(servers: list[LoopbackServer]) -> Iterator[LoopbackServer]:
    assert eventually(lambda: client_sockets(servers[:1]) == 0)  # nothing left by an earlier test
    yield servers[0]


def guard_over(server: LoopbackServer, records: list[PhaseRecord] | None = None) -> Guard:
    return Guard(
        [server.url],
        instrumentation=None,
        transport_factory=pools,
        on_record=None if records is None else records.append,
    )


def sync_sdk_call(guard: Guard, server: LoopbackServer) -> str:
    """One chat completion through the sync openai SDK (no retry of its own, so a failure is not hidden)."""
    client = openai.OpenAI(
        base_url=server.url + "/v1", api_key="k", max_retries=0, http_client=guard.sync_http_client()
    )
    return client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content or ""


def sync_stream(guard: Guard, server: LoopbackServer) -> str:
    client = openai.OpenAI(
        base_url=server.url + "/v1", api_key="k", max_retries=0, http_client=guard.sync_http_client()
    )
    events = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    return "".join(chunk.choices[0].delta.content or "" for chunk in events if chunk.choices)


async def async_sdk_call(guard: Guard, server: LoopbackServer) -> str:
    client = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="k", max_retries=0, http_client=guard.http_client()
    )
    return (await client.chat.completions.create(model="m", messages=MESSAGES)).choices[0].message.content or ""


async def test_sync_calls_from_worker_threads_run_on_the_async_loop_that_owns_the_guard(server: LoopbackServer) -> None:
    records: list[PhaseRecord] = []
    async with guard_over(server, records) as guard:
        assert await async_sdk_call(guard, server)
        served = await asyncio.gather(
            *(asyncio.to_thread(sync_sdk_call, guard, server) for _ in range(4)),
            asyncio.to_thread(sync_stream, guard, server),
        )
        assert all(served)  # before: each refused with a 400 naming another event loop
        assert sync_threads() == []  # no loop of the Guard's own: the calls ran on this one
    assert len(server.received) == 6
    assert [r.status for r in records] == ["ok"] * 6
    assert eventually(lambda: client_sockets([server]) == 0)


def test_sync_calls_from_worker_threads_run_on_the_trio_run_that_owns_the_guard(server: LoopbackServer) -> None:
    """As beside asyncio (before: ``RuntimeError: must be called from async context`` for the sync call, the
    home loop using the trio run's sockets, and again as the Guard closed)."""
    trio = pytest.importorskip("trio")
    records: list[PhaseRecord] = []

    async def app() -> list[str]:
        async with guard_over(server, records) as guard:
            served = [await async_sdk_call(guard, server)]
            async with trio.open_nursery() as nursery:
                for work in (sync_sdk_call, sync_sdk_call, sync_stream):

                    async def in_a_thread(work: Any = work) -> None:
                        served.append(await trio.to_thread.run_sync(work, guard, server))

                    nursery.start_soon(in_a_thread)
            assert sync_threads() == []  # no loop of the Guard's own: the calls ran on this run
            return served

    assert all(trio.run(app))
    assert [r.status for r in records] == ["ok"] * 4
    assert eventually(lambda: client_sockets([server]) == 0)


async def test_async_code_takes_the_guard_over_from_its_idle_home_loop(server: LoopbackServer) -> None:
    guard = guard_over(server)
    assert await asyncio.to_thread(sync_sdk_call, guard, server)  # the first call: on the Guard's own loop
    assert len(sync_threads()) == 1
    assert await async_sdk_call(guard, server)  # before: refused, the home loop still ran
    assert await asyncio.to_thread(sync_stream, guard, server)  # now on this loop
    await guard.aclose()
    assert sync_threads() == []
    assert len(server.received) == 3
    assert eventually(lambda: client_sockets([server]) == 0)  # the home loop's connection too


async def test_an_async_call_takes_the_guard_over_while_a_sync_stream_is_still_read_on_the_home_loop(
    server: LoopbackServer,
) -> None:
    """A sync call that has handed its stream over sends nothing more: the async call does not wait for its body
    (before: it waited for the stream to end, within its ttft, else was refused). The body is read to its end from
    the home loop's connection, which is closed after it."""
    server.script = Script(tokens=200)  # more chunks than the sync body reads ahead of its caller
    guard = guard_over(server)
    sync_client = guard.sync_http_client()
    request = sync_client.build_request("POST", server.url + CHAT, json={**BODY, "stream": True})
    opened = await asyncio.to_thread(sync_client.send, request, stream=True)  # the first call: on the home loop
    chunks = opened.iter_raw()
    first = await asyncio.to_thread(next, chunks)
    async with guard.http_client() as client:
        assert (await client.post(server.url + CHAT, json=BODY)).status_code == 200
        assert client_sockets([server]) == 2  # the home loop's, still read, and this loop's
        rest = b"".join(await asyncio.to_thread(list, chunks))
        assert (first + rest).count(b'"content":" t') == 200 and rest.endswith(b"data: [DONE]\n\n")
        await asyncio.to_thread(opened.close)
        assert await asyncio.to_thread(eventually, lambda: client_sockets([server]) == 1)  # the home's closed
        later = await asyncio.to_thread(sync_client.send, request, stream=True)  # now on this loop
        assert later.status_code == 200
        await asyncio.to_thread(later.close)
    await guard.aclose()
    assert len(server.received) == 3
    assert eventually(lambda: client_sockets([server]) == 0)


async def test_closing_the_guard_ends_a_sync_stream_still_read_on_the_home_loop(server: LoopbackServer) -> None:
    server.script = Script(tokens=200)
    guard = guard_over(server)
    sync_client = guard.sync_http_client()
    request = sync_client.build_request("POST", server.url + CHAT, json={**BODY, "stream": True})
    opened = await asyncio.to_thread(sync_client.send, request, stream=True)
    chunks = opened.iter_raw()
    await asyncio.to_thread(next, chunks)
    async with guard.http_client() as client:
        assert (await client.post(server.url + CHAT, json=BODY)).status_code == 200
    await guard.aclose()
    assert sync_threads() == []
    assert eventually(lambda: client_sockets([server]) == 0)  # the home loop's connection too
    with pytest.raises(httpx.HTTPError):
        await asyncio.to_thread(list, chunks)


async def test_a_sync_stream_read_on_after_the_handover_is_not_continued_from_that_thread(
    servers: list[LoopbackServer],
) -> None:
    """Its thread's loop no longer owns the replicas' pools: a break is not continued from there (it would send
    through the async loop's pools), and the record says why."""
    assert eventually(lambda: client_sockets(servers[:2]) == 0)
    for server in servers[:2]:
        server.script = Script(tokens=200, reset_after_tokens=100)  # past what the sync body reads ahead
    records: list[PhaseRecord] = []
    guard = Guard(
        [s.url for s in servers[:2]],
        instrumentation=None,
        transport_factory=pools,
        on_record=records.append,
        continuation=ContinuationPolicy(),
    )
    sync_client = guard.sync_http_client()
    request = sync_client.build_request("POST", servers[0].url + CHAT, json={**BODY, "stream": True})
    opened = await asyncio.to_thread(sync_client.send, request, stream=True)
    chunks = opened.iter_raw()
    await asyncio.to_thread(next, chunks)
    async with guard.http_client() as client:
        servers[0].script = servers[1].script = Script(tokens=3)
        assert (await client.post(servers[0].url + CHAT, json=BODY)).status_code == 200
        with pytest.raises(httpx.HTTPError):
            await asyncio.to_thread(list, chunks)
        await asyncio.to_thread(opened.close)
    await guard.aclose()
    streamed = next(r for r in records if r.stream)
    assert (streamed.status, streamed.not_continued, len(streamed.attempts)) == ("error", "guard_moved", 1)
    assert sum(len(s.received) for s in servers[:2]) == 2  # no continuation request was sent


async def test_a_handover_that_does_not_come_within_the_ttft_is_refused(server: LoopbackServer) -> None:
    """A sync call still waiting for its first token on the home loop may send attempts through the pools of the
    loop that owns the Guard: the async call waits for it within its ttft, then is refused, naming the fix."""
    server.script = Script(stall_before_first=1.5)
    tiers = {"t": Tier(ttft=3.0, total=10, stall=10), "short": Tier(ttft=0.3, total=10, stall=10)}
    guard = Guard([server.url], instrumentation=None, transport_factory=pools, tiers=tiers, default_tier="t")
    sync_client = guard.sync_http_client()
    request = sync_client.build_request("POST", server.url + CHAT, json={**BODY, "stream": True})
    waiting = asyncio.ensure_future(asyncio.to_thread(sync_client.send, request, stream=True))
    assert await asyncio.to_thread(eventually, lambda: len(server.received) == 1)
    async with guard.http_client() as client:
        with pytest.raises(WrongEventLoop, match="still waiting for their first token"):
            await client.post(server.url + CHAT, json=BODY, headers={"x-llmguard-tier": "short"})
    opened = await waiting
    await asyncio.to_thread(opened.close)
    await guard.aclose()
    assert len(server.received) == 1


async def test_under_steady_sync_traffic_async_code_still_takes_the_guard_over(server: LoopbackServer) -> None:
    """New sync calls wait while an async call waits to take the Guard over, so the home loop drains; they then
    run on the async loop."""
    server.script = Script(tokens=5, gap=0.02)
    guard = guard_over(server)
    stop = threading.Event()
    served: list[str] = []

    def steady() -> None:
        while not stop.is_set():
            served.append(sync_stream(guard, server))

    workers = [threading.Thread(target=steady) for _ in range(4)]
    for worker in workers:
        worker.start()
    try:
        assert await asyncio.to_thread(eventually, lambda: len(served) >= 8, 10)
        assert await async_sdk_call(guard, server)  # before: refused while any sync call ran (always, here)
        before = len(served)
        assert await asyncio.to_thread(eventually, lambda: len(served) >= before + 8, 10)
    finally:
        stop.set()
        for worker in workers:
            await asyncio.to_thread(worker.join, 10)
    assert all(served)
    await guard.aclose()
    assert sync_threads() == []


async def test_a_sync_call_on_the_owner_loops_own_thread_runs_on_the_guards_loop_when_nothing_is_in_flight(
    server: LoopbackServer,
) -> None:
    """A notebook: cells that await the async client and cells that call the sync one, on the kernel loop's thread,
    which a sync call blocks. With nothing in flight the Guard leaves that loop for its own, and comes back at
    the next awaited call (before: every sync call after the first awaited one was refused with a 400)."""
    records: list[PhaseRecord] = []
    async with guard_over(server, records) as guard:
        for cell in ("async", "sync", "async", "sync", "sync", "async"):
            answer = await async_sdk_call(guard, server) if cell == "async" else sync_sdk_call(guard, server)
            assert answer
            await asyncio.sleep(0.01)  # between cells the kernel loop runs: the old loop's pools are closed there
        assert eventually(lambda: client_sockets([server]) <= 1)  # the pool of the loop that calls now, at most
    assert [r.status for r in records] == ["ok"] * 6
    assert eventually(lambda: client_sockets([server]) == 0)
    assert sync_threads() == []


async def test_a_sync_call_on_the_owner_loops_own_thread_is_refused_while_a_call_is_in_flight_there(
    server: LoopbackServer,
) -> None:
    """It would wait for a loop it blocks: refused before anything is sent, naming the fix."""
    server.script = Script(tokens=50, gap=0.01)
    async with guard_over(server) as guard:
        client = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="k", max_retries=0, http_client=guard.http_client()
        )
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        with pytest.raises(openai.BadRequestError, match=r"asyncio\.to_thread") as refused:
            sync_sdk_call(guard, server)
        assert refused.value.response.headers["x-llmguard-cause"] == "wrong_event_loop"
        await stream.close()
    assert len(server.received) == 1


@pytest.mark.parametrize("runner", ["trio.run", "anyio.run"])
def test_a_sync_call_on_a_trio_runs_own_thread_runs_on_the_guards_loop_when_nothing_is_in_flight(
    server: LoopbackServer, runner: str
) -> None:
    """Under ``anyio.run(backend="trio")`` too, whose context names trio as the async library: the call's task on
    the Guard's own asyncio loop must not take that for its own."""
    trio = pytest.importorskip("trio")

    async def cells() -> list[str]:
        async with guard_over(server) as guard:
            answers = [await async_sdk_call(guard, server), sync_sdk_call(guard, server)]
            await trio.sleep(0.01)
            answers.append(await async_sdk_call(guard, server))
            return answers

    answers = trio.run(cells) if runner == "trio.run" else anyio.run(cells, backend="trio")
    assert all(answers)
    assert eventually(lambda: client_sockets([server]) == 0)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_worker_threads_sync_calls_handed_to_the_loop_as_its_own_thread_makes_one_are_all_served(
    server: LoopbackServer, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker threads' sync calls were handed to the owner loop, as its guests, while that loop's own thread made
    a sync call, which took the Guard to its own loop (nothing was in flight yet). Once the loop ran again each
    guest was refused there unsent, and its worker was never told: it waited for ever. Each is now sent again
    where the Guard runs, once."""
    handed = threading.Semaphore(0)
    hand = CallersLoop.start

    def start(self: CallersLoop, func: Callable[[], Any], call: Handed | None = None) -> Future[Any]:
        future = hand(self, func, call)
        handed.release()  # the worker's call waits for the loop to run it
        return future

    monkeypatch.setattr(CallersLoop, "start", start)
    records: list[PhaseRecord] = []
    outcome: list[str | BaseException] = []

    def worker(guard: Guard) -> None:
        try:
            outcome.append(sync_sdk_call(guard, server))
        except BaseException as exc:
            outcome.append(exc)

    def join(workers: list[threading.Thread]) -> None:
        deadline = time.monotonic() + 10
        for thread in workers:
            thread.join(max(0.0, deadline - time.monotonic()))

    async def app(to_thread: Callable[..., Any]) -> None:
        async with guard_over(server, records) as guard:
            assert await async_sdk_call(guard, server)  # this loop owns the Guard
            workers = [threading.Thread(target=worker, args=(guard,), daemon=True) for _ in range(4)]
            for thread in workers:
                thread.start()
            for _ in workers:  # the loop's thread blocks: the workers' calls wait for it, not yet started
                assert handed.acquire(timeout=10)
            assert sync_sdk_call(guard, server)  # the loop's own thread: the Guard leaves it for its own loop
            await to_thread(join, workers)
            assert len(outcome) == 4, "worker calls never returned"  # before: none did
            assert outcome == ["hello"] * 4

    if backend == "trio":
        trio = pytest.importorskip("trio")
        trio.run(app, trio.to_thread.run_sync)
    else:
        asyncio.run(app(asyncio.to_thread))
    assert len(server.received) == 6  # each call sent once
    assert [r.status for r in records] == ["ok"] * 6
    assert sync_threads() == []
    assert eventually(lambda: client_sockets([server]) == 0)


def run_app(backend: str, app: Callable[[Callable[..., Any]], Any]) -> None:
    """Run ``app(to_thread)`` under ``backend`` (asyncio's loop, or a trio run)."""
    if backend == "trio":
        trio = pytest.importorskip("trio")
        trio.run(app, trio.to_thread.run_sync)
    else:
        asyncio.run(app(asyncio.to_thread))


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sync_calls_the_owner_loop_blocks_waiting_for_in_a_thread_pool_are_all_served_once(
    server: LoopbackServer, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async function calls sync code that fans sync calls out to a thread pool and waits for them without
    awaiting (a sync library's batch): the calls were handed to the loop that owns the Guard, which that wait
    blocks, and never started (before: none of 4 returned). Taken for blocked, the loop is left, and each call runs
    on the Guard's own thread, sent once; the next awaited call takes the Guard back, and the calls handed to the
    loop earlier are refused there as it runs again."""
    monkeypatch.setattr(loop_owner, "BLOCKED_AFTER", 0.05)  # the test's loop is blocked for good: no need to wait
    monkeypatch.setattr(_runner, "LOOP_CHECK", 0.02)
    records: list[PhaseRecord] = []

    def batch(guard: Guard) -> list[str]:
        pool = concurrent.futures.ThreadPoolExecutor(4)
        calls = [pool.submit(sync_sdk_call, guard, server) for _ in range(4)]
        done, _ = concurrent.futures.wait(calls, timeout=20)  # blocks the loop; before: timed out, none done
        pool.shutdown(wait=False)
        return [call.result() for call in done]

    async def app(to_thread: Callable[..., Any]) -> None:
        async with guard_over(server, records) as guard:
            assert await async_sdk_call(guard, server)  # this loop owns the Guard
            assert batch(guard) == ["hello"] * 4
            assert await async_sdk_call(guard, server)  # back on this loop
            assert guard.transport.loops.sync_owner() is running_loop()

    run_app(backend, app)
    assert len(server.received) == 6  # each call sent once
    assert [r.status for r in records] == ["ok"] * 6
    assert sync_threads() == []
    assert eventually(lambda: client_sockets([server]) == 0)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_sync_call_given_up_on_a_blocked_loop_is_refused_there_for_good_and_never_while_the_guard_is_busy_there(
    server: LoopbackServer, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the Guard has a call in flight on the loop, a sync call waiting for that loop to start it keeps
    waiting (the Guard stays). Given up on once nothing is, the call is refused on that loop even after an awaited
    call has taken the Guard back there: it was sent elsewhere already."""
    monkeypatch.setattr(loop_owner, "BLOCKED_AFTER", 0.0)
    server.script = Script(tokens=5, gap=0.01)
    ran: list[str] = []

    async def guest_call() -> None:
        ran.append("ran")

    async def app(to_thread: Callable[..., Any]) -> None:
        async with guard_over(server) as guard:
            loops, loop = guard.transport.loops, running_loop()
            assert loop is not None
            client = guard.http_client()
            request = client.build_request("POST", server.url + CHAT, json=BODY)
            streamed = await client.send(request, stream=True)
            handed = loops.hand(loop)
            assert not await to_thread(handed.given_up)  # a call in flight on this loop: the Guard stays
            assert loops.sync_owner() is loop
            await streamed.aclose()
            assert await to_thread(lambda: eventually(handed.given_up))  # nothing in flight: the Guard leaves
            assert loops.sync_owner() is None
            assert await async_sdk_call(guard, server)  # takes the Guard back
            assert loops.sync_owner() is loop
            with pytest.raises(LoopEnded):
                await loops.as_guest(guest_call, handed)
            assert ran == []

    run_app(backend, app)
    assert len(server.received) == 2
    assert sync_threads() == []
    assert eventually(lambda: client_sockets([server]) == 0)


async def test_guard_close_from_a_worker_thread_closes_it_on_the_loop_that_owns_it(server: LoopbackServer) -> None:
    guard = guard_over(server)
    assert await async_sdk_call(guard, server)
    assert await asyncio.to_thread(sync_sdk_call, guard, server)
    await asyncio.to_thread(guard.close)
    assert eventually(lambda: client_sockets([server]) == 0)
    with pytest.raises(GuardClosed):
        await asyncio.to_thread(guard.sync_http_client)


def cut_with_its_loop(
    guard: Guard, server: LoopbackServer, post: Callable[[httpx.Client], httpx.Response]
) -> BaseException | httpx.Response:
    """A worker's sync call (``post``) runs on the loop of an ``asyncio.run`` that owns the Guard and returns while
    the server holds the call: its outcome, once the worker is done (the server answers what comes after at once)."""
    outcome: list[BaseException | httpx.Response] = []
    started = threading.Event()

    def waiting_call() -> None:
        with guard.sync_http_client() as client:
            started.set()
            try:
                outcome.append(post(client))
            except BaseException as exc:
                outcome.append(exc)

    worker = threading.Thread(target=waiting_call)

    async def app() -> None:
        async with guard.http_client() as client:
            await client.post(server.url + CHAT, json=BODY)  # this loop owns the Guard
        server.script = Script(hang_before_headers=30)
        worker.start()
        await asyncio.to_thread(started.wait, 10)
        assert await asyncio.to_thread(eventually, lambda: len(server.received) == 2, 10)
        server.script = Script()  # for a call sent again

    asyncio.run(app())  # returns with the sync call in flight on its loop
    worker.join(20)
    assert not worker.is_alive()
    [answer] = outcome
    return answer


def test_a_sync_call_cut_by_the_end_of_its_loop_is_sent_again_where_the_guard_runs_next(
    server: LoopbackServer,
) -> None:
    guard = guard_over(server)
    try:
        response = cut_with_its_loop(guard, server, lambda client: client.post(server.url + CHAT, json=BODY))
        assert isinstance(response, httpx.Response) and response.status_code == 200
        assert len(server.received) == 3  # the async call, the sync call cut with its loop, the same sent again
    finally:
        guard.close()
    assert eventually(lambda: client_sockets([server]) == 0)


@pytest.mark.parametrize("second_through", ["httpx", "openai"])
def test_a_sync_call_made_while_the_owner_loop_is_stopped_for_a_moment_runs_there_once_it_runs_again(
    server: LoopbackServer, second_through: str
) -> None:
    """asyncio.run stops its loop for a moment between its main task and its clean-up. A worker's sync call made
    then, while another's was in flight on that loop, went to the Guard's own loop and was refused ("connections
    belong to another event loop, which is still running", a 400); it now waits for that loop, and runs there.
    Through an SDK too, whose refusals the guard answers as responses: that one came back a 503 naming the loop."""
    guard = guard_over(server)
    outcome: dict[str, BaseException | httpx.Response | str] = {}

    def sync_call(name: str) -> None:
        with guard.sync_http_client() as client:
            try:
                if name == "second" and second_through == "openai":
                    outcome[name] = "200" if sync_sdk_call(guard, server) else "empty"
                else:
                    outcome[name] = client.post(server.url + CHAT, json=BODY)
            except BaseException as exc:
                outcome[name] = exc

    loop = asyncio.new_event_loop()
    first = threading.Thread(target=sync_call, args=("first",))
    second = threading.Thread(target=sync_call, args=("second",))
    try:

        async def own_then_start_one() -> None:
            async with guard.http_client() as client:
                await client.post(server.url + CHAT, json=BODY)  # this loop owns the Guard
            server.script = Script(hang_before_headers=0.5)
            first.start()
            assert await asyncio.to_thread(eventually, lambda: len(server.received) == 2, 10)
            server.script = Script()

        loop.run_until_complete(own_then_start_one())  # stops with the first sync call in flight on it
        second.start()
        time.sleep(0.05)  # the second call finds the loop stopped
        loop.run_until_complete(asyncio.to_thread(eventually, lambda: len(outcome) == 2, 10))
        first.join(10)
        second.join(10)
        assert {name: str(getattr(answer, "status_code", answer)) for name, answer in outcome.items()} == {
            "first": "200",
            "second": "200",
        }
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        guard.close()


def test_a_sync_call_whose_body_is_read_once_is_not_sent_again_when_its_loop_ends(server: LoopbackServer) -> None:
    """An iterator's body was sent as it was read: cut with its loop, the call fails, saying why it was not sent
    again (before: the private loop-ended error, with no word of the body)."""
    guard = guard_over(server)
    body = json.dumps(BODY).encode()
    try:
        error = cut_with_its_loop(guard, server, lambda client: client.post(server.url + CHAT, content=iter([body])))
        assert type(error) is GuardClosed and "can be read only once" in str(error)
        assert len(server.received) == 2  # sent once
    finally:
        guard.close()


def test_sync_calls_beside_a_task_queue_running_each_task_in_asyncio_run_are_all_served(
    server: LoopbackServer,
) -> None:
    """Each task's loop owns the Guard while it runs, and the worker threads' calls run there: the calls still in
    flight as it ends are sent again (or, answered whole, delivered), none fails, nothing is left open. A stream
    being read as the loop ends is cut with it, as the usage guide says (`httpx.ReadError` naming that loop, the
    SDK's connection error); a call made as the loop stopped for a moment before its end (a 503 through the SDK,
    once in a few dozen runs on a busy machine) runs there."""
    server.script = Script(tokens=3, stall_before_first=0.02)
    guard = guard_over(server)
    stop = threading.Event()
    served: list[str] = []
    failed: list[BaseException] = []
    cut_streams: list[BaseException] = []

    def worker(streamed: bool) -> None:
        while not stop.is_set():
            try:
                served.append(sync_stream(guard, server) if streamed else sync_sdk_call(guard, server))
            except openai.APIConnectionError as exc:
                cause = exc.__cause__
                cut = streamed and isinstance(cause, httpx.ReadError) and "ended while the body was read" in str(cause)
                (cut_streams if cut else failed).append(exc)
            except BaseException as exc:
                failed.append(exc)

    workers = [threading.Thread(target=worker, args=(n % 2 == 0,)) for n in range(3)]
    for thread in workers:
        thread.start()
    try:
        for _ in range(30):
            asyncio.run(async_sdk_call(guard, server))  # a task: its loop takes the Guard over, and ends
    finally:
        stop.set()
        for thread in workers:
            thread.join(20)
    try:
        assert not failed, failed[:3]
        assert len(served) >= 3 and set(served) == {"hello", " t0 t1 t2"}  # answers whole, streamed or not
    finally:
        guard.close()  # the pools the last task's loop left are closed, none belongs to an ended loop
    assert eventually(lambda: client_sockets([server]) == 0)


async def test_a_sync_callers_tier_and_capture_travel_with_its_call_to_the_async_loop(server: LoopbackServer) -> None:
    async with guard_over(server) as guard:
        assert await async_sdk_call(guard, server)

        def in_a_worker_thread() -> list[tuple[str, str]]:
            with guard.tier("batch"), guard.capture() as calls:
                sync_sdk_call(guard, server)
            return [(call.tier, call.status) for call in calls]

        assert await asyncio.to_thread(in_a_worker_thread) == [("batch", "ok")]


def test_a_calls_own_timeout_error_reaches_the_sync_caller_as_it_was_raised() -> None:
    """A builtin TimeoutError the call raised is the same class as a timed-out wait for its result (Python 3.11):
    the sync caller gets it at once, not a wait that never ends."""
    loop = asyncio.new_event_loop()
    try:
        future: Future[None] = Future()
        future.set_exception(TimeoutError("the call's own"))
        with pytest.raises(TimeoutError, match="the call's own"):
            wait_for(future, loop)
    finally:
        loop.close()


async def test_sync_and_async_calls_starting_together_are_all_served(server: LoopbackServer) -> None:
    """Whichever comes first, no call is refused: a sync call counted on the Guard's own loop before that loop
    claims the Guard keeps an async call from taking the Guard over under it."""
    server.script = Script(tokens=5, gap=0.002)
    records: list[PhaseRecord] = []
    guard = guard_over(server, records)

    async def async_calls() -> None:
        for _ in range(10):
            assert await async_sdk_call(guard, server)

    def sync_calls() -> None:
        for _ in range(10):
            assert sync_stream(guard, server)

    await asyncio.gather(*(async_calls() for _ in range(4)), *(asyncio.to_thread(sync_calls) for _ in range(4)))
    await guard.aclose()
    assert [r.status for r in records] == ["ok"] * 80


@pytest.mark.parametrize("owner", ["home", "async"])
async def test_closing_lets_a_task_left_on_the_guards_own_loop_finish_before_that_loop_ends(
    server: LoopbackServer, owner: str
) -> None:
    """What the Guard starts on its own loop to close pools it left there (`start_soon`) finishes before the
    close ends that loop, however late it was started; before, the loop's end could cancel it half-way and leave
    a connection to be collected unclosed."""
    guard = guard_over(server)
    assert await asyncio.to_thread(sync_sdk_call, guard, server)  # the Guard's own loop runs
    if owner == "async":
        assert await async_sdk_call(guard, server)  # taken over: the close stops the home loop only
    home = guard.transport.loops._home
    assert home is not None
    finished = threading.Event()

    async def closing_slowly() -> None:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.3)
        finished.set()

    start_soon(closing_slowly, home)
    await guard.aclose()
    assert finished.is_set() and sync_threads() == []


def open_sync_stream(guard: Guard, server: LoopbackServer) -> Any:
    """A sync openai stream through the Guard, its first chunk read; left open, as a caller that drops it does."""
    client = openai.OpenAI(
        base_url=server.url + "/v1", api_key="k", max_retries=0, http_client=guard.sync_http_client()
    )
    events = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    next(iter(events))
    return events


async def test_a_sync_stream_closed_on_the_loop_its_call_runs_on_ends_the_call_without_blocking_the_loop(
    server: LoopbackServer,
) -> None:
    """A web app's sync handler drops its stream, and the collector closes it on the app's loop thread, where the
    call runs: the close tells the call to end and returns (before: it waited for a task of the loop it blocked,
    and the app's loop froze for good)."""
    server.script = Script(tokens=400, gap=0.01)
    async with guard_over(server) as guard:
        assert await async_sdk_call(guard, server)  # this loop owns the Guard: sync calls run here
        events = await asyncio.to_thread(open_sync_stream, guard, server)
        events.close()  # on this loop's thread, as a collection here does
        with anyio.fail_after(10):  # a bound on a hang, not a timing: the call ends as soon as the loop runs
            while guard.snapshot().calls_in_flight:  # noqa: ASYNC110 - the snapshot signals nothing
                await anyio.sleep(0.01)
    assert eventually(lambda: server.disconnects == 1 and client_sockets([server]) == 0)


def test_a_sync_stream_closed_on_the_guards_own_loop_thread_ends_the_call(server: LoopbackServer) -> None:
    """The same, collected on the Guard's own loop thread, which serves sync calls (before: the close raised
    ``RuntimeError`` there, unraisable in a collection, and the call held its connection and lease for good)."""
    server.script = Script(tokens=400, gap=0.01)
    with guard_over(server) as guard:
        events = open_sync_stream(guard, server)

        async def close_there() -> None:
            events.close()

        runner_for(guard).call(close_there)
        assert eventually(lambda: guard.snapshot().calls_in_flight == 0)
    assert eventually(lambda: server.disconnects == 1 and client_sockets([server]) == 0)
