"""Failures inside HTTP 200 answers, against real loopback servers, through plain httpx and the openai SDK.

Before the first content token a failure is a failed attempt: the call goes on to another replica and
nothing of the failed answer reaches the caller. After it, the failure is the caller's: a typed error from
the body iterator, and the record says ``error`` with the failure's cause.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import openai
import pytest

from llmguard_client import (
    AllAttemptsFailed,
    Guard,
    GuardStreamError,
    PhaseRecord,
    RetryPolicy,
    StreamTruncated,
    Tier,
    UpstreamStreamError,
)
from tests.clients import anthropic_on_httpx
from tests.loopback import FAILED_RESPONSE, VLLM_BUSY, LoopbackServer, Script, answering_stream, raw_server

TTFT = 1.0
MESSAGES = [{"role": "user", "content": "x"}]
PATHS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": MESSAGES}),
    "completions": ("/v1/completions", {"prompt": "x"}),
    "responses": ("/v1/responses", {"input": "x"}),
    "messages": ("/v1/messages", {"messages": MESSAGES, "max_tokens": 8}),
}


def make_guard(servers: list[LoopbackServer], records: list[PhaseRecord], **kwargs: Any) -> Guard:
    kwargs.setdefault("tiers", {"t": Tier(ttft=TTFT, total=5.0, stall=1.0)})
    kwargs.setdefault("hedge", None)
    return Guard(replicas=[s.url for s in servers], instrumentation=None, on_record=records.append, **kwargs)


async def stream_raw(client: httpx.AsyncClient, url: str, protocol: str = "chat") -> bytes:
    path, body = PATHS[protocol]
    async with client.stream("POST", url + path, json={"model": "m", "stream": True, **body}) as response:
        assert response.status_code == 200
        return b"".join([chunk async for chunk in response.aiter_raw()])


async def read_chat_stream(guard: Guard, url: str, texts: list[str]) -> None:
    """One streamed chat completion through the openai SDK on ``guard``, each chunk's text appended to ``texts``."""
    oai = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk", http_client=guard.http_client())
    stream = await oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    try:
        async for chunk in stream:
            texts.append(chunk.choices[0].delta.content or "")
    finally:
        await stream.close()  # openai 1.x leaves the response open when it raises; 2.x and 3.x close it


async def responses_events(url: str, http_client: httpx.AsyncClient | None) -> list[str]:
    """The event types the openai SDK yields for one streamed Responses API call to ``url``."""
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk", http_client=http_client) as oai:
        stream = await oai.responses.create(model="m", input="x", stream=True)
        return [event.type async for event in stream]


# --- before the first token: another replica answers ------------------------------------------------------

BEFORE = {
    "vllm_overload": (Script(error_at=0), "stream_error_event"),
    "error_event_500": (Script(error_at=0, error={"message": "boom", "type": "x", "code": 500}), "stream_error_event"),
    "malformed": (Script(malformed_at=0), "stream_malformed"),
    "json_body": (Script(json_for_stream=True), "stream_json_body"),
    "eof": (Script(truncate_at=0), "stream_truncated"),
}


@pytest.mark.parametrize("protocol", ["chat", "completions", "responses", "messages"])
@pytest.mark.parametrize("case", list(BEFORE))
async def test_a_failure_before_the_first_token_is_retried_on_another_replica(
    servers: list[LoopbackServer], protocol: str, case: str
) -> None:
    script, cause = BEFORE[case]
    servers[0].script = script
    servers[1].script = Script(tokens=3)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard, guard.http_client() as client:
        raw = await stream_raw(client, servers[0].url, protocol)
    assert len(servers[0].received) == 1 and len(servers[1].received) == 1  # the server saw the failed attempt
    assert servers[1].completed == 1
    for leak in (b"busy", b"boom", b"not json", b"hello", b"event: error", b'{"error": {'):
        assert leak not in raw  # nothing of the failed answer reached the caller
    (record,) = records
    failed, won = record.attempts
    assert (failed.replica, failed.outcome, failed.error, failed.status_code) == (servers[0].url, "failed", cause, 200)
    assert failed.first_token is None
    assert (won.kind, won.replica, won.outcome) == ("retry", servers[1].url, "won")
    assert record.status == "ok" and record.replica == servers[1].url


