"""A stream labelled with another content type than ``text/event-stream`` (a proxy's ``application/json``, a
server's ``application/x-ndjson``, no label at all): the SDKs read its events whatever the label, and so does
the guard. (A plain body where a stream was asked for is still a failure: tests/protocols.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from llmguard_client import Guard, PhaseRecord
from tests.loopback import LoopbackServer, Script

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

LABELS = ["application/json", "application/x-ndjson", "text/plain; charset=utf-8", None]
MESSAGES: Any = [{"role": "user", "content": "hi"}]


def label_streams(servers: list[LoopbackServer], media_type: str | None) -> None:
    for server in servers:
        server.script = Script(tokens=4, stream_media_type=media_type)


async def chat_text(client: Any) -> str:
    events = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    return "".join([chunk.choices[0].delta.content or "" async for chunk in events if chunk.choices])


def judged(record: PhaseRecord) -> tuple[object, ...]:
    return record.status, len(record.attempts), record.chunks, record.completion_tokens, record.first_token is not None


def guarded_openai(server: LoopbackServer, guard: Guard) -> Any:
    """The async openai client through ``guard``, as the plain one (no retry of its own)."""
    return openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="k", max_retries=0, http_client=guard.http_client_for(openai.AsyncOpenAI)
    )


@pytest.mark.parametrize("media_type", LABELS)
async def test_an_openai_stream_with_another_label_reaches_the_sdk_as_without_a_guard(
    servers: list[LoopbackServer], amake_guard: Callable[..., Guard], media_type: str | None
) -> None:
    label_streams(servers, media_type)
    async with openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="k", max_retries=0) as plain:
        expected = await chat_text(plain)
    records: list[PhaseRecord] = []
    guard = amake_guard(on_record=records.append)
    guarded = guarded_openai(servers[0], guard)
    assert await chat_text(guarded) == expected != ""  # before: APIConnectionError (3 x stream_not_sse / json_body)
    label_streams(servers, "text/event-stream")
    assert await chat_text(guarded) == expected
    unlabelled, labelled = records
    assert judged(unlabelled) == judged(labelled)
    assert (unlabelled.status, len(unlabelled.attempts), unlabelled.first_token is not None) == ("ok", 1, True)


async def test_an_anthropic_stream_labelled_json_reaches_the_sdk_as_without_a_guard(
    servers: list[LoopbackServer], amake_guard: Callable[..., Guard]
) -> None:
    label_streams(servers, "application/json")

    async def text(client: Any) -> str:
        async with client.messages.stream(model="m", max_tokens=4, messages=MESSAGES) as stream:
            return "".join([piece async for piece in stream.text_stream])

    async with anthropic.AsyncAnthropic(base_url=servers[0].url, api_key="k", max_retries=0) as plain:
        expected = await text(plain)
    records: list[PhaseRecord] = []
    guard = amake_guard(on_record=records.append)
    guarded = anthropic.AsyncAnthropic(
        base_url=servers[0].url, api_key="k", max_retries=0, http_client=guard.http_client_for(anthropic.AsyncAnthropic)
    )
    assert await text(guarded) == expected != ""
    [record] = records
    assert (record.status, len(record.attempts), record.first_token is not None) == ("ok", 1, True)


def test_a_sync_client_gets_a_stream_labelled_json_whole(
    servers: list[LoopbackServer], make_guard: Callable[..., Guard]
) -> None:
    label_streams(servers, "application/json")
    client = openai.OpenAI(base_url=servers[0].url + "/v1", api_key="k", http_client=make_guard().sync_http_client())
    events = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in events if chunk.choices) != ""


async def test_a_control_calls_unlabelled_stream_is_measured_as_a_guarded_ones(
    servers: list[LoopbackServer], amake_guard: Callable[..., Guard]
) -> None:
    label_streams(servers, None)
    records: list[PhaseRecord] = []
    guard = amake_guard(on_record=records.append, rollout=0.0)
    client = openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="k", http_client=guard.http_client())
    assert await chat_text(client) != ""
    label_streams(servers, "text/event-stream")
    assert await chat_text(client) != ""
    unlabelled, labelled = records
    assert judged(unlabelled) == judged(labelled)
    assert (unlabelled.cohort, unlabelled.status, unlabelled.chunks is not None) == ("control", "ok", True)


async def test_a_non_streaming_answer_labelled_as_a_stream_reaches_the_sdk_as_without_a_guard(
    servers: list[LoopbackServer], amake_guard: Callable[..., Guard]
) -> None:
    """A gateway labels a JSON answer ``text/event-stream``: the SDK parses it as JSON, and the guard reads it so."""
    for server in servers:
        server.script = Script(headers={"content-type": "text/event-stream"})

    async def answer(client: Any) -> str:
        completion = await client.chat.completions.create(model="m", messages=MESSAGES)
        return str(completion.choices[0].message.content)

    async with openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="k", max_retries=0) as plain:
        expected = await answer(plain)
    records: list[PhaseRecord] = []
    guard = amake_guard(on_record=records.append)
    guarded = guarded_openai(servers[0], guard)
    assert await answer(guarded) == expected != ""  # before: APIConnectionError (3 x stream_truncated)
    [record] = records
    assert (record.status, len(record.attempts), record.completion_tokens) == ("ok", 1, 1)
