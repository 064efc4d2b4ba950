"""Which request bodies the guard can send only once, and how it sends them (`llmguard_client._http.upload`)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator

import httpx

from llmguard_client._http.upload import OneShotBody, framing_headers, one_shot_body, sync_one_shot

URL = "http://a/v1/upload"


async def chunks() -> AsyncIterator[bytes]:
    yield b"a"
    yield b"b"


def test_bodies_in_memory_can_be_sent_again() -> None:
    for request in (
        httpx.Request("POST", URL, content=b"ab"),
        httpx.Request("POST", URL, json={"a": 1}),
        httpx.Request("POST", URL, files={"f": b"ab"}),  # multipart re-reads its fields
    ):
        assert one_shot_body(request) is None and sync_one_shot(request) is None


def test_an_async_iterator_is_sent_once_with_chunked_framing() -> None:
    request = httpx.Request("POST", URL, content=chunks())
    assert one_shot_body(request) is request.stream
    assert framing_headers(request) == [(b"Transfer-Encoding", b"chunked")]
    sized = httpx.Request("POST", URL, content=chunks(), headers={"content-length": "2"})
    assert framing_headers(sized) == [(b"Content-Length", b"2")]


async def test_a_sync_iterator_is_read_in_a_worker_thread_as_it_is_sent() -> None:
    threads: list[str] = []

    def produce() -> Iterator[bytes]:
        for chunk in (b"a", b"", b"b"):
            threads.append(threading.current_thread().name)
            yield chunk

    request = httpx.Request("POST", URL, content=produce(), headers={"x-k": "v"})
    inner = sync_one_shot(request)
    assert inner is not None and isinstance(inner.stream, OneShotBody) and one_shot_body(inner) is inner.stream
    assert inner.headers["x-k"] == "v" and inner.headers["transfer-encoding"] == "chunked"
    assert threads == []  # nothing read before it is sent
    assert [chunk async for chunk in inner.stream] == [b"a", b"b"]  # an empty chunk is not sent
    assert threading.current_thread().name not in threads
