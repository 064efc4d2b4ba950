"""Each wire protocol through the real SDKs and a real loopback server: the first token is detected at the
first content delta, deltas reach the caller as the server sends them (not at the end), usage is recorded."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from llmguard_client import Guard, PhaseRecord, Tier
from tests.clients import anthropic_on_httpx
from tests.loopback import LoopbackServer, Script, answering_stream, raw_server

GAP = 0.6
"""Seconds between two tokens sent by the server: a delta must reach the caller before the next is sent (a loaded
machine delayed a delta's delivery by a few tenths of a second; a stream held back to its end misses by seconds)."""
TOKENS = 4


def make_guard(servers: list[LoopbackServer], records: list[PhaseRecord], **kwargs: Any) -> Guard:
    # A ttft shorter than the whole answer (3 gaps of 0.6 s): a stream held back to its end would be killed.
    kwargs.setdefault("tiers", {"t": Tier(ttft=1.0, total=10.0, stall=2.0)})
    kwargs.setdefault("hedge", None)
    return Guard(replicas=[s.url for s in servers], instrumentation=None, on_record=records.append, **kwargs)


def assert_streamed_live(arrivals: list[float], server: LoopbackServer, record: PhaseRecord) -> None:
    sent = server.token_times
    assert len(arrivals) == len(sent) == TOKENS
    for i in range(TOKENS - 1):
        assert sent[i] <= arrivals[i] < sent[i + 1], f"delta {i} arrived after the server sent delta {i + 1}"
    assert record.first_token is not None and sent[0] <= record.first_token < sent[1]
    assert record.status == "ok" and record.cause is None


async def openai_chat(oai: openai.AsyncOpenAI) -> AsyncIterator[str]:
    stream = await oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True, stream_options={"include_usage": True}
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            yield chunk.choices[0].delta.content


async def openai_completions(oai: openai.AsyncOpenAI) -> AsyncIterator[str]:
    stream = await oai.completions.create(model="m", prompt="hi", stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            yield chunk.choices[0].text


async def openai_responses(oai: openai.AsyncOpenAI) -> AsyncIterator[str]:
    stream = await oai.responses.create(model="m", input="hi", stream=True)
    async for event in stream:
        if event.type == "response.output_text.delta":
            yield event.delta


@pytest.mark.parametrize(
    ("read", "usage"),
    [(openai_chat, (7, TOKENS)), (openai_completions, (7, TOKENS)), (openai_responses, (7, TOKENS))],
    ids=["chat", "completions", "responses"],
)
async def test_openai_streams_flow_live_and_record_usage(
    servers: list[LoopbackServer], read: Any, usage: tuple[int, int]
) -> None:
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records) as guard:
        oai = openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="sk", http_client=guard.http_client())
        # Warm-up: the SDK builds its pydantic event models lazily, on the first event it parses; for the
        # Responses API's event union that takes seconds on this machine, which would look like buffering.
        _ = [text async for text in read(oai)]
        servers[0].reset()
        servers[0].script = Script(tokens=TOKENS, gap=GAP)
        arrivals, texts = [], []
        async for text in read(oai):
            arrivals.append(time.monotonic())
            texts.append(text)
    assert texts == [f" t{i}" for i in range(TOKENS)]
    record = records[-1]
    assert_streamed_live(arrivals, servers[0], record)
    assert (record.prompt_tokens, record.completion_tokens) == usage
    assert record.chunks is not None and record.chunks >= TOKENS


async def test_anthropic_messages_stream_over_plain_httpx(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=TOKENS, gap=GAP)
    records: list[PhaseRecord] = []
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    arrivals: list[float] = []
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        async with client.stream("POST", servers[0].url + "/v1/messages", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data:") and '"text_delta"' in line:
                    arrivals.append(time.monotonic())
    (record,) = records
    assert_streamed_live(arrivals, servers[0], record)
    assert (record.prompt_tokens, record.completion_tokens) == (7, TOKENS)
    assert record.finish_reasons == ("end_turn",) and record.response_id == "msg_test"


async def test_anthropic_sdk_messages_stream(servers: list[LoopbackServer]) -> None:
    """Through the anthropic SDK where it runs on httpx (< 1.0; 1.x takes only httpx2 clients)."""
    anthropic = anthropic_on_httpx()
    records: list[PhaseRecord] = []
    arrivals: list[float] = []
    async with make_guard(servers[:1], records) as guard:
        client = anthropic.AsyncAnthropic(base_url=servers[0].url, api_key="sk", http_client=guard.http_client())
        for measured in (False, True):  # the first round warms up the SDK's lazily built event models
            servers[0].reset()
            servers[0].script = Script(tokens=TOKENS, gap=GAP if measured else 0.0)
            stream = await client.messages.create(
                model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}], stream=True
            )
            async for event in stream:
                if event.type == "content_block_delta" and measured:
                    arrivals.append(time.monotonic())
    record = records[-1]
    assert_streamed_live(arrivals, servers[0], record)
    assert (record.prompt_tokens, record.completion_tokens) == (7, TOKENS)


