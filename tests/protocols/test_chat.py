"""ChatReader (and the SSE framing it shares): first content token, in-stream errors, end marker, usage."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmguard_client.protocols.base import ResponseFacts
from llmguard_client.protocols.body import BodyReader
from llmguard_client.protocols.chat import ChatReader, absorb_chat_body, chat_choice_has_content
from llmguard_client.protocols.completions import CompletionsReader, absorb_completions_body


def event(obj: Any, *, eol: bytes = b"\n") -> bytes:
    return b"data: " + json.dumps(obj).encode() + eol + eol


def chunk(delta: dict[str, Any] | None = None, *, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "m-1",
        "choices": [{"index": 0, "delta": delta if delta is not None else {}, "finish_reason": finish}],
        **extra,
    }


ROLE_ONLY = chunk({"role": "assistant"})
CONTENT = chunk({"content": "Hel"})
USAGE = {"id": "chatcmpl-1", "model": "m-1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}}


def scan(*parts: bytes) -> tuple[ChatReader, list[bool]]:
    scanner = ChatReader()
    return scanner, [scanner.feed(p) for p in parts]


def body_facts(body: bytes, absorb: Any = absorb_chat_body) -> ResponseFacts:
    reader = BodyReader(absorb)
    reader.feed(body)
    reader.end_of_body()
    return reader.facts


# --- what counts as a first content token ---------------------------------------------------


@pytest.mark.parametrize(
    "delta",
    [
        {"content": "x"},
        {"content": " "},  # whitespace is content
        {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f"}}]},
        {"reasoning_content": "thinking"},
        {"reasoning": "thinking"},
        {"reasoning_details": [{"type": "reasoning.summary", "summary": "Thinking", "index": 0}]},  # OpenRouter
        {"reasoning": None, "reasoning_details": [{"type": "reasoning.encrypted", "data": "gAAA", "index": 0}]},
        {"role": "assistant", "content": "x"},
        {"content": None, "audio": {"id": "audio_1", "transcript": "Hel"}},  # spoken output: no text content
        {"audio": {"data": "UklGRg=="}},
    ],
    ids=[
        "content",
        "space",
        "tool_calls",
        "reasoning_content",
        "reasoning",
        "reasoning_details_summary",
        "reasoning_details_encrypted",
        "role_and_content",
        "audio",
        "audio_data",
    ],
)
def test_chat_delta_with_content_is_a_first_token(delta: dict[str, Any]) -> None:
    scanner, results = scan(event(chunk(delta)))
    assert results == [True]
    assert scanner.first_token


def test_completions_text_is_a_first_token_for_the_completions_reader_only() -> None:
    obj = {
        "id": "cmpl-1",
        "object": "text_completion",
        "choices": [{"index": 0, "text": "Once", "finish_reason": None}],
    }
    completions = CompletionsReader()
    assert completions.feed(event(obj)) is True
    _, results = scan(event(obj))
    assert results == [False]
    assert CompletionsReader().feed(event(CONTENT)) is False  # a chat delta is not completions content


def test_completions_empty_text_is_not_a_first_token() -> None:
    obj = {"id": "cmpl-1", "choices": [{"index": 0, "text": "", "finish_reason": None}]}
    reader = CompletionsReader()
    assert reader.feed(event(obj)) is False
    assert reader.failure is None


@pytest.mark.parametrize(
    "delta",
    [
        {"role": "assistant"},
        {"role": "assistant", "content": ""},
        {"content": ""},
        {"content": None},
        {"tool_calls": []},
        {"reasoning_content": ""},
        {"reasoning": None, "reasoning_details": []},
        {"audio": {}},
        {},
    ],
    ids=[
        "role_only",
        "role_empty_content",
        "empty_content",
        "null_content",
        "empty_tool_calls",
        "empty_reasoning",
        "empty_reasoning_details",
        "empty_audio",
        "empty",
    ],
)
def test_deltas_without_content_never_count(delta: dict[str, Any]) -> None:
    scanner, results = scan(event(chunk(delta)))
    assert results == [False]
    assert not scanner.first_token


@pytest.mark.parametrize(
    "raw",
    [
        b": keep-alive\n\n",
        b":\n\n",
        b"\n\n\n\n",
        b"event: ping\n\n",
        b"id: 3\nretry: 1000\n\n",
        b"data: \n\n",
        b'data: {"choices": "content"}\n\n',
        b'data: {"choices": [1, "x", null]}\n\n',
        b'data: {"choices": [{"delta": "content"}]}\n\n',
        b'data: {"error": null, "choices": []}\n\n',
    ],
    ids=[
        "comment",
        "bare_colon",
        "blank_lines",
        "event_field_only",
        "id_retry_fields",
        "empty_data",
        "choices_not_a_list",
        "choices_not_dicts",
        "delta_not_a_dict",
        "null_error",
    ],
)
def test_comments_keepalives_and_odd_objects_are_neither_tokens_nor_failures(raw: bytes) -> None:
    scanner, results = scan(raw)
    assert results == [False]
    assert not scanner.first_token
    assert not scanner.complete
    assert scanner.failure is None


@pytest.mark.parametrize(
    "raw",
    [
        b"data: ping\n\n",
        b"data: {not json\n\n",
        b"data: 42\n\n",
        b'data: "content"\n\n',
        b'data: ["content", "x"]\n\n',
        b"data: \xff\xfe\n\n",
    ],
    ids=["plain_text", "broken_json", "json_number", "json_string", "json_list", "invalid_utf8"],
)
def test_a_malformed_event_before_the_first_token_is_a_failure(raw: bytes) -> None:
    scanner, results = scan(raw, event(CONTENT))
    assert results == [False, False]  # nothing after a failure counts
    assert scanner.failure is not None and scanner.failure.kind == "malformed"
    assert scanner.failure.cause == "stream_malformed"


def test_a_malformed_event_after_the_first_token_is_passed_through_unjudged() -> None:
    scanner, _ = scan(event(CONTENT), b"data: {not json\n\n", b"data: [DONE]\n\n")
    assert scanner.failure is None and scanner.complete


def test_role_then_keepalive_then_content_counts_at_the_content_event() -> None:
    parts = [event(ROLE_ONLY), b": ping\n\n", b"event: ping\n\n", event(chunk({"content": ""})), event(CONTENT)]
    scanner, results = scan(*parts)
    assert results == [False, False, False, False, True]
    assert not scanner.accepted  # chat has no acceptance event: a role-only delta is neither


def test_a_content_event_is_counted_only_when_its_blank_line_arrives() -> None:
    raw = event(CONTENT)
    _, results = scan(raw[:-1], raw[-1:])
    assert results == [False, True]


def test_an_unterminated_last_event_is_not_dispatched() -> None:
    _, results = scan(b'data: {"choices": [{"delta": {"content": "x"}}]}\n')
    assert results == [False]


def test_feed_keeps_returning_true_after_the_first_token() -> None:
    _, results = scan(event(CONTENT), b": ping\n\n", event(ROLE_ONLY))
    assert results == [True, True, True]


# --- [DONE], usage, finish reasons, ids ----------------------------------------------------------


def test_done_marks_the_stream_complete_and_is_not_a_token() -> None:
    scanner, results = scan(b"data: [DONE]\n\n")
    assert results == [False]
    assert scanner.complete
    assert scanner.end_of_body() is None


def test_done_after_content() -> None:
    scanner, _ = scan(event(ROLE_ONLY), event(CONTENT), b"data: [DONE]\n\n")
    assert scanner.first_token and scanner.complete
    assert scanner.chunks == 1  # [DONE] is not an event of the answer


def test_usage_comes_from_the_final_empty_choices_chunk() -> None:
    parts = [
        event(ROLE_ONLY),
        event(CONTENT),
        event(chunk({"content": "lo"})),
        event(chunk({}, finish="stop")),
        event(USAGE),
        b"data: [DONE]\n\n",
    ]
    scanner, _ = scan(*parts)
    facts = scanner.facts
    assert (facts.prompt_tokens, facts.completion_tokens) == (7, 5)
    assert facts.finish_reasons == ["stop"]
    assert facts.response_id == "chatcmpl-1"
    assert facts.model == "m-1"


def test_usage_chunk_with_compact_json_after_the_first_token() -> None:
    compact = json.dumps(USAGE, separators=(",", ":")).encode()
    scanner, _ = scan(event(CONTENT), b"data:" + compact + b"\n\n")
    assert (scanner.facts.prompt_tokens, scanner.facts.completion_tokens) == (7, 5)


def test_usage_absent_leaves_token_counts_none() -> None:
    scanner, _ = scan(event(CONTENT), event(chunk({}, finish="stop")), b"data: [DONE]\n\n")
    assert scanner.facts.prompt_tokens is None and scanner.facts.completion_tokens is None


def test_non_integer_usage_values_are_ignored() -> None:
    bad = {"choices": [], "usage": {"prompt_tokens": "7", "completion_tokens": None}}
    scanner, _ = scan(event(bad))
    assert scanner.facts.prompt_tokens is None and scanner.facts.completion_tokens is None


def test_finish_reasons_of_every_choice_in_order() -> None:
    two = {
        "id": "c",
        "choices": [
            {"index": 0, "delta": {}, "finish_reason": "stop"},
            {"index": 1, "delta": {}, "finish_reason": "length"},
        ],
    }
    tool = chunk({}, finish="tool_calls")
    scanner, _ = scan(event(CONTENT), event(chunk({"content": "x"})), event(two), event(tool))
    assert scanner.facts.finish_reasons == ["stop", "length", "tool_calls"]


def test_finish_reason_in_compact_json_after_the_first_token() -> None:
    compact = json.dumps(chunk({}, finish="length"), separators=(",", ":")).encode()
    scanner, _ = scan(event(CONTENT), b"data: " + compact + b"\n\n")
    assert scanner.facts.finish_reasons == ["length"]


def test_null_finish_reasons_are_not_collected() -> None:
    scanner, _ = scan(event(ROLE_ONLY), event(CONTENT))
    assert scanner.facts.finish_reasons == []


def test_id_and_model_are_taken_from_the_first_chunk_that_has_them() -> None:
    first = {"id": "first", "model": "a", "choices": [{"delta": {"role": "assistant"}}]}
    second = {"id": "second", "model": "b", "choices": [{"delta": {"content": "x"}}]}
    scanner, _ = scan(event(first), event(second))
    assert (scanner.facts.response_id, scanner.facts.model) == ("first", "a")


# --- framing: CRLF, multi-line data, field syntax ------------------------------------------------


def test_crlf_line_endings() -> None:
    parts = [
        event(ROLE_ONLY, eol=b"\r\n"),
        event(CONTENT, eol=b"\r\n"),
        event(USAGE, eol=b"\r\n"),
        b"data: [DONE]\r\n\r\n",
    ]
    scanner, results = scan(*parts)
    assert results == [False, True, True, True]
    assert scanner.complete
    assert (scanner.facts.prompt_tokens, scanner.facts.completion_tokens) == (7, 5)


def test_crlf_split_between_cr_and_lf() -> None:
    raw = event(CONTENT, eol=b"\r\n")
    cut = raw.rindex(b"\r")  # between the last CR and its LF
    _, results = scan(raw[: cut + 1], raw[cut + 1 :])
    # A CR alone already ends a line (SSE spec): the event is complete before its LF arrives,
    # and the LF that follows is not taken for another (blank) line.
    assert results == [True, True]


def test_a_multi_megabyte_event_in_many_chunks_is_read_whole() -> None:
    """One event of 2 MB (a base64 image in one line) arriving in 64 KB chunks: its text and the events around it
    read as if sent whole, and the CRLF around the last chunk boundary still ends one line only."""
    image = "iVBORw0KGgo" * (2 * 2**20 // 11)
    raw = event(CONTENT) + event(chunk({"content": image}), eol=b"\r\n") + event(USAGE) + b"data: [DONE]\n\n"
    whole, chunked = ChatReader(), ChatReader()
    whole.keep_text(), chunked.keep_text()
    whole.feed(raw)
    for start in range(0, len(raw), 65536):
        chunked.feed(raw[start : start + 65536])
    assert chunked.end_of_body() is None and chunked.complete
    assert chunked.text == "Hel" + image == whole.text
    facts = [(r.chunks, r.facts.prompt_tokens, r.facts.completion_tokens, r.facts.model) for r in (chunked, whole)]
    assert facts[0] == facts[1] == (3, 7, 5, "m-1")


def test_multi_line_data_fields_are_joined_with_newlines() -> None:
    lines = json.dumps(CONTENT, indent=2).encode().split(b"\n")
    raw = b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"
    assert len(lines) > 3
    scanner, results = scan(raw)
    assert results == [True]
    assert scanner.facts.response_id == "chatcmpl-1"


def test_multi_line_data_with_crlf() -> None:
    lines = json.dumps(USAGE, indent=1).encode().split(b"\n")
    raw = b"".join(b"data: " + line + b"\r\n" for line in lines) + b"\r\n"
    scanner, _ = scan(raw)
    assert (scanner.facts.prompt_tokens, scanner.facts.completion_tokens) == (7, 5)


def test_data_without_a_space_after_the_colon() -> None:
    _, results = scan(b"data:" + json.dumps(CONTENT).encode() + b"\n\n")
    assert results == [True]


def test_other_fields_and_comments_inside_an_event_are_ignored() -> None:
    raw = b"event: message\nid: 7\n: a comment\ndata: " + json.dumps(CONTENT).encode() + b"\nretry: 10\n\n"
    _, results = scan(raw)
    assert results == [True]


def test_done_with_surrounding_whitespace() -> None:
    scanner, _ = scan(b"data:  [DONE] \n\n")
    assert scanner.complete


def test_bare_cr_line_endings() -> None:
    raw = b"data: " + json.dumps(CONTENT).encode() + b"\r\r"
    _, results = scan(raw)
    assert results == [True]


def test_deeply_nested_non_json_data_is_a_malformed_event_not_a_crash() -> None:
    scanner = ChatReader()
    assert scanner.feed(b"data: " + b"[" * 100_000 + b"\n\n") is False
    assert scanner.failure is not None and scanner.failure.kind == "malformed"


# --- splitting the byte stream anywhere gives the same result --------------------------------------


@dataclass(frozen=True)
class Piece:
    kind: str
    obj: Any


CONTENT_KINDS = {"content", "tool", "reasoning"}


def piece_objects() -> st.SearchStrategy[Piece]:
    finish = st.sampled_from(["stop", "length", "tool_calls"])
    usage = st.tuples(st.integers(0, 10_000), st.integers(0, 10_000))
    return st.one_of(
        st.just(Piece("role", ROLE_ONLY)),
        st.just(Piece("empty", chunk({"content": ""}))),
        st.text(min_size=1, max_size=8).map(lambda t: Piece("content", chunk({"content": t}))),
        st.just(Piece("tool", chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}))),
        st.just(Piece("reasoning", chunk({"reasoning_content": "hmm"}))),
        st.just(Piece("text", {"id": "cmpl", "choices": [{"index": 0, "text": "t", "finish_reason": None}]})),
        st.just(Piece("comment", None)),
        finish.map(lambda f: Piece("finish", chunk({}, finish=f))),
        usage.map(
            lambda u: Piece("usage", {"choices": [], "usage": {"prompt_tokens": u[0], "completion_tokens": u[1]}})
        ),
    )


@st.composite
def sse_streams(draw: st.DrawFn) -> tuple[bytes, int | None, list[Piece]]:
    """A stream, the index of the byte that completes the first content event (None: no token), its pieces.

    The blank line ending an event is complete at its first byte (LF, or the CR of a CRLF).
    """
    pieces = draw(st.lists(piece_objects(), max_size=12))
    out = bytearray()
    first_at: int | None = None
    for piece in pieces:
        eol = draw(st.sampled_from([b"\n", b"\r\n"]))
        if piece.kind == "comment":
            out += b": keep-alive" + eol + eol
            continue
        style = draw(st.sampled_from(["compact", "spaced", "multiline"]))
        if style == "compact":
            lines = [json.dumps(piece.obj, separators=(",", ":")).encode()]
        elif style == "spaced":
            lines = [json.dumps(piece.obj).encode()]
        else:
            lines = json.dumps(piece.obj, indent=1).encode().split(b"\n")
        for line in lines:
            out += b"data: " + line + draw(st.sampled_from([b"\n", b"\r\n"]))
        out += eol
        if first_at is None and piece.kind in CONTENT_KINDS:
            # A CR alone ends a line (SSE spec), so a CRLF-terminated event is complete at its CR.
            first_at = len(out) - len(eol)
    if draw(st.booleans()):
        out += b"data: [DONE]\n\n"
    return bytes(out), first_at, pieces


def facts_tuple(facts: ResponseFacts) -> tuple[Any, ...]:
    return (facts.prompt_tokens, facts.completion_tokens, facts.response_id, facts.model, tuple(facts.finish_reasons))


def expected_facts(pieces: list[Piece]) -> tuple[Any, ...]:
    prompt = completion = None
    response_id = model = None
    reasons: list[str] = []
    token_seen = False
    for piece in pieces:
        obj = piece.obj
        if not isinstance(obj, dict):
            continue
        # After the first token the scanner decodes only events that can carry usage or a finish reason.
        if token_seen and piece.kind not in ("usage", "finish"):
            continue
        token_seen = token_seen or piece.kind in CONTENT_KINDS
        if response_id is None and "id" in obj:
            response_id = obj["id"]
        if model is None and "model" in obj:
            model = obj["model"]
        if piece.kind == "usage":
            prompt, completion = obj["usage"]["prompt_tokens"], obj["usage"]["completion_tokens"]
        reasons += [c["finish_reason"] for c in obj["choices"] if isinstance(c.get("finish_reason"), str)]
    return (prompt, completion, response_id, model, tuple(reasons))


@settings(max_examples=150, deadline=None)
@given(sse_streams())
def test_byte_by_byte_feeding_finds_the_first_token_exactly_at_its_event(
    stream: tuple[bytes, int | None, list[Piece]],
) -> None:
    raw, first_at, pieces = stream
    scanner = ChatReader()
    seen_at = next((i for i in range(len(raw)) if scanner.feed(raw[i : i + 1])), None)
    assert seen_at == first_at
    for i in range(len(raw) if seen_at is None else seen_at + 1, len(raw)):
        scanner.feed(raw[i : i + 1])
    assert facts_tuple(scanner.facts) == expected_facts(pieces)
    ended = raw.endswith(b"data: [DONE]\n\n") or any(p.kind == "finish" for p in pieces)
    assert scanner.complete == ended
    assert (scanner.end_of_body() is None) == ended


@settings(max_examples=200, deadline=None)
@given(sse_streams(), st.data())
def test_arbitrary_splits_give_the_same_result_as_the_whole_stream(
    stream: tuple[bytes, int | None, list[Piece]], data: st.DataObject
) -> None:
    raw, first_at, _ = stream
    whole = ChatReader()
    whole_result = whole.feed(raw)

    cuts = sorted(data.draw(st.sets(st.integers(0, len(raw)), max_size=20)))
    bounds = [0, *cuts, len(raw)]
    split = ChatReader()
    first_true_piece: tuple[int, int] | None = None
    for start, end in itertools.pairwise(bounds):
        if split.feed(raw[start:end]) and first_true_piece is None:
            first_true_piece = (start, end)

    assert split.first_token == whole.first_token == whole_result == (first_at is not None)
    if first_at is not None:
        # The first chunk that reports the token is the one holding the byte that completes its event.
        assert first_true_piece is not None and first_true_piece[0] <= first_at < first_true_piece[1]
    else:
        assert first_true_piece is None
    assert facts_tuple(split.facts) == facts_tuple(whole.facts)
    assert split.complete == whole.complete


# --- body_facts --------------------------------------------------------------------------------------


def test_body_facts_of_a_chat_completion() -> None:
    body = {
        "id": "chatcmpl-9",
        "object": "chat.completion",
        "model": "m-2",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    facts = body_facts(json.dumps(body).encode())
    assert facts_tuple(facts) == (3, 1, "chatcmpl-9", "m-2", ("stop",))


def test_body_facts_of_a_completions_body() -> None:
    body = {"id": "cmpl-1", "model": "m", "choices": [{"text": "x", "finish_reason": "length"}], "usage": {}}
    facts = body_facts(json.dumps(body).encode(), absorb_completions_body)
    assert facts_tuple(facts) == (None, None, "cmpl-1", "m", ("length",))


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"<html>502 Bad Gateway</html>", b"\xff\xfe\x00", b"[1, 2]", b'"str"', b"null", b"{"],
    ids=["empty", "text", "html", "binary", "list", "string", "null", "truncated"],
)
def test_a_body_that_is_not_a_json_object_is_handed_over_as_malformed(body: bytes) -> None:
    """No failure (nothing to retry: the SDK raises its own error at it, as without a guard), but the answer is
    recorded as an error: complete, its cause ``malformed_body``."""
    reader = BodyReader(absorb_chat_body)
    reader.feed(body)
    assert reader.end_of_body() is None and reader.failure is None
    assert reader.first_token and reader.complete and reader.facts.failed == "malformed_body"
    assert facts_tuple(reader.facts) == (None, None, None, None, ())


def test_a_200_body_holding_an_error_object_is_a_failure() -> None:
    reader = BodyReader(absorb_chat_body)
    reader.feed(b'{"error": {"message": "busy", "type": "Service Unavailable", "code": 503}}')
    failure = reader.end_of_body()
    assert failure is not None and (failure.kind, failure.status, failure.overload) == ("error_body", 503, True)


def test_chat_choice_content_reads_messages_too() -> None:
    assert chat_choice_has_content({"message": {"role": "assistant", "content": "x"}}) is True
    assert chat_choice_has_content({"message": {"role": "assistant", "content": ""}}) is False
    assert chat_choice_has_content({"delta": {"refusal": "no"}}) is True


def test_a_deeply_nested_body_is_malformed_not_a_crash() -> None:
    reader = BodyReader(absorb_chat_body)
    reader.feed(b"[" * 100_000)
    assert reader.end_of_body() is None and reader.facts.failed == "malformed_body"


# --- in-stream errors and truncation ----------------------------------------------------------------

VLLM_OVERLOAD = (
    b'data: {"error": {"message": "The engine is currently busy and cannot accept new requests. Please try again '
    b'later or on a different instance.", "type": "Service Unavailable", "param": null, "code": 503}}\n\n'
    b"data: [DONE]\n\n"
)


def test_vllm_queue_overflow_is_an_overload_failure() -> None:
    scanner, results = scan(event(ROLE_ONLY), VLLM_OVERLOAD)
    assert results == [False, False]
    failure = scanner.failure
    assert failure is not None
    assert (failure.kind, failure.status, failure.code, failure.overload) == ("error_event", 503, "503", True)
    assert "engine is currently busy" in failure.message
    assert json.loads(failure.body)["error"]["code"] == 503
    assert not scanner.complete  # the [DONE] after an error completes nothing


@pytest.mark.parametrize(
    ("raw", "status", "overload"),
    [
        (b'data: {"error": "Model is overloaded", "error_type": "overloaded"}\n\n', 503, True),
        (b'data: {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}\n\n', 500, False),
        (b'data: {"error": {"message": "slow", "type": "x", "code": "429"}}\n\n', 429, True),
        (b'data: {"error": {"message": "bad", "type": "invalid_request_error", "code": null}}\n\n', 400, False),
        (b'event: error\ndata: {"message": "upstream died"}\n\n', None, False),
    ],
    ids=["tgi", "vllm_500", "string_429", "typed_400", "event_error"],
)
def test_error_event_shapes(raw: bytes, status: int | None, overload: bool) -> None:
    scanner, _ = scan(event(ROLE_ONLY), raw)
    assert scanner.failure is not None and scanner.failure.kind == "error_event"
    assert (scanner.failure.status, scanner.failure.overload) == (status, overload)


def test_an_error_event_after_the_first_token_is_seen_on_the_cheap_path() -> None:
    scanner, _ = scan(event(CONTENT), event(chunk({"content": "more"})), VLLM_OVERLOAD)
    assert scanner.first_token and scanner.failure is not None and scanner.failure.status == 503
    assert scanner.chunks == 3


def test_eof_before_done_or_a_finish_reason_is_truncation() -> None:
    scanner, _ = scan(event(ROLE_ONLY), event(CONTENT), event(chunk({"content": "x"})))
    failure = scanner.end_of_body()
    assert failure is not None and failure.kind == "truncated" and failure.cause == "stream_truncated"
    assert "after the first content token" in failure.message


def test_eof_before_any_token_is_truncation_too() -> None:
    scanner, _ = scan(event(ROLE_ONLY))
    failure = scanner.end_of_body()
    assert failure is not None and "before any content token" in failure.message


def test_a_finish_reason_without_done_is_a_complete_answer() -> None:
    scanner, _ = scan(event(CONTENT), event(chunk({}, finish="stop")))
    assert scanner.complete and scanner.end_of_body() is None


def test_an_unterminated_done_at_eof_still_completes() -> None:
    scanner, _ = scan(event(CONTENT), b"data: [DONE]")
    assert not scanner.complete
    assert scanner.end_of_body() is None and scanner.complete


def test_an_event_name_split_from_its_data_is_not_lost_on_the_cheap_path() -> None:
    scanner, _ = scan(event(CONTENT), b"event: error\n", b'data: {"message": "gone"}\n\n')
    assert scanner.failure is not None and scanner.failure.kind == "error_event"


def test_the_cheap_path_counts_whole_events_of_a_chunk() -> None:
    scanner, _ = scan(event(CONTENT), event(chunk({"content": "a"})) * 3, b"data: [DONE]\n\n")
    assert scanner.chunks == 4 and scanner.complete


def _plain(text: str, *, created: int = 1, finish: str | None = None, compact: bool = True) -> bytes:
    """A one-event chunk as vLLM and OpenAI send them (compact), or as ``json.dumps`` writes it by
    default (with spaces): the shape `ChatReader` learns."""
    obj = {**chunk({"content": text}, finish=finish), "created": created}
    separators = (",", ":") if compact else (", ", ": ")
    return b"data: " + json.dumps(obj, separators=separators).encode() + b"\n\n"


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "spaced"])
def test_the_shape_is_learnt_from_compact_and_spaced_json(compact: bool) -> None:
    reader = ChatReader()
    for text in ("", "Hel", "lo"):
        reader.feed(_plain(text, compact=compact))
    assert reader._head.endswith(b'"content":"' if compact else b'"content": "')
    assert reader._tail.startswith(b'"}')
    before = reader.chunks or 0
    reader.feed(_plain(" world", compact=compact))
    reader.feed(_plain("", finish="stop", compact=compact))
    assert reader.chunks == before + 2 and reader.complete and reader.facts.finish_reasons == ["stop"]


@pytest.mark.parametrize(
    ("late", "expect"),
    [
        (_plain("x", finish="stop"), {"complete": True, "finish": ["stop"]}),
        (b'data: {"error":{"message":"boom","code":503}}\n\n', {"failure": "error_event"}),
        (_plain('say \\"hi\\"') + event(USAGE), {"usage": 7}),
        (_plain("a") + b"data: [DONE]\n\n", {"complete": True}),
        (_plain("b", created=2) + b'data: {"error":"late"}\n\n', {"failure": "error_event"}),
        (_plain("c").replace(b"\n\n", b"\r\n\r\n"), {"events": 1}),
    ],
    ids=["finish", "error", "escaped-quote-then-usage", "done", "new-shape-then-error", "crlf"],
)
def test_after_a_learnt_chunk_shape_every_marker_is_still_found(late: bytes, expect: dict[str, Any]) -> None:
    """Plain chunks of one shape are skipped by comparing the bytes around their text; anything else
    in a chunk (a finish reason, an error, usage, [DONE], a quote, CR line ends) is still judged."""
    reader = ChatReader()
    for text in ("", "Hel", "lo", "there"):
        reader.feed(_plain(text))
    assert reader.first_token and reader._head and reader._tail  # the shape was learnt
    before = reader.chunks
    reader.feed(_plain("more text"))  # same shape: counted without decoding
    assert reader.chunks == (before or 0) + 1 and reader.failure is None
    reader.feed(late)
    if "complete" in expect:
        assert reader.complete
    if "finish" in expect:
        assert reader.facts.finish_reasons == expect["finish"]
    if "failure" in expect:
        assert reader.failure is not None and reader.failure.kind == expect["failure"]
    else:
        assert reader.failure is None
    if "usage" in expect:
        assert reader.facts.prompt_tokens == expect["usage"]
    if "events" in expect:
        assert reader.chunks == (before or 0) + 1 + expect["events"]


def test_a_text_that_could_end_its_string_is_never_taken_for_the_learnt_shape() -> None:
    reader = ChatReader(choices=2)
    for text in ("", "a", "b"):
        reader.feed(_plain(text))
    head, tail = reader._head, reader._tail
    # Spliced by hand: a quote in the text closes the string early, so the bytes after it are decoded and
    # the finish reason they carry is found, though the chunk starts and ends like the learnt shape.
    sneaky = head + b'x"},"finish_reason":"length"},{"index":1,"delta":{"content":"' + tail
    reader.feed(sneaky)
    assert reader.facts.finish_reasons == ["length"]
    assert not reader.complete  # choice 1 goes on: with n=2 the answer ends when both have finished


def test_a_chunk_of_the_learnt_shape_that_completes_a_half_read_event_is_judged_with_it() -> None:
    """The shortcut holds only between whole events: after ``event: error`` arrives alone, the next
    chunk, though it has the learnt shape, is that error event's data."""
    reader = ChatReader()
    for text in ("", "a", "b"):
        reader.feed(_plain(text))
    assert reader._head
    reader.feed(b"event: error\n")
    reader.feed(_plain("boom"))
    assert reader.failure is not None and reader.failure.kind == "error_event"


