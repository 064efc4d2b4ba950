"""guard.capture(): the phase records of calls made inside a block, across tasks, through SDKs."""

from __future__ import annotations

import anyio
import httpx
import pytest

from llmguard_client import Guard, Tier, capture
from llmguard_client.telemetry.capture import CAPTURES_EXTENSION, Capture, deliver_to_captures
from llmguard_client.telemetry.record import PhaseRecord
from tests.edges.conftest import pools
from tests.loopback import LoopbackServer, Script

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def record(request_id: str = "r") -> PhaseRecord:
    return PhaseRecord(request_id, "t", "guarded", "POST", "/v1/chat/completions", 0.0, 0.0)


def test_records_go_to_every_open_capture_in_the_context() -> None:
    with capture() as outer:
        deliver_to_captures(record("a"))
        with capture() as inner:
            deliver_to_captures(record("b"))
        deliver_to_captures(record("c"))
    deliver_to_captures(record("d"))
    assert [r.request_id for r in outer] == ["a", "b", "c"]
    assert [r.request_id for r in inner] == ["b"]


def test_the_request_extension_wins_over_the_context_and_closed_captures_take_nothing() -> None:
    passed = Capture()
    request = httpx.Request("POST", "http://a", extensions={CAPTURES_EXTENSION: (passed,)})
    with capture() as here:
        deliver_to_captures(record("a"), request)
    passed.open = False
    deliver_to_captures(record("b"), request)
    assert [r.request_id for r in passed] == ["a"] and here == []


async def test_calls_in_tasks_started_inside_are_captured(servers: list[LoopbackServer]) -> None:
    async with (
        Guard([s.url for s in servers], instrumentation=None, transport_factory=pools) as guard,
        guard.http_client() as client,
    ):

        async def call() -> None:
            await client.post(servers[0].url + "/v1/chat/completions", json=BODY)

        await call()  # before the block: not captured
        with guard.capture() as calls:
            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(call)
        await call()  # after: not captured
    assert len(calls) == 4 and all(c.status == "ok" for c in calls)


async def test_a_failed_call_is_captured_with_its_cause(servers: list[LoopbackServer]) -> None:
    for server in servers:
        server.script = Script(stall_before_first=5.0)
    tiers = {"fast": Tier(ttft=0.2, total=5.0)}
    async with Guard(
        [s.url for s in servers], tiers=tiers, hedge=None, retry=None, instrumentation=None, transport_factory=pools
    ) as guard:
        async with guard.http_client() as client:
            with guard.capture() as calls, pytest.raises(httpx.TimeoutException):
                await client.post(servers[0].url + "/v1/chat/completions", json={**BODY, "stream": True})
    assert [(c.status, c.cause) for c in calls] == [("timeout", "ttft_timeout")]


async def test_a_stream_read_after_the_block_is_not_captured(servers: list[LoopbackServer]) -> None:
    async with (
        Guard([s.url for s in servers], instrumentation=None, transport_factory=pools) as guard,
        guard.http_client() as client,
    ):
        with guard.capture() as calls:
            request = client.build_request(
                "POST", servers[0].url + "/v1/chat/completions", json={**BODY, "stream": True}
            )
            response = await client.send(request, stream=True)
        await response.aread()
        await response.aclose()
    assert calls == []
