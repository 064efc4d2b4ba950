"""Which request bodies the guard sends as they are read, which of them only once, and how it sends them
(`llmguard_client._http.upload`)."""

from __future__ import annotations

import io
import os
import threading
from collections.abc import AsyncIterator, Iterator

import httpx

from llmguard_client._http.upload import (
    OneShotBody,
    ReplayableBody,
    framing_headers,
    sent_once,
    streamed_body,
    sync_streamed,
)

URL = "http://a/v1/upload"


async def chunks() -> AsyncIterator[bytes]:
    yield b"a"
    yield b"b"


def test_bodies_in_memory_are_read_whole() -> None:
    for request in (
        httpx.Request("POST", URL, content=b"ab"),
        httpx.Request("POST", URL, json={"a": 1}),
        httpx.Request("POST", URL, data={"a": "1"}),
    ):
        assert streamed_body(request) is None and sync_streamed(request) is None


async def test_a_multipart_upload_whose_files_rewind_is_streamed_and_each_pass_reads_it_whole() -> None:
    file = io.BytesIO(b"x" * 200_000)  # several of httpx's 64 KiB reads
    request = httpx.Request("POST", URL, files={"file": ("f.jsonl", file), "note": b"n"}, data={"purpose": "batch"})
    whole = b"".join(request.stream)  # type: ignore[arg-type]  # (what httpx sends)
    body = streamed_body(request)
    inner = sync_streamed(request)
    assert isinstance(body, ReplayableBody) and not sent_once(body)
    assert inner is not None and isinstance(inner.stream, ReplayableBody)
    assert framing_headers(request) == [(b"Content-Length", str(len(whole)).encode())]
    for stream in (body, body, inner.stream, inner.stream):  # each pass starts again from the file's start
        assert b"".join([chunk async for chunk in stream]) == whole


def test_a_multipart_upload_with_a_file_that_cannot_seek_is_read_whole() -> None:
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "wb") as writer:
        writer.write(b"abc")
    with os.fdopen(read_end, "rb") as pipe:
        request = httpx.Request("POST", URL, files={"file": ("f", pipe)})
        assert streamed_body(request) is None and sync_streamed(request) is None


def test_an_async_iterator_is_sent_once_with_chunked_framing() -> None:
    request = httpx.Request("POST", URL, content=chunks())
    assert streamed_body(request) is request.stream and sent_once(request.stream)
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
    inner = sync_streamed(request)
    assert inner is not None and isinstance(inner.stream, OneShotBody) and streamed_body(inner) is inner.stream
    assert inner.headers["x-k"] == "v" and inner.headers["transfer-encoding"] == "chunked"
    assert threads == []  # nothing read before it is sent
    assert [chunk async for chunk in inner.stream] == [b"a", b"b"]  # an empty chunk is not sent
    assert threading.current_thread().name not in threads
