"""ResponsesReader: Responses API events, from vLLM 0.32's own stream shapes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmguard_client.protocols.body import BodyReader
from llmguard_client.protocols.responses import ResponsesReader, absorb_response
from llmguard_tools.sim.wire_responses import ResponsesWire
from tests.loopback import FAILED_RESPONSE


def ev(obj: dict[str, Any]) -> bytes:
    return b"event: " + str(obj["type"]).encode() + b"\ndata: " + json.dumps(obj).encode() + b"\n\n"


def response(status: str, **extra: Any) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "model": "tiny-llama", "status": status, "output": [], **extra}


CREATED = ev({"type": "response.created", "sequence_number": 0, "response": response("in_progress", usage=None)})
ITEM = ev({"type": "response.output_item.added", "output_index": 0, "item": {"type": "message", "content": []}})
PART = ev({"type": "response.content_part.added", "part": {"type": "output_text", "text": ""}})
DELTA = ev({"type": "response.output_text.delta", "delta": "dd", "item_id": "msg_1", "output_index": 0})
EMPTY_DELTA = ev({"type": "response.output_text.delta", "delta": ""})
DONE_TEXT = ev({"type": "response.output_text.done", "text": "ddamedrg"})
USAGE = {"input_tokens": 20, "output_tokens": 3, "total_tokens": 23}
# vLLM 0.32 ends a max_output_tokens-limited answer with response.completed + incomplete_details.
COMPLETED = ev(
    {
        "type": "response.completed",
        "response": response("completed", usage=USAGE, incomplete_details={"reason": "max_output_tokens"}),
    }
)


def feed(*parts: bytes) -> tuple[ResponsesReader, list[bool]]:
    reader = ResponsesReader()
    return reader, [reader.feed(p) for p in parts]


def test_response_created_is_acceptance_not_a_token() -> None:
    reader, results = feed(CREATED, ITEM, PART)
    assert reader.accepted and results == [False, False, False] and not reader.first_token
    assert not ResponsesReader().accepted  # nothing read yet


def test_first_token_is_the_first_non_empty_delta() -> None:
    reader, results = feed(CREATED, ITEM, PART, EMPTY_DELTA, DELTA, DELTA)
    assert results == [False, False, False, False, True, True]
    assert reader.chunks == 2


@pytest.mark.parametrize(
    "kind",
    [
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
    ],
)
def test_every_kind_of_delta_is_content(kind: str) -> None:
    _, results = feed(CREATED, ev({"type": kind, "delta": "x"}))
    assert results == [False, True]


def test_a_generated_images_first_partial_image_is_its_first_token() -> None:
    """An answer that is an image has no delta: before, the guard held its partial images back until the end."""
    generating = ev({"type": "response.image_generation_call.generating", "output_index": 0, "item_id": "ig_1"})
    partial = {"type": "response.image_generation_call.partial_image", "output_index": 0, "item_id": "ig_1"}
    empty = ev({**partial, "partial_image_index": 0, "partial_image_b64": ""})
    image = ev({**partial, "partial_image_index": 1, "partial_image_b64": "iVBORw0KGgo="})
    _, results = feed(CREATED, ITEM, generating, empty, image)
    assert results == [False, False, False, False, True]


def test_completed_is_the_end_marker_and_carries_usage_and_reason() -> None:
    reader, _ = feed(CREATED, DELTA, DELTA, DONE_TEXT, COMPLETED)
    assert reader.complete and reader.end_of_body() is None
    facts = reader.facts
    assert (facts.prompt_tokens, facts.completion_tokens) == (20, 3)
    assert (facts.response_id, facts.model, facts.finish_reasons) == ("resp_1", "tiny-llama", ["max_output_tokens"])
    assert reader.chunks == 4


def test_incomplete_is_an_end_marker_too() -> None:
    incomplete = ev({"type": "response.incomplete", "response": response("incomplete", usage=USAGE)})
    reader, _ = feed(DELTA, incomplete)
    assert reader.complete and reader.facts.finish_reasons == ["incomplete"]


@pytest.mark.parametrize("before", [(CREATED, DELTA), (CREATED, DELTA, COMPLETED), (CREATED, COMPLETED)])
def test_a_done_line_ends_the_stream_as_the_openai_sdk_reads_it(before: tuple[bytes, ...]) -> None:
    """A proxy's ``data: [DONE]`` after (or instead of) ``response.completed``: the SDK stops there; before, the
    guard took it for a malformed event, and failed the call when no delta had come (an empty answer)."""
    reader, _ = feed(*before, b"data: [DONE]\n\n")
    assert reader.complete and reader.failure is None and reader.end_of_body() is None


def test_nothing_after_the_end_marker_is_judged() -> None:
    reader, _ = feed(CREATED, COMPLETED, b"data: not json\n\n", ev({"type": "error", "message": "late"}))
    assert reader.complete and reader.failure is None


def test_eof_before_completed_is_truncation() -> None:
    reader, _ = feed(CREATED, DELTA, DONE_TEXT)
    failure = reader.end_of_body()
    assert failure is not None and failure.kind == "truncated"
    assert "response.completed or response.incomplete" in failure.message


def test_vllm_overflow_drops_the_connection_after_in_progress() -> None:
    """vLLM 0.32 under a queue-overflow race: response.created, response.in_progress, then EOF (no token)."""
    in_progress = ev({"type": "response.in_progress", "response": response("in_progress")})
    reader, results = feed(CREATED, in_progress)
    assert results == [False, False] and reader.failure is None
    failure = reader.end_of_body()
    assert failure is not None and "before any content token" in failure.message


def test_error_event() -> None:
    error = ev({"type": "error", "code": "server_error", "message": "boom", "param": None, "sequence_number": 3})
    reader, _ = feed(CREATED, error)
    failure = reader.failure
    assert failure is not None and (failure.kind, failure.status, failure.code) == ("error_event", 500, "server_error")
    assert json.loads(failure.body)["error"]["message"] == "boom"


def test_error_event_with_a_nested_error_object() -> None:
    data = {"type": "error", "error": {"type": "internal_error", "message": "validation errors ... 'code': 503"}}
    reader, _ = feed(b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n")
    assert reader.failure is not None and reader.failure.status == 500 and not reader.failure.overload


def test_response_failed_after_the_first_token() -> None:
    failed = ev(
        {
            "type": "response.failed",
            "response": response("failed", error={"code": "rate_limit_exceeded", "message": "x"}),
        }
    )
    reader, _ = feed(DELTA, DELTA, failed)
    failure = reader.failure
    assert failure is not None and failure.status == 429 and failure.overload
    assert reader.facts.finish_reasons == ["failed"]


def test_a_malformed_event_before_the_first_token() -> None:
    reader, _ = feed(CREATED, b"event: response.output_text.delta\ndata: {oops\n\n")
    assert reader.failure is not None and reader.failure.kind == "malformed"


def test_events_without_an_event_line_are_read_by_their_type() -> None:
    _, results = feed(b"data: " + json.dumps({"type": "response.output_text.delta", "delta": "x"}).encode() + b"\n\n")
    assert results == [True]


def test_the_sim_wire_round_trips() -> None:
    wire = ResponsesWire("abc", 0, "sim-model")
    reader, results = feed(wire.opening(), wire.token(), wire.token(), wire.closing("length", 5, 2))
    assert results == [False, True, True, True]
    assert reader.complete and (reader.facts.prompt_tokens, reader.facts.completion_tokens) == (5, 2)
    assert reader.facts.finish_reasons == ["max_output_tokens"]
    body = BodyReader(absorb_response)
    body.feed(wire.complete(2, "stop", 5))
    assert body.end_of_body() is None and body.facts.completion_tokens == 2


def test_a_failed_response_is_an_answer_not_an_error_body() -> None:
    """``status: "failed"`` with ``output: []`` and its ``error`` set is what the SDK returns as a `Response`:
    passed to the caller once, not retried as a 500 three times."""
    body = BodyReader(absorb_response)
    body.feed(json.dumps(FAILED_RESPONSE).encode())
    assert body.end_of_body() is None and body.failure is None and body.complete
    assert body.facts.response_id == "resp_1"