def test_with_two_choices_the_answer_ends_when_both_have_finished() -> None:
    """``n=2``: the first choice's finish reason does not end the answer (the tier's stall still watches the other)."""
    reader = ChatReader(choices=2)
    role = [{"index": i, "delta": {"role": "assistant", "content": ""}} for i in (0, 1)]
    reader.feed(event({"choices": role}))
    reader.feed(event({"choices": [{"index": 0, "delta": {"content": "a"}}, {"index": 1, "delta": {"content": "b"}}]}))
    reader.feed(event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    assert reader.first_token and not reader.complete
    reader.feed(event({"choices": [{"index": 1, "delta": {"content": "c"}}]}))
    reader.feed(event({"choices": [{"index": 1, "delta": {}, "finish_reason": "length"}]}))
    assert reader.complete and reader.facts.finish_reasons == ["stop", "length"]


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "spaced"])
def test_a_second_choice_first_seen_after_the_first_token_still_holds_the_answer_open(compact: bool) -> None:
    """Past the first token most events are not decoded; those holding a finish reason are, whatever the choice."""
    separators = (",", ":") if compact else (", ", ": ")

    def choice(index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
        obj = {"choices": [{"index": index, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(obj, separators=separators).encode() + b"\n\n"

    reader = ChatReader(choices=2)
    reader.feed(choice(0, {"content": "a"}))
    reader.feed(choice(1, {"content": "b"}))
    reader.feed(choice(0, {}, "stop"))
    assert reader.first_token and not reader.complete
    reader.feed(choice(1, {}, "stop"))
    assert reader.complete


def test_an_empty_finish_reason_is_none() -> None:
    """Some servers send ``"finish_reason": ""`` on every chunk where the API has null: no chunk of theirs ends the
    answer, its end marker does."""
    reader = ChatReader()
    for text in ("", "a", "b"):
        reader.feed(event({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": ""}]}))
    assert reader.first_token and not reader.complete and reader.facts.finish_reasons == []
    reader.feed(b"data: [DONE]\n\n")
    assert reader.complete


def test_with_two_choices_the_second_may_begin_after_the_first_finished() -> None:
    """``n=2`` and choice 1's first chunk comes after choice 0's finish reason: the answer is not complete until
    choice 1 has finished too, though it was not seen yet when choice 0 finished."""
    reader = ChatReader(choices=2)
    for text in ("", "a", "b"):
        reader.feed(_plain(text))
    reader.feed(_plain("", finish="stop"))
    assert reader.first_token and not reader.complete
    reader.feed(event({"choices": [{"index": 1, "delta": {"content": "c"}, "finish_reason": None}]}))
    reader.feed(event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))  # choice 0 again: one
    assert not reader.complete
    reader.feed(event({"choices": [{"index": 1, "delta": {}, "finish_reason": "length"}]}))
    assert reader.complete and reader.facts.finish_reasons == ["stop", "stop", "length"]


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "spaced"])
def test_a_text_that_names_another_choice_does_not_hold_a_single_choice_answer_open(compact: bool) -> None:
    """``n=1``: a text holding ``"index": 1`` is only text; the answer is complete at choice 0's finish reason."""
    separators = (",", ":") if compact else (", ", ": ")

    def plain(delta: dict[str, Any], finish: str | None = None) -> bytes:
        obj = {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(obj, separators=separators).encode() + b"\n\n"

    reader = ChatReader()
    reader.feed(plain({"content": "JSON: {"}))
    reader.feed(plain({"content": '"index": 1'}))
    reader.feed(plain({"content": "}"}))
    reader.feed(plain({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}))  # a second call, one choice
    reader.feed(plain({}, "stop"))
    assert reader.complete and reader.failure is None


def test_a_server_that_sends_fewer_choices_than_asked_for_ends_with_done() -> None:
    """``n=3`` asked for, one choice sent (a server that ignores ``n``): its finish reason does not end the answer,
    ``[DONE]`` does; no truncation."""
    reader = CompletionsReader(choices=3)
    reader.feed(event({"choices": [{"index": 0, "text": "Hel", "finish_reason": None}]}))
    reader.feed(event({"choices": [{"index": 0, "text": "lo", "finish_reason": "stop"}]}))
    assert reader.first_token and not reader.complete
    reader.feed(b"data: [DONE]\n\n")
    assert reader.complete and reader.end_of_body() is None


def test_a_server_that_ignores_n_and_ends_without_done_sent_a_whole_answer() -> None:
    """``n=2`` asked for, one choice sent and finished, then the body's end without ``[DONE]``: the SDK takes the
    answer whole, and so does the guard (no truncation)."""
    reader = ChatReader(choices=2)
    for text in ("", "a", "b"):
        reader.feed(_plain(text))
    reader.feed(_plain("", finish="stop"))
    assert not reader.complete  # a second choice may yet come: the deadlines still watch the stream
    assert reader.end_of_body() is None


def test_a_choice_seen_but_never_finished_at_the_bodys_end_is_a_truncation() -> None:
    reader = ChatReader(choices=2)
    reader.feed(event({"choices": [{"index": i, "delta": {"role": "assistant", "content": ""}} for i in (0, 1)]}))
    reader.feed(event({"choices": [{"index": 0, "delta": {"content": "a"}}, {"index": 1, "delta": {"content": "b"}}]}))
    reader.feed(event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    failure = reader.end_of_body()
    assert failure is not None and failure.kind == "truncated"


def test_with_two_choices_one_cut_after_the_first_token_is_a_truncation() -> None:
    """No role chunks up front: choice 1 is first seen past the first token, in events that hold no finish reason.
    They are noted all the same, so a body that ends with choice 0 finished and choice 1 midway is truncated."""
    reader = ChatReader(choices=2)
    for text in ("a", "b"):
        reader.feed(event({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}))
        reader.feed(event({"choices": [{"index": 1, "delta": {"content": text}, "finish_reason": None}]}))
    reader.feed(event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    failure = reader.end_of_body()
    assert failure is not None and failure.kind == "truncated"
