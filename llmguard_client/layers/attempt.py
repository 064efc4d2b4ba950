"""One physical request to one replica, read up to its first content token.

An attempt ends in exactly one of two ways:
- `AttemptWin`: the first content token arrived (for a non-streaming body: the whole
  body; for an answer no protocol reader claims: its first bytes), or the stream ended
  complete without one. The open response and the bytes read so far are handed to the
  caller's side, which now owns them and must close them.
- `AttemptFailure`: an error status (its body read, bounded), a transport error, or
  (guarded calls) a 200 that failed before its first token: an in-stream error event, a
  malformed event, a plain body where a stream was asked for, an EOF before the end
  marker (`llmguard_client.protocols`). Its connection is already closed.

If the attempt is cancelled (it lost a hedge race, a deadline passed, the caller left),
its response is closed under a shielded scope, so the server sees the disconnect and
stops generating, and nothing outlives the call.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from anyio.streams.memory import MemoryObjectSendStream

from llmguard_client._call import Call
from llmguard_client._replicas import ReplicaState
from llmguard_client._retry_after import parse_retry_after
from llmguard_client.protocols import ResponseFacts, StreamFailure, StreamReader, read_opening, reader_for
from llmguard_client.protocols.errors import OVERLOAD_STATUSES
from llmguard_client.protocols.raising import stream_error
from llmguard_client.telemetry.record import AttemptKind, AttemptRecord

ERROR_BODY_LIMIT = 64 * 1024
"""Bytes of an error response kept to hand back to the caller."""
CLOSE_GRACE = 2.0
"""Seconds a shielded close may take before it is abandoned."""


@dataclass(slots=True)
class AttemptWin:
    """The first content token (or a complete body) arrived; the caller's side owns the response now."""

    attempt: AttemptRecord
    state: ReplicaState
    response: httpx.Response
    chunks: list[bytes]
    rest: AsyncIterator[bytes] | None
    """The unread remainder of the body; None when ``chunks`` already hold all of it."""
    reader: StreamReader
    """Its protocol's reader, fed every chunk so far; the caller's side keeps feeding it."""

    @property
    def facts(self) -> ResponseFacts:
        return self.reader.facts

    async def aclose(self) -> None:
        await close_quietly(self.response)


@dataclass(slots=True)
class AttemptFailure:
    """An attempt that produced no usable answer."""

    attempt: AttemptRecord
    state: ReplicaState
    error: BaseException | None = None
    status_code: int | None = None
    headers: httpx.Headers = field(default_factory=httpx.Headers)
    body: bytes = b""
    retry_after: float | None = None
    extensions: dict[str, Any] = field(default_factory=dict)
    stream_failure: StreamFailure | None = None
    """Set when a 200 answer failed before its first token (then ``status_code`` is the status the
    failure stands for, if any, and ``body`` an equivalent JSON error)."""

    @property
    def overload(self) -> bool:
        """The replica said it is overloaded (429/503/529, or an in-stream overload error)."""
        if self.stream_failure is not None:
            return self.stream_failure.overload
        return self.status_code in OVERLOAD_STATUSES

    @property
    def is_transport_error(self) -> bool:
        """A network-level failure (as opposed to an error status or an unexpected exception)."""
        return isinstance(self.error, (httpx.TransportError, OSError, anyio.BrokenResourceError, anyio.EndOfStream))

    @property
    def is_connect_error(self) -> bool:
        """The request never reached the server, so resending it cannot duplicate work."""
        return isinstance(self.error, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))


AttemptResult = AttemptWin | AttemptFailure


async def close_quietly(response: httpx.Response) -> None:
    """Close a response under a shield, within `CLOSE_GRACE`, swallowing transport errors."""
    with (
        anyio.CancelScope(shield=True),
        anyio.move_on_after(CLOSE_GRACE),
        contextlib.suppress(httpx.HTTPError, OSError),
    ):
        await response.aclose()


def error_kind(exc: BaseException) -> str:
    """A short, stable name for a transport error (``connect_error``, ``read_error``, ...)."""
    name = type(exc).__name__
    out = [name[0].lower()]
    for ch in name[1:]:
        out.append("_" + ch.lower() if ch.isupper() else ch)
    return "".join(out)


