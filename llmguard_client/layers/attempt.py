"""One physical request to one replica, read up to its first content token.

An attempt ends in exactly one of two ways:
- `AttemptWin`: the first content token arrived (for a non-streaming or an error-free
  body without tokens: the whole body). The open response and the bytes read so far
  are handed to the caller's side, which now owns them and must close them.
- `AttemptFailure`: an error status (its body read, bounded), or a transport error.
  Its connection is already closed.

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
from llmguard_client._sse import ResponseFacts, SSEScanner, body_facts
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
    scanner: SSEScanner | None
    facts: ResponseFacts

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
        win = await _read_to_first_token(attempt, state, response, clock)
        handed_off = True
        results.send_nowait(win)
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


async def _read_to_first_token(
    attempt: AttemptRecord, state: ReplicaState, response: httpx.Response, clock: Callable[[], float]
) -> AttemptWin:
    stream = response.stream
    assert isinstance(stream, httpx.AsyncByteStream)
    chunks: list[bytes] = []
    if "text/event-stream" in response.headers.get("content-type", ""):
        scanner = SSEScanner()
        rest = stream.__aiter__()
        async for chunk in rest:
            chunks.append(chunk)
            if scanner.feed(chunk):
                attempt.first_token = clock()
                return AttemptWin(attempt, state, response, chunks, rest, scanner, scanner.facts)
        # The stream ended without any content token (e.g. an empty completion): it is complete.
        attempt.first_token = attempt.finish = clock()
        return AttemptWin(attempt, state, response, chunks, None, scanner, scanner.facts)
    async for chunk in stream:
        chunks.append(chunk)
    attempt.first_token = attempt.finish = clock()
    return AttemptWin(attempt, state, response, chunks, None, None, body_facts(b"".join(chunks)))


async def _read_limited(response: httpx.Response, limit: int) -> bytes:
    stream = response.stream
    assert isinstance(stream, httpx.AsyncByteStream)
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
