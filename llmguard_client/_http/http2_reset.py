"""Telling an HTTP/2 server that an answer is no longer wanted.

Over HTTP/1.1 a response closed before its end closes its connection: the server sees the disconnect and stops
generating (vLLM aborts the request). httpcore 1.0's HTTP/2 connection only forgets such a stream and sends the
server nothing (encode/httpcore#943), so a hedge's loser, a call past its deadline or a stream its caller stopped
reading went on being generated to its end. `reset_unfinished` sends the stream's ``RST_STREAM`` (``CANCEL``), as
an HTTP/2 client that abandons a stream should, before the guard closes the response. A pool of another kind
(HTTP/1.1, a mock, a transport of the user's) is left to close as it does.
"""

from __future__ import annotations

import logging

import httpcore
import httpx

logger = logging.getLogger("llmguard_client")

CANCEL = 0x8
"""HTTP/2's error code for "the stream is no longer needed" (RFC 9113, section 7)."""
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
    connection = stream._connection  # type: ignore[attr-defined]
    stream_id: int = stream._stream_id  # type: ignore[attr-defined]
    try:
        h2_state = connection._h2_state
        h2_stream = h2_state.streams.get(stream_id)
        if h2_stream is None or h2_stream.closed:
            return
        h2_state.reset_stream(stream_id, error_code=CANCEL)
        await connection._write_outgoing_data(stream._request)  # type: ignore[attr-defined]
    except Exception:  # the connection failed or closed in between: the server has seen it go
        logger.debug("resetting an abandoned HTTP/2 stream failed", exc_info=True)