async def run_attempt(
    call: Call,
    state: ReplicaState,
    kind: AttemptKind,
    results: MemoryObjectSendStream[AttemptResult],
    lost: Callable[[], bool],
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Send ``call`` to ``state``, read to its first token, and put the result on ``results``.

    ``lost()`` tells, when the attempt is cancelled, whether another attempt won (outcome
    ``lost``) or the call itself ended (outcome ``cancelled``).
    """
    attempt = AttemptRecord(index=len(call.record.attempts), replica=state.name, kind=kind, start=clock())
    call.record.attempts.append(attempt)
    state.in_flight += 1
    response: httpx.Response | None = None
    handed_off = False
    try:
        request = call.attempt_request(state, attempt)
        _trace_sent(request, attempt, clock)
        response = await state.transport.handle_async_request(request)
        attempt.headers = clock()
        if attempt.sent is None:
            attempt.sent = attempt.headers
        attempt.status_code = response.status_code
        if response.status_code >= 400:
            body = await _read_limited(response, ERROR_BODY_LIMIT)
            attempt.finish = clock()
            attempt.outcome = "failed"
            attempt.error = f"http_{response.status_code}"
            attempt.retry_after = parse_retry_after(response.headers)
            results.send_nowait(
                AttemptFailure(
                    attempt,
                    state,
                    status_code=response.status_code,
                    headers=response.headers,
                    body=body,
                    retry_after=attempt.retry_after,
                    extensions=dict(response.extensions),
                )
            )
            return
        content_type = response.headers.get("content-type", "")
        reader = reader_for(request.method, request.url.path, content_type, call.record.stream)
        opening = await read_opening(_body(response), reader)
        failure = reader.failure
        if failure is not None and call.guarded:  # before the first token: a failed attempt, like a 503
            results.send_nowait(_stream_failure(call, attempt, state, failure, response, clock))
            return
        attempt.first_token = clock()
        if opening.rest is None:
            attempt.finish = attempt.first_token
        handed_off = True
        results.send_nowait(AttemptWin(attempt, state, response, opening.chunks, opening.rest, reader))
    except anyio.get_cancelled_exc_class():
        attempt.outcome = "lost" if lost() else "cancelled"
        attempt.finish = clock()
        raise
    except Exception as exc:  # transport errors are retryable failures; anything else ends the call as-is
        attempt.finish = clock()
        attempt.outcome = "failed"
        attempt.error = error_kind(exc)
        results.send_nowait(AttemptFailure(attempt, state, error=exc))
    finally:
        if not handed_off:
            state.in_flight -= 1
            if response is not None:
                await close_quietly(response)
            call.observation.attempt_finished(attempt)


def _body(response: httpx.Response) -> httpx.AsyncByteStream:
    stream = response.stream
    assert isinstance(stream, httpx.AsyncByteStream)
    return stream


def _stream_failure(
    call: Call,
    attempt: AttemptRecord,
    state: ReplicaState,
    failure: StreamFailure,
    response: httpx.Response,
    clock: Callable[[], float],
) -> AttemptFailure:
    """A 200 that failed before its first token, as a failed attempt: with the status its error stands
    for (a JSON error body to hand back if it is the call's last answer), else as a stream error."""
    attempt.finish = clock()
    attempt.outcome = "failed"
    attempt.error = failure.cause
    attempt.retry_after = failure.retry_after
    error = None
    headers = httpx.Headers({"content-type": "application/json", "x-llmguard-stream-failure": failure.kind})
    if failure.retry_after is not None:
        headers["retry-after"] = str(failure.retry_after)
    if failure.status is None:
        error = stream_error(failure, replica=state.name, request=call.request, after_first_token=False)
    return AttemptFailure(
        attempt,
        state,
        error=error,
        status_code=failure.status,
        headers=headers,
        body=failure.body,
        retry_after=failure.retry_after,
        extensions=dict(response.extensions),
        stream_failure=failure,
    )


async def _read_limited(response: httpx.Response, limit: int) -> bytes:
    stream = _body(response)
    parts: list[bytes] = []
    size = 0
    async for chunk in stream:
        parts.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(parts)[:limit]


def _trace_sent(request: httpx.Request, attempt: AttemptRecord, clock: Callable[[], float]) -> None:
    """Stamp ``attempt.sent`` when httpcore reports the request body written."""
    inner = request.extensions.get("trace")

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event.endswith("send_request_body.complete"):
            attempt.sent = clock()
        if inner is not None:
            result = inner(event, info)
            if hasattr(result, "__await__"):
                await result

    request.extensions["trace"] = trace
