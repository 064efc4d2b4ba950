"""`RequestFacts`: what the guard reads from a request body (model, stream, max tokens, the prompt's length), never
the prompt."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from llmguard_client._core.request import NO_MEDIA, RequestFacts, prompt_chars


def post(body: Any, content_type: str | None = "application/json") -> tuple[httpx.Request, bytes]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": content_type} if content_type else {}
    request = httpx.Request("POST", "http://h/v1/chat/completions", content=raw, headers=headers)
    return request, raw


def facts(body: Any, content_type: str | None = "application/json") -> tuple[str | None, bool, int | None]:
    got = RequestFacts.parse(*post(body, content_type))
    return got.model, got.stream, got.max_tokens


def test_parse_model_stream_and_max_tokens() -> None:
    assert facts({"model": "llama", "stream": True, "max_tokens": 64, "messages": []}) == ("llama", True, 64)


def test_parse_max_completion_tokens_wins_over_max_tokens() -> None:
    assert facts({"model": "m", "max_completion_tokens": 32, "max_tokens": 64}) == ("m", False, 32)
    assert facts({"model": "m", "max_completion_tokens": 32}) == ("m", False, 32)


def test_parse_defaults_when_fields_are_absent() -> None:
    assert facts({"messages": [{"role": "user", "content": "hi"}]}) == (None, False, None)


@pytest.mark.parametrize("stream", ["true", 1, None, [True], {"on": True}])
def test_parse_stream_only_for_json_true(stream: Any) -> None:
    assert facts({"model": "m", "stream": stream})[1] is False


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize(
    "value", [True, False, 1.5, "64", None, [64]], ids=["true", "false", "float", "str", "null", "list"]
)
def test_parse_rejects_non_integer_max_tokens(field: str, value: Any) -> None:
    assert facts({"model": "m", field: value})[2] is None


@pytest.mark.parametrize(
    ("n", "choices"), [(3, 3), (1, 1), (0, 1), (-2, 1), (True, 1), (2.0, 1), ("2", 1), (None, 1), ([2], 1)]
)
def test_parse_the_choices_asked_for(n: Any, choices: int) -> None:
    """``n`` (Chat Completions and Completions): a positive integer, else 1, as when it is absent."""
    assert RequestFacts.parse(*post({"model": "m", "n": n})).choices == choices
    assert RequestFacts.parse(*post({"model": "m"})).choices == 1


@pytest.mark.parametrize("model", [3, None, ["m"], {"id": "m"}])
def test_parse_rejects_non_string_model(model: Any) -> None:
    assert facts({"model": model})[0] is None


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"{broken", b"[1, 2]", b'"just a string"', b"null", b"\xff\xfe"],
    ids=["empty", "text", "broken", "list", "string", "null", "binary"],
)
def test_parse_non_json_or_non_object_gives_defaults(body: bytes) -> None:
    assert facts(body) == (None, False, None)


def test_parse_ignores_a_non_json_content_type() -> None:
    assert facts({"model": "m", "stream": True}, content_type="multipart/form-data; boundary=x") == (None, False, None)


def test_parse_assumes_json_without_a_content_type() -> None:
    assert facts({"model": "m", "stream": True}, content_type=None) == ("m", True, None)


def test_parse_accepts_json_content_type_variants() -> None:
    assert facts({"model": "m"}, content_type="application/json; charset=utf-8")[0] == "m"
    assert facts({"model": "m"}, content_type="application/vnd.api+json")[0] == "m"


def test_request_facts_never_hold_the_prompt() -> None:
    got = RequestFacts.parse(*post({"model": "m", "messages": [{"role": "user", "content": "secret prompt"}]}))
    assert "secret prompt" not in repr(got)


@pytest.mark.parametrize(
    ("body", "chars"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "hello"}]}, 5),  # the JSON around it left out
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "abc"}, {"type": "image_url"}]}]}, 3),
        ({"system": "be brief", "messages": [{"role": "user", "content": "hi"}]}, 10),  # Messages API
        ({"instructions": "ab", "input": "hello"}, 7),  # Responses, a plain input
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "hey"}]}]}, 3),  # input items
        ({"prompt": ["ab", "cde"]}, 5),  # Completions, a batch of prompts
        ({"model": "m", "max_tokens": 5}, None),  # no prompt field
    ],
)
def test_prompt_chars_counts_the_text_of_the_prompt_only(body: dict[str, object], chars: int | None) -> None:
    assert prompt_chars(body) == chars
    assert RequestFacts.of(body).prompt_chars == chars


def test_prompt_chars_stops_at_a_nesting_deeper_than_any_api_sends() -> None:
    deep: object = "x" * 10
    for _ in range(50):
        deep = [deep]
    assert prompt_chars({"prompt": deep}) == 0


@pytest.mark.parametrize(("background", "expected"), [(True, True), (False, False), ("true", False), (None, False)])
def test_parse_background_only_for_json_true(background: Any, expected: bool) -> None:
    """The Responses API's ``background``: a job the server runs on its own."""
    assert RequestFacts.parse(*post({"model": "m", "background": background})).background is expected
    assert RequestFacts.parse(*post({"model": "m"})).background is False


