"""A sync stream its caller drops without reading it to the end or closing it: ended when it is garbage-collected,
on whatever thread the collection runs (the thread of the loop its call runs on included), leaving nothing."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from llmguard_client import Bulkhead, Guard, PhaseRecord
from llmguard_client.edges._registry import runner_for
from tests.edges.conftest import BODY, aeventually, client_sockets, eventually, pools
from tests.loopback import LoopbackServer, Script

openai = pytest.importorskip("openai")

MakeGuard = Callable[..., Guard]
MESSAGES: Any = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
DROPPED = 3
LONG = Script(tokens=400, gap=0.01)
"""Still streaming when the caller drops it (the call reads 16 chunks ahead of it, then waits): only the guard's
close ends it, and the server sees the disconnect."""
COLLECTED = ("abandoned", "garbage_collected")


def sdk(guard: Guard, server: LoopbackServer) -> Any:
    """A sync openai client through the Guard (httpx or httpx2, whichever the installed SDK takes)."""
    return openai.OpenAI(
        base_url=server.url + "/v1", api_key="k", max_retries=0, http_client=guard.http_client_for(openai.OpenAI)
    )


def openai_stream_never_read(guard: Guard, server: LoopbackServer) -> object:
    return sdk(guard, server).chat.completions.create(model="m", messages=MESSAGES, stream=True)


def httpx_stream_never_read(guard: Guard, server: LoopbackServer) -> object:
    client = guard.sync_http_client()
    return client.send(client.build_request("POST", server.url + CHAT, json={**BODY, "stream": True}), stream=True)


def httpx_stream_after_one_chunk(guard: Guard, server: LoopbackServer) -> object:
    response = httpx_stream_never_read(guard, server)
    assert isinstance(response, httpx.Response) and next(response.iter_raw())
    return response


def httpx2_stream_never_read(guard: Guard, server: LoopbackServer) -> object:
    pytest.importorskip("httpx2")
    client = guard.sync_httpx2_client()
    return client.send(client.build_request("POST", server.url + CHAT, json={**BODY, "stream": True}), stream=True)


def open_into(held: list[httpx.Response], client: httpx.Client, request: httpx.Request) -> None:
    """Open a stream in a worker thread, and keep it only in ``held``: returned, it would also be the result the
    worker thread's machinery holds for a while after the caller has it."""
    held.append(client.send(request, stream=True))


@contextmanager
def collected_here() -> Iterator[None]:
    """Only the collections this thread runs in the block (an automatic one, set off by another thread's
    allocations, would finalize what was dropped on that thread instead)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def tasks_on_the_guards_loop(guard: Guard) -> int:
    """Tasks on the Guard's own event-loop thread, but the one counting them."""

    async def count() -> int:
        return len(asyncio.all_tasks()) - 1

    return int(runner_for(guard).call(count))


@pytest.mark.parametrize(
    "open_stream",
    [openai_stream_never_read, httpx_stream_never_read, httpx_stream_after_one_chunk, httpx2_stream_never_read],
)
def test_a_sync_stream_dropped_unclosed_is_ended_when_collected(
    open_stream: Callable[[Guard, LoopbackServer], object], servers: list[LoopbackServer], make_guard: MakeGuard
) -> None:
    """Before: the dropped responses were collected, but their calls stayed in flight for the Guard's life, each
    holding its connection, slot and the task reading it."""
    for server in servers:
        server.script = LONG
    records: list[PhaseRecord] = []
    guard = make_guard(hedge=None, on_record=records.append)
    idle_tasks = tasks_on_the_guards_loop(guard)
    held = [open_stream(guard, servers[0]) for _ in range(DROPPED)]
    assert guard.snapshot().calls_in_flight == DROPPED
    held.clear()  # dropped unclosed
    gc.collect()
    assert eventually(lambda: guard.snapshot().idle)
    assert eventually(lambda: sum(s.disconnects for s in servers) == DROPPED and client_sockets(servers) == 0)
    assert eventually(lambda: tasks_on_the_guards_loop(guard) == idle_tasks)
    assert [(r.status, r.cause) for r in records] == [COLLECTED] * DROPPED


def test_a_control_sync_stream_dropped_unclosed_is_recorded_as_collected_too(
    servers: list[LoopbackServer], make_guard: MakeGuard
) -> None:
    for server in servers:
        server.script = LONG
    records: list[PhaseRecord] = []
    guard = make_guard(hedge=None, on_record=records.append, rollout=0.0)
    held = [httpx_stream_after_one_chunk(guard, servers[0])]
    held.clear()  # dropped unclosed, its edge waiting in a read
    gc.collect()
    assert eventually(lambda: guard.snapshot().idle and len(records) == 1)
    assert eventually(lambda: servers[0].disconnects == 1)
    assert [(r.cohort, r.status, r.cause) for r in records] == [("control", *COLLECTED)]


