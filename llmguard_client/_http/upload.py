"""Request bodies the guard sends as they are read instead of holding them: iterators, and multipart uploads.

httpx (and httpx2) hold ``content=`` bytes, ``json=`` and ``data=`` in memory; the guard reads such a body
whole and may send it again. Two others it never holds (`streamed_body`):

- an iterator's chunks (``content=`` an iterator or an async iterator) are produced once, as they are sent: the
  guard sends them as they come, on one attempt, so the first bytes leave before the iterator is exhausted
  (`OneShotBody`);
- a multipart upload (``files=``) is read from its files as it is sent, and read again from their start on
  each pass, when every file rewinds (`ReplayableBody`): the guard sends it as it is read, and may send it
  again. Held in memory, a 195 MB batch file cost 582 MB of memory at its peak. (A file that cannot seek is
  read once: such an upload is held in memory, as any other body.)

The edges hand the core such a body as one of these two streams (a sync caller's is read in a worker thread,
`from_sync`, so the guard's event loop never blocks on it).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import cast

import anyio.to_thread
import httpx
from httpx._content import AsyncIteratorByteStream, IteratorByteStream
from httpx._multipart import MultipartStream


class ReplayableBody(httpx.AsyncByteStream):
    """A request body the guard sends as it is read, and may send again: each pass reads it afresh."""

    def __init__(self, passes: Callable[[], AsyncIterator[bytes]]) -> None:
        self._passes = passes

    @classmethod
    def of(cls, stream: AsyncIterable[bytes]) -> ReplayableBody:
        """Each pass iterates ``stream`` again (a multipart stream rewinds its files)."""
        return cls(lambda: aiter(stream))

    @classmethod
    def from_sync(cls, stream: Iterable[bytes]) -> ReplayableBody:
        """Each pass iterates ``stream`` again, each chunk read in a worker thread."""
        return cls(lambda: _in_thread(iter(stream)))

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._passes():
            yield chunk


@dataclass(frozen=True)
class BodyKinds:
    """One HTTP library's request body classes (httpx's or httpx2's): the iterators', and multipart's."""

    async_iterator: type
    iterator: type
    multipart: type


_HTTPX = BodyKinds(AsyncIteratorByteStream, IteratorByteStream, MultipartStream)


def sent_as_read(stream: object, kinds: BodyKinds, *, sync: bool) -> OneShotBody | ReplayableBody | None:
    """``stream`` (a request's body, of the library ``kinds`` names) as the guard sends it as it is read: an
    iterator's or an async iterator's as a `OneShotBody`, a multipart upload whose files rewind as a
    `ReplayableBody` (read in worker threads for a ``sync`` caller); None for a body to read whole."""
    if isinstance(stream, kinds.async_iterator):
        return OneShotBody(cast("AsyncIterable[bytes]", stream))
    if isinstance(stream, kinds.iterator):
        return OneShotBody.from_sync(cast("Iterable[bytes]", stream))
    if isinstance(stream, kinds.multipart) and files_rewind(getattr(stream, "fields", None)):
        if sync:
            return ReplayableBody.from_sync(cast("Iterable[bytes]", stream))
        return ReplayableBody.of(cast("AsyncIterable[bytes]", stream))
    return None


def files_rewind(fields: object) -> bool:
    """Whether every field of a multipart body (httpx's or httpx2's ``MultipartStream.fields``) is read from its
    start on each pass: data, bytes or text, or a file that can seek."""
    if not isinstance(fields, list):
        return False
    return all(_rewinds(getattr(field, "file", b"")) for field in fields)


def _rewinds(file: object) -> bool:
    if isinstance(file, (str, bytes)):
        return True
    seekable = getattr(file, "seekable", None)
    try:
        return callable(seekable) and bool(seekable()) and callable(getattr(file, "seek", None))
    except (OSError, ValueError):  # e.g. a closed file
        return False


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


def streamed_body(request: httpx.Request) -> httpx.AsyncByteStream | None:
    """The request's body when the guard sends it as it is read: one that can be sent only once (an edge's
    `OneShotBody`, or an async iterator given to an `httpx.AsyncClient`) or a `ReplayableBody` (an edge's, or a
    multipart upload whose files rewind); None for a body the guard reads whole first."""
    stream = request.stream
    if isinstance(stream, (OneShotBody, ReplayableBody, AsyncIteratorByteStream)):
        return stream
    return sent_as_read(stream, _HTTPX, sync=False)


def rereadable(stream: object) -> bool:
    """Whether a request body can be read again from its start: one in memory (httpx's ``ByteStream``), a
    `ReplayableBody`, or a wrapper whose ``rereadable`` says its body is."""
    return isinstance(stream, (httpx.ByteStream, ReplayableBody)) or getattr(stream, "rereadable", False) is True


def sent_once(streamed: httpx.AsyncByteStream | None) -> bool:
    """Whether a `streamed_body` can be sent only once (an iterator's), so its call gets one attempt."""
    return streamed is not None and not isinstance(streamed, ReplayableBody)


def sync_streamed(request: httpx.Request) -> httpx.Request | None:
    """For a sync caller's request whose body is an iterator, or a multipart upload whose files rewind: the same
    request with that body as a `OneShotBody` or a `ReplayableBody` read in worker threads (the core is async);
    None for any other body."""
    body = sent_as_read(request.stream, _HTTPX, sync=True)
    if body is None:
        return None
    return httpx.Request(
        request.method, request.url, headers=request.headers.raw, stream=body, extensions=request.extensions
    )


def framing_headers(request: httpx.Request) -> list[tuple[bytes, bytes]]:
    """The framing headers of a streamed body: the caller's ``Content-Length`` if it gave one, else
    ``Transfer-Encoding: chunked`` (what httpx sends for an iterator)."""
    length = request.headers.get("content-length")
    if length is not None:
        return [(b"Content-Length", length.encode())]
    return [(b"Transfer-Encoding", b"chunked")]
