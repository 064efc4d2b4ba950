"""The error answer the guard builds from a 200 whose error came inside its body (an in-stream error event, a
non-streamed error object), against real loopback servers: it keeps the server's headers that describe the request
(its id, its rate limits), so the SDK's ``request_id`` is the one a plain client would report, and drops those that
framed the server's own body."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmguard_client import Guard, PhaseRecord, Tier
from tests.edges.conftest import pools
from tests.loopback import LoopbackServer, Script

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "x"}]
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


def server_headers(server: LoopbackServer) -> dict[str, str]:
    return {
        "x-request-id": f"req-{server.port}",
        "request-id": f"req-{server.port}",
        "x-ratelimit-remaining-requests": "9",
        "anthropic-ratelimit-requests-remaining": "9",
    }


def make_guard(servers: list[LoopbackServer], records: list[PhaseRecord]) -> Guard:
    return Guard(
        [s.url for s in servers],
        tiers={"t": Tier(ttft=2.0, total=10.0, stall=2.0)},
        instrumentation=None,
        transport_factory=pools,
        hedge=None,
        on_record=records.append,
    )


def last_replicas_id(records: list[PhaseRecord], servers: list[LoopbackServer]) -> str:
    (record,) = records
    (server,) = [s for s in servers if s.url == record.attempts[-1].replica]
    return f"req-{server.port}"


@pytest.mark.parametrize("stream", [True, False], ids=["in-stream error event", "error object"])
async def test_openai_gets_the_request_id_of_the_last_answer(servers: list[LoopbackServer], stream: bool) -> None:
    for server in servers[:2]:
        headers = server_headers(server)
        server.script = (
            Script(error_at=0, headers=headers)
            if stream
            else Script(body={"error": dict(OVERLOADED["error"], code=503)}, headers=headers)
        )
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard:
        client = openai.AsyncOpenAI(
            base_url=servers[0].url + "/v1",
            api_key="k",
            max_retries=0,
            http_client=guard.http_client_for(openai.AsyncOpenAI),
        )
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES, stream=stream)  # type: ignore[call-overload]
    error = caught.value
    assert error.status_code == 503 and error.request_id == last_replicas_id(records, servers)
    assert error.response.headers["x-ratelimit-remaining-requests"] == "9"
    assert error.response.headers["x-llmguard-stream-failure"] == ("error_event" if stream else "error_body")


async def test_anthropic_gets_the_request_id_of_the_last_in_stream_error(servers: list[LoopbackServer]) -> None:
    anthropic = pytest.importorskip("anthropic")
    for server in servers[:2]:
        server.script = Script(error_at=0, headers=server_headers(server))
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard:
        http_client: Any = guard.http_client_for(anthropic.AsyncAnthropic)
        client = anthropic.AsyncAnthropic(base_url=servers[0].url, api_key="k", max_retries=0, http_client=http_client)
        with pytest.raises(anthropic.APIStatusError) as caught:
            await client.messages.create(model="m", max_tokens=8, messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    error = caught.value
    assert error.status_code == 529 and error.request_id == last_replicas_id(records, servers)
    assert error.response.headers["anthropic-ratelimit-requests-remaining"] == "9"


async def test_the_built_answer_has_its_own_framing_not_the_streams(servers: list[LoopbackServer]) -> None:
    for server in servers[:2]:
        server.script = Script(error_at=0, headers=server_headers(server))
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard, guard.http_client() as client:
        body = {"model": "m", "messages": MESSAGES, "stream": True}
        response = await client.post(servers[0].url + "/v1/chat/completions", json=body)
    assert response.status_code == 503 and response.headers["x-request-id"] == last_replicas_id(records, servers)
    assert response.headers["content-type"] == "application/json"  # not the stream's text/event-stream
    assert "transfer-encoding" not in response.headers  # the stream came chunked; the built body has a length
    assert int(response.headers["content-length"]) == len(response.content)
    assert json.loads(response.content)["error"]["code"] == 503


async def test_what_the_server_said_of_retrying_its_200_does_not_decide_the_retry_of_the_error_in_it(
    servers: list[LoopbackServer],
) -> None:
    """A 200 marked ``x-should-retry: false`` (and a Retry-After) whose stream then carries an overload error: no SDK
    reads those headers on a 200, so the guard's retry of the error goes on to the other replica, which serves it."""
    failing, serving = servers[:2]
    failing.script = Script(error_at=0, headers={"x-should-retry": "false", "retry-after": "20"})
    records: list[PhaseRecord] = []
    async with make_guard([failing, serving], records) as guard, guard.http_client() as client:
        body = {"model": "m", "messages": MESSAGES, "stream": True}
        for _ in range(4):  # whichever replica a call tries first
            response = await client.post(failing.url + "/v1/chat/completions", json=body)
            assert response.status_code == 200 and b"[DONE]" in response.content
    assert any(len(record.attempts) == 2 for record in records)  # at least one call met the error, then retried
