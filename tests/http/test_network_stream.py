"""The ``network_stream`` response extension through every edge, against real loopback servers: the caller learns
the peer that answered, as from a plain client, and cannot read, write or close the guard's connection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from llmguard_client import Guard, Tier
from llmguard_client._http.network_stream import NetworkStreamInfo
from tests.edges.conftest import BODY, pools
from tests.loopback import LoopbackServer, Script

httpx2 = pytest.importorskip("httpx2")

TIERS = {"t": Tier(ttft=2.0, total=10.0, stall=2.0)}
CHAT = "/v1/chat/completions"


def make_guard(servers: list[LoopbackServer], **kwargs: Any) -> Guard:
    return Guard(
        [s.url for s in servers], tiers=TIERS, instrumentation=None, transport_factory=pools, hedge=None, **kwargs
    )


def peer(extensions: dict[str, Any]) -> Any:
    return extensions["network_stream"].get_extra_info("server_addr")


@pytest.mark.parametrize("client_of", [Guard.http_client, Guard.httpx2_client], ids=["httpx", "httpx2"])
async def test_an_async_callers_response_names_the_peer_that_answered(
    servers: list[LoopbackServer], client_of: Callable[[Guard], Any]
) -> None:
    async with make_guard(servers[:1]) as guard, client_of(guard) as client:
        done = await client.post(servers[0].url + CHAT, json=BODY)
        done_peer = peer(done.extensions)  # read while the connection is open, as from a plain client
        async with client.stream("POST", servers[0].url + CHAT, json={**BODY, "stream": True}) as streamed:
            streamed_peer = peer(streamed.extensions)
            await streamed.aread()
    assert done_peer == streamed_peer == ("127.0.0.1", servers[0].port)


@pytest.mark.parametrize("client_of", [Guard.sync_http_client, Guard.sync_httpx2_client], ids=["httpx", "httpx2"])
def test_a_sync_callers_response_names_the_peer_that_answered(
    servers: list[LoopbackServer], client_of: Callable[[Guard], Any]
) -> None:
    guard = make_guard(servers[:1])
    try:
        with client_of(guard) as client:
            answered_by = peer(client.post(servers[0].url + CHAT, json=BODY).extensions)
    finally:
        guard.close()
    assert answered_by == ("127.0.0.1", servers[0].port)


async def test_the_openai_sdk_on_the_httpx2_edge_reads_the_peer(servers: list[LoopbackServer]) -> None:
    openai = pytest.importorskip("openai")
    async with make_guard(servers[:1]) as guard:
        oai = openai.AsyncOpenAI(
            base_url=servers[0].url + "/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI)
        )
        raw = await oai.chat.completions.with_raw_response.create(model="m", messages=BODY["messages"])
        assert peer(raw.http_response.extensions) == ("127.0.0.1", servers[0].port)


async def test_the_peer_of_a_retried_call_is_the_replica_that_answered(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(status=503)
    async with make_guard(servers[:2]) as guard, guard.http_client() as client:
        for _ in range(2):  # whichever replica the first call tries first, one of the two calls meets the 503
            response = await client.post(servers[0].url + CHAT, json=BODY)
            assert response.status_code == 200 and peer(response.extensions) == ("127.0.0.1", servers[1].port)
    assert len(servers[0].received) >= 1


async def test_a_server_error_answer_handed_back_names_its_peer_or_none(servers: list[LoopbackServer]) -> None:
    for server in servers[:2]:
        server.script = Script(status=503)
    async with make_guard(servers[:2]) as guard, guard.http_client() as client:
        response = await client.post(servers[0].url + CHAT, json=BODY)
        assert response.status_code == 503
        assert peer(response.extensions) in {None, ("127.0.0.1", servers[0].port), ("127.0.0.1", servers[1].port)}


async def test_the_control_cohort_gets_the_same_view(servers: list[LoopbackServer]) -> None:
    async with make_guard(servers[:1], rollout=0.0) as guard, guard.http_client() as client:
        response = await client.post(servers[0].url + CHAT, json=BODY)
        assert response.extensions["llmguard"].cohort == "control"
        assert isinstance(response.extensions["network_stream"], NetworkStreamInfo)
        assert peer(response.extensions) == ("127.0.0.1", servers[0].port)


async def test_the_caller_cannot_read_write_or_close_the_guards_connection(servers: list[LoopbackServer]) -> None:
    async with make_guard(servers[:1]) as guard, guard.http_client() as client:
        response = await client.post(servers[0].url + CHAT, json=BODY)
        stream = response.extensions["network_stream"]
        for name in ("read", "write", "aclose", "start_tls"):
            with pytest.raises(AttributeError, match="only get_extra_info"):
                getattr(stream, name)
        assert stream.get_extra_info("socket") is None  # the socket would close the connection under the guard
        assert stream.get_extra_info("client_addr")[0] == "127.0.0.1"
        again = await client.post(servers[0].url + CHAT, json=BODY)  # the connection is the pool's, reused
    assert again.status_code == 200
    assert servers[0].received[0].peer == servers[0].received[1].peer
