"""reader_for, the plain-body readers, the passthrough, and failures as exceptions."""

from __future__ import annotations

import json

import httpx
import pytest

from llmguard_client import GuardFailure, GuardStreamError, StreamTruncated, UpstreamStreamError
from llmguard_client.protocols import reader_for, stream_error
from llmguard_client.protocols.base import StreamFailure
from llmguard_client.protocols.body import PLAIN_BODY_LIMIT, BodyReader, NotAStreamReader
from llmguard_client.protocols.chat import ChatReader
from llmguard_client.protocols.completions import CompletionsReader
from llmguard_client.protocols.embeddings import EmbeddingsReader
from llmguard_client.protocols.errors import error_failure
from llmguard_client.protocols.messages import MessagesReader
from llmguard_client.protocols.passthrough import PassthroughReader
from llmguard_client.protocols.responses import ResponsesReader
from llmguard_client.protocols.sse import opens_like_events

SSE = "text/event-stream; charset=utf-8"


@pytest.mark.parametrize(
    ("method", "path", "content_type", "stream", "expected"),
    [
        ("POST", "/v1/chat/completions", SSE, True, ChatReader),
        ("POST", "/openai/deployments/x/chat/completions/", SSE, True, ChatReader),
        ("POST", "/v1/completions", SSE, True, CompletionsReader),
        ("POST", "/v1/responses", SSE, True, ResponsesReader),
        ("POST", "/v1/messages", SSE, False, MessagesReader),
        ("POST", "/v1/chat/completions", "application/json", True, ChatReader),  # judged by its first bytes
        ("POST", "/v1/messages", "text/html", True, MessagesReader),
        ("POST", "/v1/chat/completions", "application/json", False, BodyReader),
        ("POST", "/v1/chat/completions", "text/plain", False, PassthroughReader),
        ("POST", "/v1/messages/count_tokens", "application/json", False, PassthroughReader),
        ("POST", "/generate_stream", SSE, True, PassthroughReader),
        ("POST", "/v1/embeddings", "application/json", False, EmbeddingsReader),
        ("POST", "/v1/embeddings", "text/plain", False, PassthroughReader),
        ("GET", "/v1/responses", SSE, True, PassthroughReader),
        ("GET", "/v1/models", "application/json", False, PassthroughReader),
    ],
)
def test_reader_for(method: str, path: str, content_type: str, stream: bool, expected: type) -> None:
    assert type(reader_for(method, path, content_type, stream)) is expected


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_chat_or_completions_stream_ends_when_the_choices_asked_for_have_finished(path: str) -> None:
    """The request's ``n`` is handed to the reader: with 2, the first choice's finish reason does not end it."""
    done = {"choices": [{"index": 0, "delta": {}, "text": "", "finish_reason": "stop"}]}
    finish = b"data: " + json.dumps(done).encode() + b"\n\n"
    for choices, complete in ((1, True), (2, False)):
        reader = reader_for("POST", path, SSE, True, 200, choices)
        reader.feed(finish)
        assert reader.complete is complete


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308, 204, 205])
@pytest.mark.parametrize("content_type", ["", "application/json", SSE, "text/html"])
def test_a_redirect_or_an_answer_without_content_is_passed_through(status: int, content_type: str) -> None:
    """No generation to judge: a streamed call's 307 is handed to the client to follow, not failed as no stream."""
    reader = reader_for("POST", "/v1/chat/completions", content_type, True, status)
    assert type(reader) is PassthroughReader
    assert reader.end_of_body() is None and reader.complete


def test_passthrough_counts_the_first_bytes_as_the_first_token() -> None:
    reader = PassthroughReader()
    assert reader.feed(b"") is False
    assert reader.feed(b'data: {"token": {"text": "x"}}\n\n') is True
    assert reader.failure is None and reader.chunks is None and not reader.complete
    assert reader.end_of_body() is None and reader.complete


