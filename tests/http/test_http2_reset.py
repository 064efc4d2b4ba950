"""Replicas spoken to over HTTP/2: an answer the guard abandons (a stream its caller closed, a hedge's loser, a call
past its deadline, before or after the server sent its headers) is reset, so the server stops generating it, as a
closed HTTP/1.1 connection tells it; an answer read to its end is not, and its connection is kept."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from llmguard_client import Guard, HedgePolicy, PhaseRecord, Replica, Tier
from tests.edges.conftest import aeventually
from tests.loopback import LoopbackServer, Script, running

pytest.importorskip("h2")
pytest.importorskip("hypercorn")

BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def _h2_servers() -> Iterator[list[LoopbackServer]]:
    with running([LoopbackServer(f"h2-{i}", http2=True) for i in range(2)]) as servers:
        yield servers


@pytest.fixture
def h2_servers(_h2_servers: list[LoopbackServer]) -> list[LoopbackServer]:
    for server in _h2_servers:
        server.reset()
    return _h2_servers


def over_http2(replica: Replica) -> httpx.AsyncBaseTransport:
    return httpx.AsyncHTTPTransport(http1=False, http2=True, retries=0)  # HTTP/2 with prior knowledge


def guard_over(servers: list[LoopbackServer], records: list[PhaseRecord], **kwargs: Any) -> Guard:
    kwargs.setdefault("tiers", {"t": Tier(ttft=5, total=10)})
    return Guard([s.url for s in servers], transport_factory=over_http2, on_record=records.append, **kwargs)


async def test_a_stream_its_caller_closes_is_reset_and_its_server_stops(h2_servers: list[LoopbackServer]) -> None:
    server = h2_servers[0]
    server.script = Script(tokens=300, gap=0.01)
    records: list[PhaseRecord] = []
    async with guard_over([server], records) as guard, guard.http_client() as client:
        async with client.stream("POST", server.url + CHAT, json=BODY) as response:
            assert response.http_version == "HTTP/2"
            async for _ in response.aiter_raw():
                break
        assert await aeventually(lambda: server.disconnects == 1)  # before: 0, the server streamed all 300 tokens
    assert server.completed == 0 and server.counters["work_tokens"] < 300
    assert [r.cause for r in records] == ["closed_by_caller"]


@pytest.mark.parametrize(
    ("script", "worked"),
    [
        (Script(stall_before_first=3.0), lambda server: server.completed),  # after its headers
        # before its headers: before, httpcore forgot each loser's stream and the server waited out its 30 s
        (Script(hang_before_headers=30.0), lambda server: server.counters["admitted"]),
    ],
    ids=["after_headers", "before_headers"],
)
async def test_a_hedges_loser_is_reset_and_its_server_stops(
    h2_servers: list[LoopbackServer], script: Script, worked: Callable[[LoopbackServer], int]
) -> None:
    slow, fast = h2_servers
    slow.script = script
    records: list[PhaseRecord] = []
    async with guard_over([slow, fast], records, hedge=HedgePolicy(delay=0.1)) as guard:
        async with guard.http_client() as client:
            for _ in range(3):
                assert (await client.post(slow.url + CHAT, json=BODY)).is_success
        lost = sum(a.outcome == "lost" for r in records for a in r.attempts)
        assert lost >= 1
        assert await aeventually(lambda: slow.disconnects == lost)  # before: 0, each loser generated to its end
    assert worked(slow) == 0


async def test_a_call_past_its_deadline_is_reset_and_its_server_stops(h2_servers: list[LoopbackServer]) -> None:
    server = h2_servers[0]
    server.script = Script(tokens=300, gap=0.01)
    records: list[PhaseRecord] = []
    async with guard_over([server], records, tiers={"t": Tier(ttft=0.5, total=0.5)}) as guard:
        async with guard.http_client() as client, client.stream("POST", server.url + CHAT, json=BODY) as response:
            with pytest.raises(httpx.HTTPError):
                async for _ in response.aiter_raw():
                    pass
        assert await aeventually(lambda: server.disconnects == 1)
    assert server.completed == 0
    assert records[0].cause == "total_timeout"


async def test_a_call_past_its_deadline_before_its_headers_is_reset(h2_servers: list[LoopbackServer]) -> None:
    server = h2_servers[0]
    server.script = Script(hang_before_headers=30.0)
    records: list[PhaseRecord] = []
    async with guard_over([server], records, tiers={"t": Tier(ttft=0.3, total=0.3)}, retry=None) as guard:
        async with guard.http_client() as client:
            with pytest.raises(httpx.HTTPError):
                await client.post(server.url + CHAT, json=BODY)
        assert await aeventually(lambda: server.disconnects == 1)  # before: 0
    assert server.counters["admitted"] == 0
    assert records[0].cause == "ttft_timeout"


async def test_a_callers_own_trace_hook_still_sees_every_event(h2_servers: list[LoopbackServer]) -> None:
    server = h2_servers[0]
    events: list[str] = []

    async def trace(event: str, info: dict[str, Any]) -> None:
        events.append(event)

    records: list[PhaseRecord] = []
    async with guard_over([server], records) as guard, guard.http_client() as client:
        response = await client.post(server.url + CHAT, json=BODY, extensions={"trace": trace})
    assert response.is_success
    assert "http2.send_request_headers.started" in events and "http2.response_closed.complete" in events


async def test_answers_read_to_their_end_are_not_reset_and_share_one_connection(
    h2_servers: list[LoopbackServer],
) -> None:
    server = h2_servers[0]
    records: list[PhaseRecord] = []
    async with guard_over([server], records) as guard, guard.http_client() as client:
        for _ in range(3):
            response = await client.post(server.url + CHAT, json=BODY)
            assert response.is_success and response.text.endswith("data: [DONE]\n\n")
    assert (server.completed, server.disconnects) == (3, 0)
    assert len({r.peer for r in server.received}) == 1
    assert [r.status for r in records] == ["ok"] * 3
