"""The per-call helpers: re-aiming a URL at a replica, reading request facts, forwarded headers."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from llmguard_client._core.call import CallerHeaders, RequestFacts, rebase

R1 = httpx.URL("http://10.0.0.1:8000")
R2 = httpx.URL("http://10.0.0.2:9000")
R1_V1 = httpx.URL("http://10.0.0.1:8000/v1")
R2_API = httpx.URL("https://gw.example.com/tenant/api/v1")


# --- rebase -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "base", "known", "expected"),
    [
        # known replica without a path prefix: the whole path moves over
        ("http://10.0.0.1:8000/v1/chat/completions", R2, (R1, R2), "http://10.0.0.2:9000/v1/chat/completions"),
        ("http://10.0.0.1:8000/v1/chat/completions", R1, (R1, R2), "http://10.0.0.1:8000/v1/chat/completions"),
        # known replica with a path prefix: the prefix is swapped for the target's
        (
            "http://10.0.0.1:8000/v1/chat/completions",
            R2_API,
            (R1_V1, R2_API),
            "https://gw.example.com/tenant/api/v1/chat/completions",
        ),
        (
            "https://gw.example.com/tenant/api/v1/completions",
            R1_V1,
            (R1_V1, R2_API),
            "http://10.0.0.1:8000/v1/completions",
        ),
        ("http://10.0.0.1:8000/v1", R2_API, (R1_V1, R2_API), "https://gw.example.com/tenant/api/v1"),
        # same host, path not under the known prefix: appended to the target's base
        ("http://10.0.0.1:8000/v1beta/models", R2, (R1_V1, R2), "http://10.0.0.2:9000/v1beta/models"),
        # unknown host: the path is appended to the base
        ("http://api.example.com/v1/chat/completions", R1, (R1, R2), "http://10.0.0.1:8000/v1/chat/completions"),
        ("http://api.example.com/chat/completions", R1_V1, (R1_V1,), "http://10.0.0.1:8000/v1/chat/completions"),
        # same host, another port or scheme: not that replica
        ("http://10.0.0.1:8001/v1/models", R1_V1, (R1_V1,), "http://10.0.0.1:8000/v1/v1/models"),
        ("https://10.0.0.1:8000/v1/models", R1_V1, (R1_V1,), "http://10.0.0.1:8000/v1/v1/models"),
    ],
    ids=[
        "no_prefix_to_other",
        "no_prefix_to_self",
        "prefix_swapped",
        "prefix_swapped_back",
        "prefix_exact",
        "prefix_lookalike",
        "unknown_host",
        "unknown_host_prefix_base",
        "other_port",
        "other_scheme",
    ],
)
def test_rebase(url: str, base: httpx.URL, known: tuple[httpx.URL, ...], expected: str) -> None:
    assert str(rebase(httpx.URL(url), base, known)) == expected


@pytest.mark.parametrize(
    "query",
    ["api-version=2024-06-01", "a=1&b=2&a=3", "q=a%26b&r=%20x", "flag"],
    ids=["simple", "repeated", "encoded", "bare"],
)
def test_rebase_keeps_the_query(query: str) -> None:
    for known in ((R1_V1, R2_API), ()):
        moved = rebase(httpx.URL(f"http://10.0.0.1:8000/v1/chat/completions?{query}"), R2_API, known)
        assert moved.query == query.encode()
        assert moved.host == "gw.example.com" and moved.scheme == "https"


def test_rebase_without_query_has_none() -> None:
    moved = rebase(httpx.URL("http://10.0.0.1:8000/v1/models"), R2, (R1,))
    assert moved.query == b"" and "?" not in str(moved)


def test_rebase_keeps_percent_encoded_paths() -> None:
    moved = rebase(httpx.URL("http://10.0.0.1:8000/v1/files/a%20b%2Fc"), R2, (R1,))
    assert moved.raw_path == b"/v1/files/a%20b%2Fc"


def test_rebase_never_keeps_the_original_origin() -> None:
    moved = rebase(httpx.URL("http://user:pw@evil.example:1/v1/x"), R1, (R1, R2))
    assert (moved.scheme, moved.host, moved.port) == ("http", "10.0.0.1", 8000)
    assert moved.userinfo == b""


# --- RequestFacts.parse ----------------------------------------------------------------------------


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


# --- forwarded headers --------------------------------------------------------------------------------


def test_forwarded_headers_drop_host_length_and_guard_headers() -> None:
    request = httpx.Request(
        "POST",
        "http://api.example.com/v1/chat/completions",
        content=b'{"model": "m"}',
        headers=[
            ("Authorization", "Bearer caller"),
            ("X-LLMGuard-Tier", "batch"),
            ("x-llmguard-cohort", "control"),
            ("X-Stainless-Lang", "python"),
            ("accept", "text/event-stream"),
            ("x-custom", "1"),
            ("x-custom", "2"),
        ],
    )
    forwarded = CallerHeaders(request).forwarded
    keys = [k.lower() for k, _ in forwarded]
    for dropped in (b"host", b"content-length", b"x-llmguard-tier", b"x-llmguard-cohort"):
        assert dropped not in keys
    assert (b"Authorization", b"Bearer caller") in forwarded
    assert (b"X-Stainless-Lang", b"python") in forwarded
    assert (b"accept", b"text/event-stream") in forwarded
    assert [v for k, v in forwarded if k == b"x-custom"] == [b"1", b"2"]  # repeated headers kept, in order


def test_forwarded_headers_drop_transfer_encoding() -> None:
    async def body() -> Any:
        yield b"{}"

    request = httpx.Request("POST", "http://h/v1/completions", content=body())
    assert request.headers.get("transfer-encoding") == "chunked"
    assert b"transfer-encoding" not in [k.lower() for k, _ in CallerHeaders(request).forwarded]


def test_forwarded_headers_keep_the_caller_order() -> None:
    request = httpx.Request("GET", "http://h/v1/models", headers=[("b", "1"), ("a", "2"), ("c", "3")])
    assert [k for k, _ in CallerHeaders(request).forwarded if k in (b"a", b"b", b"c")] == [b"b", b"a", b"c"]


def test_caller_headers_tell_an_sdk_call_and_the_guards_own_headers() -> None:
    sdk = httpx.Request("POST", "http://h/v1/chat/completions", headers=[("X-Stainless-Lang", "python")])
    plain = httpx.Request("POST", "http://h/v1/chat/completions", headers=[("x-stainless", "no"), ("x-custom", "1")])
    assert CallerHeaders(sdk).from_sdk and not CallerHeaders(plain).from_sdk
    assert CallerHeaders(plain).own("x-llmguard-tier") is None
    pinned = httpx.Request("GET", "http://h/v1/models", headers=[("X-LLMGuard-Tier", " batch "), ("x-a", "1")])
    read = CallerHeaders(pinned)
    assert read.own("x-llmguard-tier") == " batch " and read.own("x-llmguard-cohort") is None
    assert [k for k, _ in read.forwarded if k.lower().startswith(b"x-")] == [b"x-a"]