CHUNK = {"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
EVENTS = b"data: " + json.dumps(CHUNK).encode() + b"\n\ndata: [DONE]\n\n"


@pytest.mark.parametrize(
    ("head", "events"),
    [
        (b"data: {}", True),
        (b"data:{}", True),
        (b"\r\n\nevent: x", True),
        (b": keep-alive", True),
        (b"id: 1", True),
        (b"retry: 10", True),
        (b"", None),
        (b"\n\n", None),
        (b"da", None),
        (b"even", None),
        (b'{"id": "c"}', False),
        (b"  data: {}", False),
        (b"<html>", False),
        (b"dat {", False),
    ],
)
def test_an_unlabelled_body_is_an_event_stream_if_it_opens_with_an_event_field(
    head: bytes, events: bool | None
) -> None:
    assert opens_like_events(head) is events


@pytest.mark.parametrize("label", ["application/json", "text/plain", "application/x-ndjson", ""])
@pytest.mark.parametrize("size", [1, 3, 1000])
def test_events_under_another_label_are_read_as_events_however_they_are_split(label: str, size: int) -> None:
    reader = reader_for("POST", "/v1/chat/completions", label, True)
    first_token = [reader.feed(EVENTS[i : i + size]) for i in range(0, len(EVENTS), size)]
    assert any(first_token) and reader.failure is None and reader.complete
    assert reader.end_of_body() is None and reader.facts.response_id == "c"


@pytest.mark.parametrize("label", ["application/json", "text/plain"])
def test_a_plain_body_under_another_label_is_still_a_failure_with_its_error(label: str) -> None:
    body = b'{"error": {"message": "busy", "type": "Service Unavailable", "code": 503}}'
    reader = reader_for("POST", "/v1/chat/completions", label, True)
    for i in range(0, len(body), 7):
        assert reader.feed(body[i : i + 7]) is False
    failure = reader.end_of_body()
    kind = "json_body" if "json" in label else "not_sse"
    assert failure is not None and (failure.kind, failure.status, failure.overload) == (kind, 503, True)
    assert not reader.first_token


@pytest.mark.parametrize("body", [b"", b"\n\n", b"dat"])
def test_an_unlabelled_body_too_short_to_tell_is_a_plain_one(body: bytes) -> None:
    reader = reader_for("POST", "/v1/chat/completions", "text/plain", True)
    reader.feed(body)
    failure = reader.end_of_body()
    assert failure is not None and failure.kind == "not_sse"


def test_an_unlabelled_body_of_blank_lines_is_judged_without_reading_it_all() -> None:
    reader = reader_for("POST", "/v1/chat/completions", "text/plain", True)
    reader.feed(b"\n" * 2000)
    reader.feed(b"x" * (PLAIN_BODY_LIMIT + 1))
    assert reader.failure is not None and reader.failure.kind == "not_sse"


def test_a_non_streaming_answer_labelled_as_a_stream_is_read_as_the_json_it_is() -> None:
    body = {
        "id": "c",
        "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
    reader = reader_for("POST", "/v1/chat/completions", SSE, False)
    reader.feed(json.dumps(body).encode())
    assert reader.end_of_body() is None
    assert reader.first_token and reader.complete
    assert (reader.facts.prompt_tokens, reader.facts.completion_tokens) == (3, 1)


def test_events_answering_a_non_streaming_request_are_still_read_as_events() -> None:
    reader = reader_for("POST", "/v1/chat/completions", SSE, False)
    assert reader.feed(b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n')


def test_a_plain_json_body_for_a_stream_request_is_a_failure() -> None:
    body = {"id": "c", "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}
    reader = NotAStreamReader(json_body=True)
    reader.feed(json.dumps(body).encode())
    assert reader.failure is None  # judged at EOF
    failure = reader.end_of_body()
    assert failure is not None and failure.kind == "json_body" and failure.status is None
    assert not reader.first_token


def test_a_json_error_body_for_a_stream_request_carries_its_error() -> None:
    reader = NotAStreamReader(json_body=True)
    reader.feed(b'{"error": {"message": "busy", "type": "Service Unavailable", "code": 503}}')
    failure = reader.end_of_body()
    assert failure is not None and (failure.kind, failure.status, failure.overload) == ("json_body", 503, True)


def test_a_huge_plain_body_is_judged_without_reading_it_all() -> None:
    reader = NotAStreamReader(json_body=False)
    reader.feed(b"x" * (PLAIN_BODY_LIMIT + 1))
    assert reader.failure is not None and reader.failure.kind == "not_sse"


@pytest.mark.parametrize(
    ("error", "error_type", "status", "overload"),
    [
        ({"message": "m", "type": "Service Unavailable", "code": 503}, None, 503, True),
        ({"message": "m", "type": "x", "code": "503"}, None, 503, True),
        ({"message": "m", "type": "overloaded_error"}, None, 529, True),
        ({"message": "m", "code": "rate_limit_exceeded"}, None, 429, True),
        ({"message": "m", "type": "invalid_request_error", "code": None}, None, 400, False),
        ({"message": "m", "code": "invalid_prompt"}, None, 400, False),  # Responses' prompt and image errors
        ({"message": "m", "code": "invalid_image_url"}, None, 400, False),
        ({"message": "m", "status": 502}, None, 502, False),
        ("Model is overloaded", "overloaded", 503, True),
        ("something broke", None, None, False),
        ({"message": "m", "code": True}, None, None, False),
        ({"message": "m", "code": 42}, None, None, False),
    ],
)
def test_error_objects(error: object, error_type: object, status: int | None, overload: bool) -> None:
    failure = error_failure(error, error_type=error_type)
    assert (failure.status, failure.overload) == (status, overload)
    assert json.loads(failure.body)["error"]["message"]


@pytest.mark.parametrize(
    ("kind", "cls", "cause"),
    [
        ("error_event", UpstreamStreamError, "stream_error_event"),
        ("truncated", StreamTruncated, "stream_truncated"),
        ("malformed", GuardStreamError, "stream_malformed"),
        ("json_body", GuardStreamError, "stream_json_body"),
    ],
)
def test_stream_error_types(kind: str, cls: type, cause: str) -> None:
    failure = StreamFailure(kind, "what happened", status=503, code="503", overload=True)  # type: ignore[arg-type]
    request = httpx.Request("POST", "http://r/v1/chat/completions")
    error = stream_error(failure, replica="http://r", request=request, after_first_token=True)
    assert type(error) is cls and error.cause == cause
    assert isinstance(error, httpx.RemoteProtocolError) and isinstance(error, GuardFailure)
    assert error.request is request
    assert "http://r" in str(error) and "after the first token" in str(error) and "(code 503)" in str(error)
    assert error.overload and error.code == "503"
