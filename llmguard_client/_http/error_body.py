"""An error answer's body: its first bytes read to judge it, the rest left with the server until it is handed on.

The guard judges an error answer (retry it, cool its replica, hand it back) from its status and headers, and
keeps at most `ERROR_BODY_LIMIT` bytes of its body (`read_head`): memory stays bounded however long the body.
A longer body is not cut: its rest stays unread on the open response (`Unread`), and the answer handed to the
caller reads it there after the bytes kept (`WholeErrorBody`), so the caller gets the server's answer whole,
as without a guard, within the call's stall and total deadlines (`ReadBound`). An answer that is not handed on
(it is retried, or another attempt won) is closed unread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
import httpx

ERROR_BODY_LIMIT = 64 * 1024
"""Bytes of an error answer's body the guard reads while it judges the answer, and keeps (a cooperative retry's
replay keeps a body no longer than this); the caller gets the whole body."""


@dataclass(slots=True, eq=False)
class Unread:
    """The rest of an error answer's body, still with the server: ``chunks`` read on from ``response``."""

    response: httpx.Response
    chunks: AsyncIterator[bytes]
    cut: httpx.TransportError | None = None
    """The error that ended the body before its end, which ``chunks`` raises (None: the rest is with the server)."""


async def read_head(response: httpx.Response, limit: int = ERROR_BODY_LIMIT) -> tuple[bytes, Unread | None]:
    """The body's first ``limit`` bytes, and its rest if it goes on (None: ``head`` is all of it). A body cut or
    reset before its end: the bytes that came, and a rest that raises that error when read (`Unread.cut`), as the
    caller's read of it does without a guard (a timeout is raised here)."""
    stream = response.stream
    assert isinstance(stream, httpx.AsyncByteStream)
    chunks = stream.__aiter__()
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        try:
            chunk = await chunks.__anext__()
        except StopAsyncIteration:
            return b"".join(parts), None
        except httpx.TimeoutException:
            raise
        except httpx.TransportError as exc:
            return b"".join(parts), Unread(response, _raising(exc), exc)
        parts.append(chunk)
        size += len(chunk)
    whole = b"".join(parts)
    return whole[:limit], Unread(response, _after(whole[limit:], chunks))


async def _raising(error: httpx.TransportError) -> AsyncIterator[bytes]:
    raise error
    yield b""  # pragma: no cover - makes this an async generator


async def _after(first: bytes, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in chunks:
        yield chunk


@dataclass(frozen=True, slots=True)
class ReadBound:
    """The call's deadlines over the rest of a handed-on error body: each read within ``stall`` seconds, the last
    by ``until`` (the event loop's time); past either, ``expired(stalled)`` is raised (the call's `StallTimeout` or
    `TotalTimeout`), as for a stream's reads. A server that drips its error body is bounded as one that drips a
    stream is."""

    until: float
    stall: float
    expired: Callable[[bool], Exception]
    closed: Callable[[], Exception | None]
    """The error for a read that failed because the Guard was closed meanwhile (None while it is open): the
    caller's error says so, as for a stream's reads."""


class WholeErrorBody(httpx.AsyncByteStream):
    """An error answer's body as the caller gets it: the bytes the guard kept, then the rest from the server,
    within the call's deadlines (``bound``); closing it closes the server's response."""

    __slots__ = ("_bound", "_head", "_unread")

    def __init__(self, head: bytes, unread: Unread, bound: ReadBound) -> None:
        self._head = head
        self._unread = unread
        self._bound = bound

    async def __aiter__(self) -> AsyncIterator[bytes]:
        head, self._head = self._head, b""
        if head:
            yield head
        bound, chunks = self._bound, self._unread.chunks
        while True:
            left = bound.until - anyio.current_time()
            with anyio.move_on_after(min(bound.stall, left)) as scope:
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    return
                except httpx.TransportError as exc:
                    closed = bound.closed()
                    if closed is None:
                        raise
                    raise closed from exc
            if scope.cancelled_caught:
                with anyio.CancelScope(shield=True):
                    await self.aclose()
                raise bound.expired(bound.stall <= left)
            yield chunk

    async def aclose(self) -> None:
        aclose = getattr(self._unread.chunks, "aclose", None)
        try:
            if aclose is not None:
                await aclose()
        finally:
            await self._unread.response.aclose()
