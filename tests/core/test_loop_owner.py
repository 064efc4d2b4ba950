"""One Guard across event loops: refused from a second loop while the first runs; taken over by the next loop
once the first has ended (a script's second ``asyncio.run``, a loop per test, a task queue's ``asyncio.run``
per task), each loop's connections closed as it ends."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from llmguard_client import Guard, WrongEventLoop
from tests.edges.conftest import client_sockets, eventually, pools
from tests.loopback import LoopbackServer, Script

openai = pytest.importorskip("openai")
MESSAGES: Any = [{"role": "user", "content": "hi"}]
BODY = {"model": "m", "messages": MESSAGES}
CHAT = "/v1/chat/completions"


def sdk_call(guard: Guard, server: LoopbackServer, backend: str = "asyncio") -> str:
    """One chat completion through the openai SDK with no retry of its own (so a failure is not hidden), in an
    ``asyncio.run`` or a ``trio.run`` of its own."""

    async def call() -> str:
        client = openai.AsyncOpenAI(
            base_url=server.url + "/v1",
            api_key="k",
            max_retries=0,
            http_client=guard.http_client_for(openai.AsyncOpenAI),
        )
        answer = await client.chat.completions.create(model="m", messages=MESSAGES)
        return answer.choices[0].message.content or ""

    if backend == "trio":
        return str(pytest.importorskip("trio").run(call))
    return asyncio.run(call())


@pytest.fixture
def server(servers: list[LoopbackServer]) -> Iterator[LoopbackServer]:
    assert eventually(lambda: client_sockets(servers[:1]) == 0)  # nothing left by an earlier test
    yield servers[0]


def test_each_asyncio_run_in_turn_is_served_and_closes_its_connections(server: LoopbackServer) -> None:
    """Without a Guard the second ``asyncio.run`` fails (``RuntimeError: Event loop is closed``: the pool kept
    the first loop's connection) and the third is served; through one Guard every run is, then a sync call."""
    guard = Guard([server.url], instrumentation=None, transport_factory=pools)
    try:
        for _ in range(3):
            assert sdk_call(guard, server) != ""
            assert eventually(lambda: client_sockets([server]) == 0)  # closed as its loop ended, not left to gc
        with guard.sync_http_client() as client:  # the Guard's own loop takes over too
            assert client.post(server.url + CHAT, json={"model": "m", "messages": MESSAGES}).is_success
        assert len(server.received) == 4
    finally:
        guard.close()
    assert eventually(lambda: client_sockets([server]) == 0)


def test_each_trio_run_in_turn_is_served_and_closes_its_connections(server: LoopbackServer) -> None:
    """A trio run is an event loop as an asyncio one is: its connections are closed as it ends, the next run
    takes the Guard over, and ``guard.close()`` afterwards has nothing of an ended run's to close (it raised
    ``RuntimeError: must be called from async context``, closing a trio socket from asyncio)."""
    guard = Guard([server.url], instrumentation=None, transport_factory=pools)
    try:
        for _ in range(3):
            assert sdk_call(guard, server, "trio") != ""
            assert eventually(lambda: client_sockets([server]) == 0)  # closed as its run ended
        assert sdk_call(guard, server) != ""  # then an asyncio loop takes it over
    finally:
        guard.close()
    assert len(server.received) == 4


def test_a_guard_closed_and_dropped_while_its_trio_run_goes_on_leaves_nothing_unfinished(
    server: LoopbackServer,
) -> None:
    """Closing the Guard ends what it parked in the run; before, the run later collected it unfinished and trio
    warned (``ResourceWarning: Async generator ... was garbage collected before it had been exhausted``)."""
    trio = pytest.importorskip("trio")
    unraisable: list[str] = []

    async def main() -> None:
        async with Guard([server.url], instrumentation=None, transport_factory=pools) as guard:
            assert (await guard.http_client().post(server.url + CHAT, json=BODY)).is_success
        del guard
        gc.collect()
        await trio.sleep(0)

    previous = sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(f"{u.exc_type.__name__}: {u.exc_value}")
    try:
        trio.run(main)
    finally:
        sys.unraisablehook = previous
    assert unraisable == []


def close_after_its_left_over_work(loop: asyncio.AbstractEventLoop) -> None:
    """Run ``loop`` until what it was left to do (the closes of pools the Guard left on it) is done, then close it."""

    async def left_over() -> None:
        await asyncio.sleep(0)  # the callbacks scheduled from other threads start their tasks
        await asyncio.gather(*(t for t in asyncio.all_tasks() if t is not asyncio.current_task()))
        await asyncio.sleep(0)  # the transports' connection_lost callbacks

    loop.run_until_complete(left_over())
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


def test_a_loop_stopped_between_runs_gives_the_guard_up_to_sync_calls_and_other_loops(server: LoopbackServer) -> None:
    """``loop.run_until_complete`` on one loop kept for the process (older code, sync wrappers) leaves the loop
    stopped, not closed, between runs: a sync call or another loop's call there was refused (``WrongEventLoop``;
    the plain SDK serves the sync one). With nothing in flight the stopped loop now gives the Guard up, its
    connections closed there when it next runs."""
    guard = Guard([server.url], instrumentation=None, transport_factory=pools)
    loop = asyncio.new_event_loop()

    async def call() -> str:
        async with guard.http_client() as client:
            return (await client.post(server.url + CHAT, json=BODY)).text

    try:
        for _ in range(2):
            assert loop.run_until_complete(call())
            with guard.sync_http_client() as client:
                assert client.post(server.url + CHAT, json=BODY).is_success  # before: a 400, WrongEventLoop
            assert loop.run_until_complete(call())
            assert asyncio.run(call())  # another loop: before, WrongEventLoop
        assert len(server.received) == 8
    finally:
        guard.close()
        close_after_its_left_over_work(loop)
    assert eventually(lambda: client_sockets([server]) == 0)


def test_a_loop_stopped_with_a_call_in_flight_keeps_the_guard(server: LoopbackServer) -> None:
    """A call suspended in a stopped loop still needs that loop's connections: other loops are refused."""
    server.script = Script(tokens=50, gap=0.01)
    guard = Guard([server.url], instrumentation=None, transport_factory=pools)
    loop = asyncio.new_event_loop()

    async def open_stream() -> httpx.Response:
        return await guard.http_client().send(
            guard.http_client().build_request("POST", server.url + CHAT, json=BODY), stream=True
        )

    try:
        response = loop.run_until_complete(open_stream())  # its body not read yet: in flight, the loop stopped
        with pytest.raises(WrongEventLoop), guard.sync_http_client() as client:
            client.post(server.url + CHAT, json=BODY)
        loop.run_until_complete(response.aclose())
        with guard.sync_http_client() as client:  # nothing in flight now
            assert client.post(server.url + CHAT, json=BODY).is_success
    finally:
        guard.close()
        close_after_its_left_over_work(loop)


def test_a_guard_closes_from_sync_code_after_its_loop_ended(server: LoopbackServer) -> None:
    guard = Guard([server.url], instrumentation=None, transport_factory=pools)
    assert sdk_call(guard, server) != ""
    guard.close()
    assert guard.closed


def test_a_loop_closed_without_finalizing_leaves_its_connection_to_be_dropped(server: LoopbackServer) -> None:
    """``loop.close()`` alone runs no finalizer, so the connection stays open with its ended loop: the next loop
    to call drops it (asyncio closes its socket when it is collected, with its ResourceWarning, as for an
    httpx client's) and is served on a connection of its own."""
    guard = Guard([server.url], instrumentation=None, transport_factory=pools)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(guard.http_client().post(server.url + CHAT, json=BODY))
    finally:
        loop.close()
    left = client_sockets([server])  # one, or more when a busy machine made that call send again
    dropped: list[str] = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: dropped.append(str(unraisable.exc_value))
    try:
        assert left >= 1
        assert sdk_call(guard, server) != ""
    finally:  # whatever failed, the ended loop's connections are dropped here, not left to the next tests
        gc.collect()
        sys.unraisablehook = previous
        guard.close()
    assert any("unclosed transport" in message for message in dropped)
    assert eventually(lambda: client_sockets([server]) == 0)
    assert len(server.received) >= 2


def test_a_second_loop_is_refused_while_the_first_runs_and_served_once_it_ended(server: LoopbackServer) -> None:
    """Thread A's loop makes a call and stays up while thread B's loop calls: B is refused, naming the fix,
    and nothing is sent for it (in response mode the SDK gets a 400 it does not retry); once A's loop has
    ended, another ``asyncio.run`` is served."""
    guard = Guard([server.url], instrumentation=None, transport_factory=pools)
    a_called, b_done = threading.Event(), threading.Event()
    seen: dict[str, BaseException | str] = {}

    def call(name: str) -> None:
        try:
            seen[name] = sdk_call(guard, server)
        except openai.APIError as exc:
            seen[name] = exc

    async def a() -> None:
        client = guard.http_client()
        seen["a"] = (await client.post(server.url + CHAT, json=BODY)).text
        a_called.set()
        await asyncio.to_thread(b_done.wait, 10)

    def b() -> None:
        a_called.wait(10)
        call("b")
        b_done.set()

    threads = [threading.Thread(target=asyncio.run, args=(a(),)), threading.Thread(target=b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    call("later")
    try:
        refused = seen["b"]
        assert isinstance(refused, openai.BadRequestError)
        assert "still running" in refused.message and "one Guard per running event loop" in refused.message
        assert "sync_http_client" in refused.message
        assert seen["later"] != "" and isinstance(seen["later"], str)
        assert len(server.received) == 2  # A's and the later one: nothing for B
    finally:
        guard.close()


async def test_raise_mode_raises_wrong_event_loop(server: LoopbackServer) -> None:
    async with Guard([server.url], instrumentation=None, transport_factory=pools) as guard:
        async with guard.http_client() as client:
            assert (await client.post(server.url + CHAT, json=BODY)).status_code == 200

        def elsewhere() -> BaseException | None:
            async def go() -> None:
                async with guard.http_client() as other:
                    await other.post(server.url + CHAT, json=BODY)

            try:
                asyncio.run(go())
            except WrongEventLoop as exc:
                return exc
            return None

        error = await asyncio.to_thread(elsewhere)
        assert isinstance(error, WrongEventLoop) and error.cause == "wrong_event_loop"
        assert len(server.received) == 1


def test_an_async_sdk_call_on_a_loop_the_guard_left_as_it_ended_is_answered_a_503_at_once(
    server: LoopbackServer,
) -> None:
    """An async generator's clean-up calls as asyncio.run ends, after the Guard has left that loop: refused, nothing
    sent, as the refusal the SDK does not retry (a 503 with ``x-should-retry: false``), not a connection error the
    SDK retries with backoff. Only a sync edge's call is sent again elsewhere, by that edge."""
    guard = Guard([server.url], instrumentation=None, transport_factory=pools)
    client = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI)
    )
    outcome: list[BaseException | str] = []

    async def cleanup_calls() -> AsyncIterator[None]:
        try:
            yield
        finally:
            await asyncio.sleep(0.05)  # after the Guard's own generator on this loop was closed
            try:
                with warnings.catch_warnings():  # httpx's auth flow, a generator started now: asyncio warns, plain too
                    warnings.simplefilter("ignore", ResourceWarning)
                    answer = await client.chat.completions.create(model="m", messages=MESSAGES)
                outcome.append(answer.choices[0].message.content or "")
            except BaseException as exc:
                outcome.append(exc)

    kept: list[AsyncIterator[None]] = []

    async def main() -> None:
        await client.chat.completions.create(model="m", messages=MESSAGES)  # this loop owns the Guard
        kept.append(cleanup_calls())
        await kept[0].__anext__()  # left suspended: asyncio.run closes it as it ends

    try:
        asyncio.run(main())
        [error] = outcome
        assert isinstance(error, openai.InternalServerError) and error.status_code == 503, error
        assert "ended, or the Guard left it" in error.message
        assert len(server.received) == 1  # the first call only: the refused one sent nothing, retried nothing
    finally:
        guard.close()
