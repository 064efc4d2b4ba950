"""`CallerHeaders`: a caller's headers read once: those forwarded to replicas, whether an SDK sent them, and the
values of the guard's own ``x-llmguard-*`` headers (never forwarded)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

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


@pytest.mark.parametrize(
    ("url", "host", "explicit"),
    [
        ("http://127.0.0.1:8000/v1/chat/completions", None, None),  # httpx writes the URL's
        ("http://127.0.0.1:8000/v1/chat/completions", "llm.internal", b"llm.internal"),
        ("http://127.0.0.1:8000/v1/chat/completions", "127.0.0.1:8000", None),  # the URL's, given again
        ("http://API.example.com/v1/models", "api.EXAMPLE.com", None),  # hosts are case-insensitive
        ("https://api.example.com:443/v1/models", None, None),  # the default port is not written
        ("http://u:p@10.0.0.7:8080/v1/models", "llm.internal:8080", b"llm.internal:8080"),
    ],
)
def test_caller_headers_tell_a_host_the_caller_set_from_the_one_httpx_writes(
    url: str, host: str | None, explicit: bytes | None
) -> None:
    """A ``Host`` that differs from the request URL's authority was set by the caller (``default_headers``): it is
    kept, to be forwarded; the one httpx writes from the URL is the replica's to replace. Neither is in
    ``forwarded``: each attempt writes the one it sends first."""
    request = httpx.Request("GET", url, headers={} if host is None else {"Host": host})
    read = CallerHeaders(request)
    assert read.host == explicit
    assert b"host" not in [k.lower() for k, _ in read.forwarded]
