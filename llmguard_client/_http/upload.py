"""Request bodies that can be sent only once: content given as an iterator or an async iterator.

httpx (and httpx2) hold ``content=`` bytes, ``json=`` and ``data=`` in memory, and a multipart body re-reads its
fields; an iterator's chunks are produced once, as they are sent. The guard sends such a body as it comes,
unbuffered, on one attempt (`one_shot_body`), so its first bytes leave before the iterator is exhausted.

The edges hand the core a body they cannot replay as a `OneShotBody`: an async stream over the caller's chunks
(a sync iterator is advanced in a worker thread, `from_sync`, so the guard's event loop never blocks on it).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator

import anyio.to_thread
import httpx
from httpx._content import AsyncIteratorByteStream, IteratorByteStream


class OneShotBody(httpx.AsyncByteStream):
    """A request body that can be read once: the caller's chunks, passed on as they come."""

    def __init__(self, chunks: AsyncIterable[bytes], close: Callable[[], object] | None = None) -> None:
        self._chunks = chunks
        self._close = close

    @classmethod
    def from_sync(cls, chunks: Iterable[bytes], close: Callable[[], object] | None = None) -> OneShotBody:
        """A sync iterator's chunks, each taken in a worker thread (it may block, e.g. reading a file)."""
        return cls(_in_thread(iter(chunks)), close)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._chunks:
            yield chunk

    async def aclose(self) -> None:
        if self._close is not None:
            self._close()


async def _in_thread(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    while True:
        chunk = await anyio.to_thread.run_sync(_next, chunks)
        if chunk is None:
            return
        if chunk:
            yield chunk


def _next(chunks: Iterator[bytes]) -> bytes | None:
    return next(chunks, None)


def one_shot_body(request: httpx.Request) -> httpx.AsyncByteStream | None:
    """The request's body when it can be sent only once (an edge's `OneShotBody`, or an async iterator given
    to an `httpx.AsyncClient`), else None (a body in memory or a multipart one, which the guard may resend)."""
    stream = request.stream
    if isinstance(stream, (OneShotBody, AsyncIteratorByteStream)):
        return stream
    return None


def sync_one_shot(request: httpx.Request) -> httpx.Request | None:
    """For a sync caller's request whose body is an iterator: the same request with that body as a
    `OneShotBody` (the core is async); None for any other body."""
    stream = request.stream
    if not isinstance(stream, IteratorByteStream):
        return None
    return httpx.Request(
        request.method,
        request.url,
        headers=request.headers.raw,
        stream=OneShotBody.from_sync(stream),
        extensions=request.extensions,
    )


def framing_headers(request: httpx.Request) -> list[tuple[bytes, bytes]]:
    """The framing headers of a one-shot body: the caller's ``Content-Length`` if it gave one, else
    ``Transfer-Encoding: chunked`` (what httpx sends for an iterator)."""
    length = request.headers.get("content-length")
    if length is not None:
        return [(b"Content-Length", length.encode())]
    return [(b"Transfer-Encoding", b"chunked")]
