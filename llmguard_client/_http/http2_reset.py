"""Telling an HTTP/2 server that an answer is no longer wanted.

Over HTTP/1.1 a response closed before its end closes its connection: the server sees the disconnect and stops
generating (vLLM aborts the request). httpcore 1.0's HTTP/2 connection only forgets such a stream and sends the
server nothing (encode/httpcore#943), so a hedge's loser, a call past its deadline or a stream its caller stopped
reading went on being generated to its end. `reset_unfinished` sends the stream's ``RST_STREAM`` (``CANCEL``), as
an HTTP/2 client that abandons a stream should, before the guard closes the response. A request abandoned before
its response headers came (a loser or a deadline while the server had not answered yet) has no response to act
on: `reset_when_abandoned` has httpcore report, through its ``trace`` hook, the moment it drops such a stream, and
resets it then. A pool of another kind (HTTP/1.1, a mock, a transport of the user's) is left to close as it does.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpcore
import httpx

logger = logging.getLogger("llmguard_client")

CANCEL = 0x8
"""HTTP/2's error code for "the stream is no longer needed" (RFC 9113, section 7)."""
RESET_GRACE = 1.0
"""Seconds a reset sent while httpcore drops a stream may take to write (a server that stopped reading)."""
_DROPPED = "http2.response_closed.started"
"""The trace event httpcore reports when it forgets a stream, before it does."""
_LINKS = ("_raw", "_httpcore_stream", "_stream")
"""The attributes that lead from an httpx response's stream to httpcore's HTTP/2 stream: the guard's decoding
wrapper, httpx's ``AsyncResponseStream``, httpcore's ``PoolByteStream``."""


def _h2_stream(response: httpx.Response) -> object | None:
    """httpcore's HTTP/2 byte stream under ``response``, or None."""
    stream: object = response.stream
    for _ in range(len(_LINKS) + 1):
        if isinstance(getattr(stream, "_connection", None), httpcore.AsyncHTTP2Connection):
            return stream
        stream = next((getattr(stream, link) for link in _LINKS if hasattr(stream, link)), None)
        if stream is None:
            return None
    return None


async def reset_unfinished(response: httpx.Response) -> None:
    """Reset ``response``'s HTTP/2 stream if the server may still be sending it (best effort: a connection that
    has failed or closed meanwhile has nothing left to tell)."""
    stream = _h2_stream(response)
    if stream is None:
        return
    await _reset(stream._connection, stream._stream_id, stream._request)  # type: ignore[attr-defined]


def reset_when_abandoned(request: httpx.Request, transport: httpx.AsyncBaseTransport) -> None:
    """Have ``request``'s HTTP/2 stream reset if httpcore drops it unfinished, before or after its response
    headers (a cancelled or failed send, a response closed early). Only for an httpx transport whose pool may
    speak HTTP/2 (the hook costs a call per httpcore event); the caller's own ``trace`` hook is still called first."""
    pool = getattr(transport, "_pool", None)
    if not isinstance(pool, httpcore.AsyncConnectionPool) or not getattr(pool, "_http2", False):
        return
    theirs: Callable[[str, dict[str, Any]], Awaitable[None]] | None = request.extensions.get("trace")

    async def trace(event: str, info: dict[str, Any]) -> None:
        if theirs is not None:
            await theirs(event, info)
        if event == _DROPPED:
            sent = _sent_with(pool, trace)
            if sent is not None:
                with anyio.move_on_after(RESET_GRACE, shield=True):
                    await _reset(sent[0], info["stream_id"], sent[1])

    request.extensions = {**request.extensions, "trace": trace}


def _sent_with(
    pool: httpcore.AsyncConnectionPool, trace: object
) -> tuple[httpcore.AsyncHTTP2Connection, httpcore.Request] | None:
    """The HTTP/2 connection ``pool`` assigned to the request whose ``trace`` hook this is, and httpcore's
    request (None: not in the pool, or not on an HTTP/2 connection)."""
    for queued in list(getattr(pool, "_requests", ())):
        request: httpcore.Request = queued.request
        if request.extensions.get("trace") is trace:
            connection: object = queued.connection
            for _ in range(3):  # the pool's connection, a proxy's tunnel, the HTTP/2 connection itself
                if isinstance(connection, httpcore.AsyncHTTP2Connection):
                    return connection, request
                connection = getattr(connection, "_connection", None)
            return None
    return None


async def _reset(connection: Any, stream_id: int, request: httpcore.Request) -> None:
    """Send ``RST_STREAM`` (``CANCEL``) for ``stream_id`` on ``connection`` if the stream is still open."""
    try:
        h2_state = connection._h2_state
        h2_stream = h2_state.streams.get(stream_id)
        if h2_stream is None or h2_stream.closed:
            return
        h2_state.reset_stream(stream_id, error_code=CANCEL)
        await connection._write_outgoing_data(request)
    except Exception:  # the connection failed or closed in between: the server has seen it go
        logger.debug("resetting an abandoned HTTP/2 stream failed", exc_info=True)