async def test_an_unknown_protocol_streams_live_and_is_never_killed_by_ttft(servers: list[LoopbackServer]) -> None:
    """/v1/files is no protocol the guard knows: its first bytes are its first token, the rest flows."""
    servers[0].script = Script(tokens=TOKENS, gap=GAP, stall_before_first=0.1)
    records: list[PhaseRecord] = []
    chunks: list[tuple[float, bytes]] = []
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        body = {"stream": True, "messages": []}
        async with client.stream("POST", servers[0].url + "/v1/files", json=body) as response:
            async for chunk in response.aiter_raw():
                chunks.append((time.monotonic(), chunk))
    (record,) = records
    assert record.status == "ok" and record.chunks is None
    assert record.first_token is not None and record.first_token < servers[0].token_times[0]  # the role chunk
    assert chunks[0][0] < servers[0].token_times[-1]
    assert record.duration is not None and record.duration > 1.2  # longer than ttft (1.0 s), and not killed


async def test_a_non_streaming_call_of_each_protocol_records_its_usage(servers: list[LoopbackServer]) -> None:
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        for path, body in (
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
            ("/v1/completions", {"prompt": "x"}),
            ("/v1/responses", {"input": "x"}),
            ("/v1/messages", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}),
        ):
            response = await client.post(servers[0].url + path, json={"model": "m", **body})
            assert response.status_code == 200, response.text
    assert [(r.status, r.prompt_tokens, r.completion_tokens, r.chunks) for r in records] == [("ok", 7, 1, None)] * 4


async def test_openai_2x_style_close_at_done_is_ok(servers: list[LoopbackServer]) -> None:
    """openai 2.x stops reading at [DONE] and closes the response: a complete answer, recorded ok."""
    servers[0].script = Script(tokens=TOKENS)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
        async with client.stream("POST", servers[0].url + "/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    break
    assert (records[0].status, records[0].cause) == ("ok", None)


async def test_closing_before_the_end_marker_is_abandoned(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=TOKENS, gap=GAP)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
        async with client.stream("POST", servers[0].url + "/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if '" t1"' in line:
                    break
    assert (records[0].status, records[0].cause) == ("abandoned", "closed_by_caller")


def test_httpx_is_the_transport_these_tests_use() -> None:
    assert httpx.__version__.startswith("0.")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"model": "m", "input": "hi", "stream": True}),
        (
            "/v1/messages",
            {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], "stream": True},
        ),
    ],
    ids=["responses", "messages"],
)
async def test_the_servers_acceptance_is_a_phase_before_the_first_token(
    servers: list[LoopbackServer], path: str, body: dict[str, Any]
) -> None:
    """``response.created`` / ``message_start`` come at once, the first token after a stall: the record's
    ``accepted`` is stamped when the first came, never taken for the first token."""
    servers[0].script = Script(tokens=2, stall_before_first=0.3)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        async with client.stream("POST", servers[0].url + path, json=body) as response:
            await response.aread()
    (record,) = records
    (attempt,) = record.attempts
    assert record.status == "ok" and record.accepted == attempt.accepted
    assert record.headers is not None and record.accepted is not None and record.first_token is not None
    assert record.headers <= record.accepted < record.first_token  # the stall lies between the two
    assert record.to_dict()["accepted"] == record.accepted


async def test_a_chat_stream_has_no_acceptance_phase(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=2)
    records: list[PhaseRecord] = []
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        async with client.stream("POST", servers[0].url + "/v1/chat/completions", json=body) as response:
            await response.aread()
    (record,) = records
    assert record.status == "ok" and record.first_token is not None and record.accepted is None


def responses_body(deltas: list[str]) -> bytes:
    """A Responses stream as a proxy may send it: its events, then a ``data: [DONE]`` line."""
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "resp_1", "object": "response", "status": "in_progress"}}
    ]
    events += [{"type": "response.output_text.delta", "delta": d, "item_id": "m", "output_index": 0} for d in deltas]
    final = {"id": "resp_1", "object": "response", "created_at": 0, "model": "m", "status": "completed",
             "output": [], "parallel_tool_calls": False, "tool_choice": "auto", "tools": []}  # fmt: skip
    events.append({"type": "response.completed", "response": final})
    wire = b"".join(b"event: %s\ndata: %s\n\n" % (e["type"].encode(), json.dumps(e).encode()) for e in events)
    return wire + b"data: [DONE]\n\n"


@pytest.mark.parametrize("deltas", [["a", "b"], []], ids=["answer", "empty_answer"])
async def test_a_responses_stream_ended_by_done_is_read_as_the_sdk_reads_it(deltas: list[str]) -> None:
    body = responses_body(deltas)

    answer = answering_stream(body)

    records: list[PhaseRecord] = []
    async with raw_server(answer) as url, Guard([url], instrumentation=None, on_record=records.append) as guard:
        seen = []
        for http_client in (None, guard.http_client_for(openai.AsyncOpenAI)):
            kwargs: dict[str, Any] = {} if http_client is None else {"http_client": http_client}
            oai = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0, **kwargs)
            stream = await oai.responses.create(model="m", input="hi", stream=True)
            seen.append([event.type async for event in stream])
            await oai.close()
    plain, guarded = seen
    assert guarded == plain and plain[-1] == "response.completed"
    assert [r.status for r in records] == ["ok"] and len(records[0].attempts) == 1
