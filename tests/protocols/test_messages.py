"""MessagesReader: Anthropic Messages events, as Anthropic and vLLM 0.32 send them."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from llmguard_client import Guard, PhaseRecord
from llmguard_client.protocols.body import BodyReader
from llmguard_client.protocols.messages import MessagesReader, absorb_message_body
from llmguard_tools.sim.wire_messages import MessagesWire


def ev(obj: dict[str, Any], name: str | None = None) -> bytes:
    return b"event: " + (name or obj["type"]).encode() + b"\ndata: " + json.dumps(obj).encode() + b"\n\n"


START = ev(
    {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "tiny-llama",
            "stop_reason": None,
            "usage": {"input_tokens": 20, "output_tokens": 0},
        },
    }
)
BLOCK = ev({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
PING = ev({"type": "ping"})


def delta(**d: Any) -> bytes:
    return ev({"type": "content_block_delta", "index": 0, "delta": d})


STOP_BLOCK = ev({"type": "content_block_stop", "index": 0})
MESSAGE_DELTA = ev(
    {
        "type": "message_delta",
        "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
        "usage": {"input_tokens": 20, "output_tokens": 3},
    }
)
STOP = ev({"type": "message_stop"})


def feed(*parts: bytes) -> tuple[MessagesReader, list[bool]]:
    reader = MessagesReader()
    return reader, [reader.feed(p) for p in parts]


def test_message_start_is_acceptance_not_a_token() -> None:
    reader, results = feed(START, BLOCK, PING)
    assert reader.accepted and results == [False, False, False] and not reader.first_token
    assert not feed(PING)[0].accepted


def test_a_whole_stream() -> None:
    text = delta(type="text_delta", text="tain")
    reader, results = feed(START, BLOCK, PING, text, text, STOP_BLOCK, MESSAGE_DELTA, STOP)
    assert results == [False, False, False, True, True, True, True, True]
    assert reader.complete and reader.end_of_body() is None
    facts = reader.facts
    assert (facts.prompt_tokens, facts.completion_tokens, facts.finish_reasons) == (20, 3, ["max_tokens"])
    assert (facts.response_id, facts.model) == ("msg_1", "tiny-llama")
    assert reader.chunks == 5


@pytest.mark.parametrize(
    "d",
    [{"type": "input_json_delta", "partial_json": '{"a'}, {"type": "thinking_delta", "thinking": "hmm"}],
    ids=["tool_input", "thinking"],
)
def test_tool_input_and_thinking_deltas_are_content(d: dict[str, Any]) -> None:
    _, results = feed(START, delta(**d))
    assert results == [False, True]


def test_empty_deltas_and_signatures_are_not_content() -> None:
    reader, results = feed(
        START, delta(type="input_json_delta", partial_json=""), delta(type="signature_delta", signature="x")
    )
    assert results == [False, False, False] and reader.failure is None


def test_overloaded_error_event() -> None:
    error = ev({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    reader, _ = feed(START, error)
    failure = reader.failure
    assert failure is not None and (failure.status, failure.code, failure.overload) == (529, "overloaded_error", True)


def test_vllm_internal_error_event() -> None:
    """vLLM 0.32's /v1/messages under a queue-overflow race (the 503 is buried in a validation message)."""
    raw = (
        b'event: error\ndata: {"type":"error","error":{"type":"internal_error","message":"2 validation errors for '
        b"ChatCompletionStreamResponse ... 'code': 503}}\"}}\n\n"
    )
    reader, _ = feed(raw)
    assert reader.failure is not None and reader.failure.status == 500 and not reader.failure.overload


def test_message_starts_placeholder_output_count_is_not_taken_for_a_stream_cut_before_its_count() -> None:
    """Anthropic's ``message_start`` carries ``output_tokens: 1`` before any output: a stream cut after some text
    has no completion count (it recorded 1), as a cut Chat Completions stream; the whole stream's is the
    ``message_delta``'s."""
    start = START.replace(b'"output_tokens": 0', b'"output_tokens": 1')
    text = delta(type="text_delta", text="tain")
    cut, _ = feed(start, BLOCK, text, text, text)
    assert (cut.facts.prompt_tokens, cut.facts.completion_tokens) == (20, None)
    whole, _ = feed(start, BLOCK, text, STOP_BLOCK, MESSAGE_DELTA, STOP)
    assert (whole.facts.prompt_tokens, whole.facts.completion_tokens) == (20, 3)


def test_an_error_after_the_first_token() -> None:
    error = ev({"type": "error", "error": {"type": "api_error", "message": "boom"}})
    reader, _ = feed(START, delta(type="text_delta", text="x"), error)
    assert reader.first_token and reader.failure is not None and reader.failure.status == 500


def test_eof_before_a_stop_reason_is_truncation() -> None:
    reader, _ = feed(START, delta(type="text_delta", text="x"), STOP_BLOCK)
    failure = reader.end_of_body()
    assert failure is not None and failure.kind == "truncated" and "message_stop" in failure.message
    reader, _ = feed(START, delta(type="text_delta", text="x"), ev({"type": "message_delta", "delta": {}}))
    assert not reader.complete and reader.end_of_body() is not None  # a message_delta without a stop_reason


def test_a_message_delta_with_a_stop_reason_ends_the_answer_without_message_stop() -> None:
    """Some proxies that translate to Anthropic's format end the stream after the ``message_delta`` that carries
    the stop reason, without ``message_stop``: the answer is whole (the anthropic SDK hands it over), not cut."""
    reader, _ = feed(START, BLOCK, delta(type="text_delta", text="x"), STOP_BLOCK, MESSAGE_DELTA)
    assert reader.complete and reader.end_of_body() is None
    assert reader.facts.finish_reasons == ["max_tokens"] and reader.facts.completion_tokens == 3


async def test_a_stream_ending_at_its_stop_reason_reaches_the_anthropic_sdk_as_without_a_guard() -> None:
    """Before: the whole text reached the caller, then StreamTruncated (the plain SDK returned the message)."""
    anthropic = pytest.importorskip("anthropic")
    body = START + BLOCK + delta(type="text_delta", text="Hello") + STOP_BLOCK + MESSAGE_DELTA

    def replica(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    records: list[PhaseRecord] = []
    mock = httpx.MockTransport(replica)
    async with Guard(
        ["http://r.test"], instrumentation=None, on_record=records.append, transport_factory=lambda _: mock
    ) as guard:
        client = anthropic.AsyncAnthropic(
            base_url="http://r.test", api_key="k", http_client=guard.http_client_for(anthropic.AsyncAnthropic)
        )
        async with client.messages.stream(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]) as s:
            text = "".join([piece async for piece in s.text_stream])
            message = await s.get_final_message()
    assert (text, message.stop_reason) == ("Hello", "max_tokens")
    ((record,)) = records
    assert (record.status, record.cause, len(record.attempts)) == ("ok", None, 1)


def test_the_sim_wire_round_trips() -> None:
    wire = MessagesWire("abc", "sim-model", 9)
    reader, results = feed(wire.opening(), wire.token(), wire.closing("length", 9, 1))
    assert results == [False, True, True]
    assert reader.complete and (reader.facts.prompt_tokens, reader.facts.completion_tokens) == (9, 1)
    assert reader.facts.finish_reasons == ["max_tokens"]
    body = BodyReader(absorb_message_body)
    body.feed(wire.complete(4, "stop", 9))
    assert body.end_of_body() is None and body.facts.finish_reasons == ["end_turn"]
    error_reader, _ = feed(wire.error_event("busy", "Service Unavailable", 503))
    assert error_reader.failure is not None and error_reader.failure.overload
