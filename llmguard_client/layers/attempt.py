"""The innermost handler: one physical request to one replica, read up to its first content token.

An attempt ends in exactly one of two ways:
- `Win`: the first content token arrived (for a non-streaming or an error-free body
  without tokens: the whole body). The open response, the bytes read so far and the
  replica's in-flight count stay with the call's lease, which closes them when the call ends.
- `Failed`: an error status (its body read, bounded), or a transport error. Its
  connection is closed and its in-flight count released before it returns.

Everything is registered on the lease the moment it is acquired, so an attempt cancelled at
any point (it lost a hedge race, a deadline passed, the caller left, the Guard closed)
leaves nothing behind: its response is closed under a shielded scope, so the server sees
the disconnect and stops generating.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx

from llmguard_client._call import Call
from llmguard_client._clock import Clock
from llmguard_client._errors import GuardClosed
from llmguard_client._lease import Hold, LeaseRegistry
from llmguard_client._outcome import AttemptFailure, Failed, Outcome, Route, Win
from llmguard_client._replicas import ReplicaState
from llmguard_client._retry_after import parse_retry_after
from llmguard_client._sse import SSEScanner, body_facts
from llmguard_client.telemetry.record import AttemptRecord

ERROR_BODY_LIMIT = 64 * 1024
"""Bytes of an error response kept to hand back to the caller."""


def error_kind(exc: BaseException) -> str:
    """A short, stable name for a transport error (``connect_error``, ``read_error``, ...)."""
    name = type(exc).__name__
    out = [name[0].lower()]
    for ch in name[1:]:
        out.append("_" + ch.lower() if ch.isupper() else ch)
    return "".join(out)


class AttemptLayer:
    """Sends one attempt; the last handler of the pipeline."""

    def __init__(self, registry: LeaseRegistry) -> None:
        self._registry = registry

    async def __call__(self, call: Call, route: Route) -> Outcome:
        state = route.replica
        assert state is not None, "the retry layer routes every attempt"
        if self._registry.closed:
            raise GuardClosed("the Guard was closed; no new attempt is sent", request=call.request, record=call.record)
        clock = call.clock
        attempt = AttemptRecord(index=len(call.record.attempts), replica=state.name, kind=route.kind, start=clock())
        call.record.attempts.append(attempt)
        if route.payment is not None:
            route.payment.settle()
        state.in_flight += 1
        in_flight = call.lease.hold(state.leave)
        response: httpx.Response | None = None
        won = False
        try:
            request = call.attempt_request(state, attempt)
            _trace_sent(request, attempt, clock)
            response = await state.transport.handle_async_request(request)
            call.lease.own(response)
            attempt.headers = clock()
            if attempt.sent is None:
                attempt.sent = attempt.headers
            attempt.status_code = response.status_code
            if response.status_code >= 400:
                return Failed([await _error_status(attempt, state, response, clock)])
            win = await _read_to_first_token(attempt, state, response, clock, in_flight)
            won = True
            return win
        except anyio.get_cancelled_exc_class():
            winner = call.winner
            attempt.outcome = "lost" if winner is not None and winner.attempt is not attempt else "cancelled"
            attempt.finish = clock()
            raise
        except GuardClosed:
            raise
        except Exception as exc:  # transport errors are retryable failures; the retry layer judges others
            attempt.finish = clock()
            attempt.outcome = "failed"
            attempt.error = error_kind(exc)
            return Failed([AttemptFailure(attempt, state, error=exc)])
        finally:
            if not won:
                if response is not None:
                    await call.lease.close_response(response)
                in_flight.release()
                call.observation.attempt_finished(attempt)


async def _error_status(
    attempt: AttemptRecord, state: ReplicaState, response: httpx.Response, clock: Clock
) -> AttemptFailure:
    body = await _read_limited(response, ERROR_BODY_LIMIT)
    attempt.finish = clock()
    attempt.outcome = "failed"
    attempt.error = f"http_{response.status_code}"
    attempt.retry_after = parse_retry_after(response.headers)
    return AttemptFailure(
        attempt,
        state,
        status_code=response.status_code,
        headers=response.headers,
        body=body,
        retry_after=attempt.retry_after,
        extensions=dict(response.extensions),
    )


async def _read_to_first_token(
    attempt: AttemptRecord, state: ReplicaState, response: httpx.Response, clock: Clock, in_flight: Hold
) -> Win:
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
                return Win(attempt, state, response, chunks, rest, scanner, scanner.facts, in_flight)
        # The stream ended without any content token (e.g. an empty completion): it is complete.
        attempt.first_token = attempt.finish = clock()
        return Win(attempt, state, response, chunks, None, scanner, scanner.facts, in_flight)
    async for chunk in stream:
        chunks.append(chunk)
    attempt.first_token = attempt.finish = clock()
    return Win(attempt, state, response, chunks, None, None, body_facts(b"".join(chunks)), in_flight)


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


def _trace_sent(request: httpx.Request, attempt: AttemptRecord, clock: Clock) -> None:
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