def test_a_bulkhead_of_one_serves_the_call_after_a_dropped_stream(
    servers: list[LoopbackServer], make_guard: MakeGuard
) -> None:
    """Before: the dropped stream kept the only slot, and every later call was refused (``bulkhead_full``, a 503
    to the SDK) where the plain SDK served it."""
    for server in servers:
        server.script = LONG
    guard = make_guard(hedge=None, bulkheads={"interactive": Bulkhead(max_in_flight=1)})
    held = [openai_stream_never_read(guard, servers[0])]
    held.clear()  # dropped unclosed
    gc.collect()
    assert eventually(lambda: guard.snapshot().calls_in_flight == 0)
    with guard.capture() as calls:
        answer = sdk(guard, servers[0]).chat.completions.create(model="m", messages=MESSAGES)
    assert answer.choices[0].message.content and [c.status for c in calls] == ["ok"]


def test_a_sync_stream_collected_on_the_guards_own_loop_thread_is_ended(
    servers: list[LoopbackServer], make_guard: MakeGuard
) -> None:
    """Collected on the thread of the loop its call runs on: the call is told to end, and the collection does not
    wait for the loop it runs on."""
    for server in servers:
        server.script = LONG
    records: list[PhaseRecord] = []
    guard = make_guard(hedge=None, on_record=records.append)
    client = guard.sync_http_client()
    request = client.build_request("POST", servers[0].url + CHAT, json={**BODY, "stream": True})
    held = [client.send(request, stream=True)]

    async def drop_and_collect() -> None:
        held.clear()
        gc.collect()

    with collected_here():
        runner_for(guard).start(drop_and_collect).result(timeout=10)  # a bound on a hang, not a timing
    assert eventually(lambda: guard.snapshot().idle and len(records) == 1)
    assert eventually(lambda: sum(s.disconnects for s in servers) == 1 and client_sockets(servers) == 0)
    assert [(r.status, r.cause) for r in records] == [COLLECTED]


async def test_a_sync_stream_collected_on_the_app_loop_its_call_runs_on_is_ended(
    servers: list[LoopbackServer], amake_guard: MakeGuard
) -> None:
    """A web app's sync handler drops its stream and the collection runs on the app's loop, where the call runs
    (that loop owns the Guard): the call ends as soon as the loop runs on."""
    for server in servers:
        server.script = LONG
    records: list[PhaseRecord] = []
    guard = amake_guard(hedge=None, on_record=records.append)
    async with guard.http_client() as owner:  # this loop owns the Guard: sync calls from other threads run here
        assert (await owner.post(servers[0].url + CHAT, json=BODY)).status_code == 200
    client = guard.sync_http_client()
    request = client.build_request("POST", servers[0].url + CHAT, json={**BODY, "stream": True})
    held: list[httpx.Response] = []
    await asyncio.to_thread(open_into, held, client, request)
    with collected_here():
        held.clear()
        gc.collect()
    assert await aeventually(lambda: guard.snapshot().idle)
    assert await aeventually(lambda: sum(s.disconnects for s in servers) == 1)
    assert [(r.status, r.cause) for r in records] == [("ok", None), COLLECTED]


def test_a_sync_stream_collected_on_the_trio_run_its_call_runs_on_is_ended(servers: list[LoopbackServer]) -> None:
    """The same beside a trio run that owns the Guard."""
    trio = pytest.importorskip("trio")
    for server in servers:
        server.script = LONG
    records: list[PhaseRecord] = []

    async def app() -> bool:
        guard = Guard(
            [servers[0].url], hedge=None, instrumentation=None, transport_factory=pools, on_record=records.append
        )
        async with guard, guard.http_client() as owner:  # this run owns the Guard
            assert (await owner.post(servers[0].url + CHAT, json=BODY)).status_code == 200
            client = guard.sync_http_client()
            request = client.build_request("POST", servers[0].url + CHAT, json={**BODY, "stream": True})
            held: list[httpx.Response] = []
            await trio.to_thread.run_sync(open_into, held, client, request)
            with collected_here():
                held.clear()
                gc.collect()
            with trio.move_on_after(10):  # a bound on a hang, not a timing
                while not guard.snapshot().idle:
                    await trio.sleep(0.01)
            return guard.snapshot().idle

    assert trio.run(app)
    assert eventually(lambda: servers[0].disconnects == 1 and client_sockets(servers) == 0)
    assert [(r.status, r.cause) for r in records] == [("ok", None), COLLECTED]


def test_a_sync_stream_closed_or_read_to_its_end_is_not_ended_again_when_collected(
    servers: list[LoopbackServer], make_guard: MakeGuard
) -> None:
    records: list[PhaseRecord] = []
    guard = make_guard(hedge=None, on_record=records.append)
    client = guard.sync_http_client()
    read = client.send(client.build_request("POST", servers[0].url + CHAT, json={**BODY, "stream": True}), stream=True)
    read.read()
    for server in servers:
        server.script = LONG
    closed = client.send(
        client.build_request("POST", servers[0].url + CHAT, json={**BODY, "stream": True}), stream=True
    )
    closed.close()
    del read, closed
    gc.collect()
    assert eventually(lambda: guard.snapshot().idle)
    assert [(r.status, r.cause) for r in records] == [("ok", None), ("abandoned", "closed_by_caller")]
