"""`CallerHeaders`: a caller's headers read once: those forwarded to replicas, whether an SDK sent them, and the
values of the guard's own ``x-llmguard-*`` headers (never forwarded)."""

from __future__ import annotations

from typing import Any

import httpx

from llmguard_client._core.headers import CallerHeaders


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
    assert CallerHeaders(plain).tier is None
    pinned = httpx.Request("GET", "http://h/v1/models", headers=[("X-LLMGuard-Tier", " batch "), ("x-a", "1")])
    read = CallerHeaders(pinned)
    assert read.tier == " batch " and read.cohort is None and read.key is None and read.session is None
    assert [k for k, _ in read.forwarded if k.lower().startswith(b"x-")] == [b"x-a"]


def test_caller_headers_read_each_of_the_guards_own_headers() -> None:
    request = httpx.Request(
        "POST",
        "http://h/v1/chat/completions",
        headers=[
            ("x-llmguard-tier", "batch"),
            ("X-LLMGuard-Cohort", "control"),
            ("x-llmguard-key", "user-7"),
            ("x-llmguard-session", "conv-1"),
        ],
    )
    read = CallerHeaders(request)
    assert (read.tier, read.cohort, read.key, read.session) == ("batch", "control", "user-7", "conv-1")
    assert read.forwarded == []  # host and length are rebuilt per attempt; the guard's own never go out