async def test_in_stream_overload_cools_the_replica_without_retry_after(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(error_at=0)
    records: list[PhaseRecord] = []
    retry = RetryPolicy(overload_cooldown=7.0)  # outlasts the four calls below however busy the machine is
    async with make_guard(servers[:2], records, retry=retry) as guard, guard.http_client() as client:
        before = time.monotonic()
        await stream_raw(client, servers[0].url)
        cooling_until = guard._replica_set.states[0].cooling_until  # the replica's cool-down (no public view)
        for _ in range(3):  # new calls go to the ready replica while the overloaded one cools down
            await stream_raw(client, servers[0].url)
    assert before + 7.0 <= cooling_until <= time.monotonic() + 7.0
    assert len(servers[0].received) == 1 and len(servers[1].received) == 4
    assert records[0].attempts[0].retry_after is None


async def test_the_connection_of_an_in_stream_error_is_reused(servers: list[LoopbackServer]) -> None:
    """vLLM ends the body right after its error event: the guard reads to that end, so the connection goes
    back to the pool instead of a new TCP handshake with the replica that just said it is overloaded."""
    servers[0].script = Script(error_at=0)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records, retry=None) as guard, guard.http_client() as client:
        for _ in range(3):
            path, body = PATHS["chat"]
            response = await client.post(servers[0].url + path, json={"model": "m", "stream": True, **body})
            assert response.status_code == 503
    peers = [r.peer for r in servers[0].received]
    assert len(peers) == 3 and len(set(peers)) == 1


async def test_openai_caller_gets_the_other_replicas_answer(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(error_at=0)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard:
        oai = openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="sk", http_client=guard.http_client())
        stream = await oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == " t0 t1 t2 t3 t4"
    assert [a.outcome for a in records[0].attempts] == ["failed", "won"] and records[0].status == "ok"


# --- every replica failing: a typed error within the deadline ---------------------------------------------


async def test_every_replica_overloaded_in_stream_gives_openai_a_503_at_once(servers: list[LoopbackServer]) -> None:
    for server in servers[:2]:
        server.script = Script(error_at=0)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard:
        oai = openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="sk", http_client=guard.http_client())
        started = time.monotonic()
        with pytest.raises(openai.InternalServerError) as caught:
            await oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        elapsed = time.monotonic() - started
    assert elapsed < TTFT
    error = caught.value
    assert error.status_code == 503 and "currently busy" in error.message
    assert error.response.headers["x-llmguard-stream-failure"] == "error_event"
    assert error.response.headers["x-should-retry"] == "false"  # openai does not multiply the attempts
    assert len(servers[0].received) + len(servers[1].received) == 2
    (record,) = records
    assert record.status == "rejected" and record.cause == "all_replicas_cooling" and record.http_status == 503


@pytest.mark.parametrize("script", [Script(truncate_at=0), Script(malformed_at=0)], ids=["eof", "malformed"])
async def test_every_replica_failing_without_a_status_raises_all_attempts_failed(
    servers: list[LoopbackServer], script: Script
) -> None:
    for server in servers[:2]:
        server.script = script
    records: list[PhaseRecord] = []
    retry = RetryPolicy(max_attempts=2, backoff_initial=0.01)
    async with make_guard(servers[:2], records, retry=retry) as guard, guard.http_client() as client:
        started = time.monotonic()
        with pytest.raises(AllAttemptsFailed) as caught:
            await stream_raw(client, servers[0].url)
        elapsed = time.monotonic() - started
    assert elapsed < TTFT
    assert isinstance(caught.value.__cause__, GuardStreamError)
    assert len(records[0].attempts) == 2 and all(a.outcome == "failed" for a in records[0].attempts)