DATA = "QUJD" * 1000  # 4,000 characters of base64
"""A media part's data, as a provider's SDK sends it."""


@pytest.mark.parametrize(
    ("part", "kind"),
    [
        ({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{DATA}", "detail": "high"}}, "image"),
        ({"type": "image_url", "image_url": "https://example.com/cat.png"}, "image"),  # a URL, as some servers take
        ({"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}}, "low_detail_image"),
        ({"type": "input_image", "image_url": f"data:image/png;base64,{DATA}"}, "image"),  # Responses
        ({"type": "input_image", "image_url": f"data:image/png;base64,{DATA}", "detail": "low"}, "low_detail_image"),
        ({"type": "input_image", "image_url": "https://x/y.png", "detail": "auto"}, "image"),
        ({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": DATA}}, "image"),
        ({"type": "input_audio", "input_audio": {"data": DATA, "format": "wav"}}, "audio"),
        ({"type": "file", "file": {"filename": "a.pdf", "file_data": f"data:application/pdf;base64,{DATA}"}}, "file"),
        ({"type": "input_file", "file_id": "file-abc"}, "file"),  # Responses, a file uploaded before
        ({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": DATA}}, "file"),
    ],
    ids=[
        "image_url",
        "image_url-str",
        "image_url-low",
        "input_image",
        "input_image-low",
        "input_image-auto",
        "anthropic-image",
        "input_audio",
        "file",
        "input_file",
        "document",
    ],
)
def test_a_media_part_is_counted_with_the_characters_it_takes_and_no_text(part: dict[str, Any], kind: str) -> None:
    """The media parts the providers' APIs send (OpenAI's Chat Completions and Responses, Anthropic's Messages):
    counted by kind (an image sent with ``"detail": "low"`` apart: OpenAI counts it at a fixed size), with every
    character of their strings (data, URL, id), and none of them as the prompt's text."""
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "what?"}, part]}]}
    got = RequestFacts.of(body)
    assert got.prompt_chars == 5
    assert [name for name, _ in got.media.parts] == [kind]
    strings: list[str] = []

    def collect(value: object) -> None:
        if isinstance(value, str):
            strings.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                collect(item)

    collect(part)
    assert got.media.chars == sum(map(len, strings))


def test_media_in_a_tool_result_and_in_responses_input_items_is_found_too() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": DATA}}
    document = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": DATA}}
    result = {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "done"}, image, document]}
    got = RequestFacts.of({"messages": [{"role": "user", "content": [result]}]})
    assert (got.media.count("image"), got.media.count("file"), got.prompt_chars) == (1, 1, 4)
    items = {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}] * 2}]}
    assert RequestFacts.of(items).media.count("image") == 2


def test_a_document_of_text_is_text_and_a_body_without_media_has_none() -> None:
    text = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain words"}}
    assert not RequestFacts.of({"messages": [{"role": "user", "content": [text]}]}).media.count("file")
    assert RequestFacts.of({"messages": [{"role": "user", "content": "hi"}]}).media == NO_MEDIA
    assert RequestFacts.of({"messages": [{"role": "user", "content": [{"type": ["image"]}]}]}).media == NO_MEDIA


def test_a_tools_output_sent_back_in_the_responses_api_is_the_prompts_text_and_media() -> None:
    """A ``function_call_output`` (text, or content parts) and a ``computer_call_output`` (a screenshot) hold their
    output in ``output``, which the walk passed by: a base64 screenshot there was left among the body's text bytes,
    and charged about a token per 4 of them (a 1 MB screenshot: 250,000 tokens)."""
    screenshot = f"data:image/png;base64,{DATA}"
    items = [
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "sunny"},
        {
            "type": "function_call_output",
            "call_id": "b",
            "output": [
                {"type": "input_text", "text": "the page:"},
                {"type": "input_image", "image_url": screenshot, "detail": "high"},
                {"type": "input_file", "file_id": "file-abc"},
            ],
        },
        {
            "type": "computer_call_output",
            "call_id": "c",
            "output": {"type": "computer_screenshot", "image_url": screenshot},
        },
    ]
    got = RequestFacts.of({"model": "m", "input": items})
    assert got.prompt_chars == len("sunny") + len("the page:")
    assert [name for name, _ in got.media.parts] == ["image", "file", "image"]
    media_strings = ["input_image", screenshot, "high", "input_file", "file-abc", "computer_screenshot", screenshot]
    assert got.media.chars == sum(map(len, media_strings))
