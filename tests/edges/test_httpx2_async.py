"""The async httpx2 edge (openai >= 3, anthropic >= 1) against real loopback servers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import httpx
import pytest

from llmguard_client import Bulkhead, Guard, Tier, TTFTTimeout, guard_failure
from tests.edges.conftest import BODY, aeventually
from tests.loopback import LoopbackServer, Script

httpx2 = pytest.importorskip("httpx2")
openai = pytest.importorskip("openai")

MakeGuard = Callable[..., Guard]
MESSAGES = [{"role": "user", "content": "hi"}]


def oai(guard: Guard, server: LoopbackServer, **kwargs: object) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", http_client=guard.httpx2_client(), **kwargs)


async def test_openai_streamed_and_not_streamed(servers: list[LoopbackServer], amake_guard: MakeGuard) -> None:
    guard = amake_guard()
    client = oai(guard, servers[0])
    with guard.capture() as calls:
        done = await client.chat.completions.create(model="m", messages=MESSAGES)
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert done.choices[0].message.content == "hello" and text == " t0 t1 t2 t3 t4"
    assert [(c.stream, c.status) for c in calls] == [(False, "ok"), (True, "ok")]


@pytest.mark.parametrize("cancelled_after", [None, 1, 2, 3])
async def test_closing_an_openai_stream_midway_closes_the_upstream(
    servers: list[LoopbackServer], amake_guard: MakeGuard, cancelled_after: int | None
) -> None:
    """Also when asyncio's ``Task.cancel()`` (``wait_for``, ``asyncio.timeout``), which passes the anyio shield
    around the close, lands ``cancelled_after`` loop steps into ``stream.close()`` (before: at one step, the server
    generated to the end and the call's connection stayed open)."""
    for server in servers:
        server.script = Script(tokens=300, gap=0.01)
    guard = amake_guard(hedge=None)
    stream = await oai(guard, servers[0]).chat.completions.create(model="m", messages=MESSAGES, stream=True)
    async for _ in stream:
        break
    if cancelled_after is None:
        await stream.close()
    else:
        closing = asyncio.ensure_future(stream.close())
        for _ in range(cancelled_after):
            await asyncio.sleep(0)  # the close runs to its next suspension
        closing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await closing
    assert await aeventually(lambda: sum(s.disconnects for s in servers) == 1), [s.disconnects for s in servers]
    assert guard.snapshot().calls_in_flight == 0


async def test_a_bulkhead_slot_is_given_back_after_every_call(
    servers: list[LoopbackServer], amake_guard: MakeGuard
) -> None:
    """The issue's bug: through a bare httpx2 client the call reached the server, then failed inside
    httpx2 and kept the replica's in-flight count; a bulkhead of 2 then refused every later call."""
    guard = amake_guard(bulkheads={"interactive": Bulkhead(max_in_flight=2, max_waiting=0)})
    async with guard.httpx2_client() as client:
        for _ in range(6):
            response = await client.post(servers[0].url + "/v1/chat/completions", json=BODY)
            assert response.status_code == 200 and response.extensions["llmguard"].status == "ok"
    assert [s.in_flight for s in guard._replica_set.states] == [0, 0, 0]


async def test_an_httpx_transport_refuses_an_httpx2_request_clearly(
    servers: list[LoopbackServer], amake_guard: MakeGuard
) -> None:
    guard = amake_guard()
    async with httpx2.AsyncClient(transport=guard.transport) as client:
        with pytest.raises(TypeError, match=r"guard\.httpx2_client\(\)"):
            await client.post(servers[0].url + "/v1/chat/completions", json=BODY)
    assert sum(len(s.received) for s in servers) == 0


async def test_guard_failures_are_httpx2_and_guard_exceptions_at_once(
    servers: list[LoopbackServer], amake_guard: MakeGuard
) -> None:
    for server in servers:
        server.script = Script(stall_before_first=5.0)
    guard = amake_guard(hedge=None, retry=None, tiers={"fast": Tier(ttft=0.2, total=5.0)}, failure_mode="raise")
    async with guard.httpx2_client() as client:
        with pytest.raises(httpx2.TimeoutException) as caught:
            await client.post(servers[0].url + "/v1/chat/completions", json={**BODY, "stream": True})
    error = caught.value
    assert isinstance(error, TTFTTimeout) and error.cause == "ttft_timeout" and error.record is not None
    assert isinstance(error.request, httpx2.Request) and guard_failure(error) == "ttft_timeout"
    assert isinstance(error.__cause__, TTFTTimeout) and not isinstance(error.__cause__, httpx2.HTTPError)


async def test_a_transport_error_becomes_the_httpx2_one(servers: list[LoopbackServer], amake_guard: MakeGuard) -> None:
    for server in servers:
        server.script = Script(tokens=50, reset_after_tokens=3)
    guard = amake_guard(hedge=None, retry=None)
    async with guard.httpx2_client() as client:
        async with client.stream("POST", servers[0].url + "/v1/chat/completions", json={**BODY, "stream": True}) as r:
            with pytest.raises(httpx2.TransportError) as caught:
                async for _ in r.aiter_raw():
                    pass
    assert isinstance(caught.value.__cause__, httpx.TransportError)
    assert guard_failure(caught.value) is None


async def test_openai_raise_mode_without_sdk_retries_gives_api_timeout_once(
    servers: list[LoopbackServer], amake_guard: MakeGuard
) -> None:
    """Native APITimeoutError semantics without stacking: failure_mode="raise" + max_retries=0."""
    for server in servers:
        server.script = Script(hang_before_headers=5.0)
    guard = amake_guard(hedge=None, retry=None, tiers={"fast": Tier(ttft=0.2, total=5.0)}, failure_mode="raise")
    with pytest.raises(openai.APITimeoutError) as caught:
        await oai(guard, servers[0], max_retries=0).chat.completions.create(model="m", messages=MESSAGES)
    assert guard_failure(caught.value) == "ttft_timeout"
    # The guard gave up before the server answered; on a busy machine before its handler ran, too.
    assert servers[0].wait_for(lambda: sum(len(s.received) for s in servers) >= 1)
    assert sum(len(s.received) for s in servers) == 1


async def test_openai_response_mode_raises_a_deadline_as_a_timeout(
    servers: list[LoopbackServer], amake_guard: MakeGuard
) -> None:
    for server in servers:
        server.script = Script(hang_before_headers=5.0)
    guard = amake_guard(hedge=None, retry=None, tiers={"fast": Tier(ttft=0.2, total=5.0)})  # auto: response mode
    with pytest.raises(openai.APITimeoutError) as caught:
        await oai(guard, servers[0]).chat.completions.create(model="m", messages=MESSAGES)  # max_retries=2
    assert guard_failure(caught.value) == "ttft_timeout"
    assert servers[0].wait_for(lambda: sum(len(s.received) for s in servers) >= 1)  # as above
    assert sum(len(s.received) for s in servers) == 1  # the SDK's retries failed at once: nothing sent


def test_the_httpx2_edge_runs_under_trio(servers: list[LoopbackServer]) -> None:
    pytest.importorskip("trio")
    import anyio

    from tests.edges.conftest import pools

    async def main() -> str:
        guard = Guard([s.url for s in servers], instrumentation=None, transport_factory=pools)
        async with guard, guard.httpx2_client() as client:
            body = {**BODY, "stream": True}
            async with client.stream("POST", servers[0].url + "/v1/chat/completions", json=body) as response:
                return (await response.aread()).decode()

    assert anyio.run(main, backend="trio").endswith("data: [DONE]\n\n")


async def test_no_async_generator_is_left_for_the_loop_to_finalize(
    servers: list[LoopbackServer], amake_guard: MakeGuard
) -> None:
    """openai >= 3 iterates a body twice (it drains after [DONE]) and leaves the first iteration
    suspended; an edge generator left so raced the response's close at loop shutdown
    ("aclose(): asynchronous generator is already running"). (The one generator left on purpose closes the
    Guard's pools as the loop ends: tests/core/test_loop_owner.py.)"""
    import gc
    import inspect

    guard = amake_guard()
    client = oai(guard, servers[0])
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    async for _ in stream:
        pass
    gc.collect()
    left = [o for o in gc.get_objects() if inspect.isasyncgen(o) and "llmguard_client" in o.ag_code.co_filename]
    left = [o for o in left if not o.ag_code.co_filename.endswith("loop_owner.py")]
    assert left == []