# --- after the first token: the caller's error ------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["chat", "completions", "messages"])
async def test_an_error_event_after_the_first_token_raises_upstream_stream_error(
    servers: list[LoopbackServer], protocol: str
) -> None:
    servers[0].script = Script(tokens=5, error_at=2)
    records: list[PhaseRecord] = []
    received: list[bytes] = []
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        path, body = PATHS[protocol]
        with pytest.raises(UpstreamStreamError) as caught:
            async with client.stream("POST", servers[0].url + path, json={"model": "m", "stream": True, **body}) as r:
                async for chunk in r.aiter_raw():
                    received.append(chunk)
    raw = b"".join(received)
    assert b" t0" in raw and b" t1" in raw and b" t2" not in raw  # the tokens before the error were delivered
    assert caught.value.cause == "stream_error_event" and caught.value.overload
    assert isinstance(caught.value, httpx.RemoteProtocolError)
    assert "after the first token" in str(caught.value)
    (record,) = records
    assert (record.status, record.cause) == ("error", "stream_error_event")
    assert len(record.attempts) == 1  # never retried after the first token


async def test_a_call_ends_when_the_chunk_carrying_its_error_event_is_handed_over(
    servers: list[LoopbackServer],
) -> None:
    """An SDK raises at the error event itself and may never read again (openai 1.x leaves that stream open):
    the call is recorded and its connection closed as the chunk is handed over; the next read still raises."""
    servers[0].script = Script(tokens=5, error_at=2)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        path, body = PATHS["chat"]
        async with client.stream("POST", servers[0].url + path, json={"model": "m", "stream": True, **body}) as r:
            chunks = r.aiter_raw()
            while b'"error"' not in await chunks.__anext__():
                pass
            (record,) = records  # before any further read
            assert (record.status, record.cause) == ("error", "stream_error_event")
            with pytest.raises(UpstreamStreamError):
                await chunks.__anext__()
    assert len(records) == 1


async def test_a_responses_error_after_the_first_token_is_an_event_the_caller_reads_past(
    servers: list[LoopbackServer],
) -> None:
    """The Responses API's ``error`` / ``response.failed`` are events the openai SDK yields and reads past: the
    guarded SDK yields the same events as the plain one, raises nothing, and the record says the call failed."""
    servers[0].script = Script(tokens=5, error_at=2)
    records: list[PhaseRecord] = []

    plain = await responses_events(servers[0].url, None)
    async with make_guard(servers[:1], records) as guard:
        guarded = await responses_events(servers[0].url, guard.http_client_for(openai.AsyncOpenAI))
    assert guarded == plain and plain[-1] == "error" and plain.count("response.output_text.delta") == 2
    (record,) = records
    assert (record.status, record.cause, len(record.attempts)) == ("error", "stream_error_event", 1)


@pytest.mark.parametrize(
    ("code", "requests", "guard"),
    [
        (500, 3, {}),
        ("invalid_prompt", 1, {}),
        (500, 1, {"retry": RetryPolicy(mode="cooperative")}),
        (500, 3, {"open_after_error": 30.0}),
    ],
    ids=["retried_server_error", "invalid_prompt", "cooperative", "body_held_open"],
)
async def test_a_responses_error_before_the_first_token_reaches_the_caller_as_the_event_it_was(
    servers: list[LoopbackServer], code: object, requests: int, guard: dict[str, Any]
) -> None:
    """When no attempt gets past a Responses API ``error`` event (a server error on every attempt, or a prompt
    error that is not retried), the guarded SDK yields the events the plain one does, not an HTTP error: also in
    cooperative mode (the openai SDK retries no 200), and from a server that holds the body open after the
    event (the caller gets the events up to it; before, a 500)."""
    held = guard.pop("open_after_error", 0.0)
    for server in servers[:2]:
        server.script = Script(error_at=0, error={"message": "boom", "type": "x", "code": code})
    records: list[PhaseRecord] = []

    plain = await responses_events(servers[0].url, None)  # the same events, the body ended (plain would wait)
    sent_plain = sum(len(server.received) for server in servers[:2])
    for server in servers[:2]:
        server.script.open_after_error = held
    async with make_guard(servers[:2], records, **guard) as guarded_by:
        guarded = await responses_events(servers[0].url, guarded_by.http_client_for(openai.AsyncOpenAI))
    assert guarded == plain and plain[-1] == "error" and sent_plain == 1
    assert sum(len(server.received) for server in servers[:2]) - sent_plain == requests
    (record,) = records
    assert (record.status, record.cause, record.http_status) == ("error", "stream_error_event", 200)
    assert [a.outcome for a in record.attempts] == ["failed"] * requests


@pytest.mark.parametrize("rollout", [1.0, 0.0], ids=["guarded", "control"])
async def test_a_failed_response_is_handed_over_once_and_recorded_as_an_error(
    servers: list[LoopbackServer], rollout: float
) -> None:
    """A non-streamed Responses API answer with ``status: "failed"``: the SDK returns it (no exception), after one
    request, as without the guard; the record says the call failed, in either cohort."""
    servers[0].script = Script(body=FAILED_RESPONSE)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records, rollout=rollout) as guard:
        async with openai.AsyncOpenAI(
            base_url=servers[0].url + "/v1", api_key="sk", http_client=guard.http_client_for(openai.AsyncOpenAI)
        ) as oai:
            answer = await oai.responses.create(model="m", input="x")
    assert answer.status == "failed" and len(servers[0].received) == 1
    (record,) = records
    assert (record.status, record.cause, [a.outcome for a in record.attempts]) == ("error", "answer_failed", ["won"])


CHAT_ANSWER = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": "stop"}],
    }
).encode()
NOT_JSON = {
    "truncated": CHAT_ANSWER[: len(CHAT_ANSWER) // 2],
    "invalid_utf8": CHAT_ANSWER.replace(b"Hel", b"H\xff\xfel"),
}


@pytest.mark.parametrize("rollout", [1.0, 0.0], ids=["guarded", "control"])
@pytest.mark.parametrize("body", list(NOT_JSON))
async def test_a_non_streamed_answer_that_is_not_json_is_handed_over_once_and_recorded_as_an_error(
    servers: list[LoopbackServer], body: str, rollout: float
) -> None:
    """A 200 whose body is cut short or not UTF-8: the SDK raises its own error at it after one request, as
    without the guard (before: three requests, each a full generation, then APIConnectionError naming
    ``stream_malformed``); the record says the call failed, and why."""
    servers[0].script = Script(body=NOT_JSON[body], headers={"content-type": "application/json"})
    async with openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="sk") as plain:
        with pytest.raises(ValueError) as without:  # JSONDecodeError, UnicodeDecodeError
            await plain.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert len(servers[0].received) == 1
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records, rollout=rollout) as guard:
        async with openai.AsyncOpenAI(
            base_url=servers[0].url + "/v1", api_key="sk", http_client=guard.http_client_for(openai.AsyncOpenAI)
        ) as oai:
            with pytest.raises(ValueError) as guarded:
                await oai.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert type(guarded.value) is type(without.value) and len(servers[0].received) == 2
    (record,) = records
    assert (record.status, record.cause, [a.outcome for a in record.attempts]) == ("error", "malformed_body", ["won"])


@pytest.mark.parametrize("protocol", ["chat", "completions", "responses", "messages"])
async def test_eof_after_the_first_token_raises_stream_truncated(servers: list[LoopbackServer], protocol: str) -> None:
    servers[0].script = Script(tokens=5, truncate_at=2)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        with pytest.raises(StreamTruncated) as caught:
            await stream_raw(client, servers[0].url, protocol)
    assert caught.value.cause == "stream_truncated" and isinstance(caught.value, httpx.RemoteProtocolError)
    assert (records[0].status, records[0].cause) == ("error", "stream_truncated")


async def test_openai_sees_the_error_event_after_the_first_token_and_the_record_says_so(
    servers: list[LoopbackServer],
) -> None:
    servers[0].script = Script(tokens=5, error_at=2)
    records: list[PhaseRecord] = []
    texts: list[str] = []
    async with make_guard(servers[:1], records) as guard:
        with pytest.raises(openai.APIError) as caught:
            await read_chat_stream(guard, servers[0].url, texts)
    assert "currently busy" in caught.value.message  # the SDK's own error from the event, as without the guard
    assert "".join(texts) == " t0 t1"
    assert (records[0].status, records[0].cause) == ("error", "stream_error_event")


async def test_openai_sees_a_truncated_stream_as_an_error_not_a_short_answer(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=5, truncate_at=2)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records) as guard:
        oai = openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="sk", http_client=guard.http_client())
        stream = await oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        with pytest.raises(Exception) as caught:
            async for _ in stream:
                pass
    error = caught.value
    assert isinstance(error, StreamTruncated) or isinstance(error.__cause__, StreamTruncated), repr(error)
    assert (records[0].status, records[0].cause) == ("error", "stream_truncated")


async def test_an_error_in_the_same_chunk_as_the_first_token_is_raised_after_it() -> None:
    """The first token and the error event arrive in one read (written in one piece, as an engine failing
    right after its first token may send them): the token is delivered, then the error raised, and the
    generation is not sent again."""
    token = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}}]}
    error = {"error": {"message": "boom", "type": "internal_error", "code": 500}}
    answer = answering_stream(b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in (token, error)))
    requests = 0

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        requests += 1
        await answer(reader, writer)

    records: list[PhaseRecord] = []
    texts: list[str] = []
    async with raw_server(counted) as url, Guard([url], instrumentation=None, on_record=records.append) as guard:
        with pytest.raises(openai.APIError) as caught:
            await read_chat_stream(guard, url, texts)
    assert caught.value.message == "boom"  # the SDK's own error from the event, as without the guard
    assert texts == ["hi"] and requests == 1
    (record,) = records
    assert (record.status, record.cause, len(record.attempts)) == ("error", "stream_error_event", 1)


# --- the control cohort sees the server's bytes untouched ---------------------------------------------------


async def test_the_control_cohort_gets_the_error_untouched_and_it_is_recorded(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(error_at=0)
    servers[1].script = Script()
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records, rollout=0.0) as guard, guard.http_client() as client:
        raw = await stream_raw(client, servers[0].url)
        assert b"currently busy" in raw or b" t0" in raw
    (record,) = records
    assert record.cohort == "control" and len(record.attempts) == 1
    if b"currently busy" in raw:
        assert (record.status, record.cause) == ("error", "stream_error_event")
    else:
        assert record.status == "ok"


def test_vllm_busy_is_the_shape_vllm_sends() -> None:
    assert VLLM_BUSY["code"] == 503 and VLLM_BUSY["type"] == "Service Unavailable"


# --- the anthropic SDK (where it runs on httpx, < 1.0) --------------------------------------------------------


async def test_anthropic_overloaded_error_before_the_first_token_goes_elsewhere(servers: list[LoopbackServer]) -> None:
    anthropic = anthropic_on_httpx()
    servers[0].script = Script(error_at=0)  # event: error, overloaded_error
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard:
        client = anthropic.AsyncAnthropic(base_url=servers[0].url, api_key="sk", http_client=guard.http_client())
        stream = await client.messages.create(model="m", max_tokens=8, messages=MESSAGES, stream=True)
        text = "".join([e.delta.text async for e in stream if e.type == "content_block_delta"])
    assert text == " t0 t1 t2 t3 t4"
    assert [a.error for a in records[0].attempts] == ["stream_error_event", None] and records[0].status == "ok"


async def test_anthropic_every_replica_overloaded_is_a_529_at_once(servers: list[LoopbackServer]) -> None:
    anthropic = anthropic_on_httpx()
    for server in servers[:2]:
        server.script = Script(error_at=0)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard:
        client = anthropic.AsyncAnthropic(base_url=servers[0].url, api_key="sk", http_client=guard.http_client())
        started = time.monotonic()
        with pytest.raises(anthropic.APIStatusError) as caught:
            await client.messages.create(model="m", max_tokens=8, messages=MESSAGES, stream=True)
        assert time.monotonic() - started < TTFT
    assert caught.value.status_code == 529 and "currently busy" in str(caught.value)
    assert len(servers[0].received) + len(servers[1].received) == 2  # the SDK did not retry on top
