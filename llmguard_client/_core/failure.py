"""How a call the guard gave up on reaches the caller.

The openai SDK (like every Stainless-generated SDK) retries whatever a transport
raises, up to ``max_retries`` times with sleeps, but obeys ``x-should-retry: false``
on a response. So in *response mode* a refusal of the guard's, made before anything was sent,
comes back the way a proxy would answer it: 429/503 for overload (with Retry-After when known),
502 when every circuit is open, 503 after ``Guard.aclose()``, 400 for an ``x-llmguard-*`` header
naming no tier or cohort (`GuardRequestError`), always with ``x-should-retry: false``, an OpenAI-format
JSON error whose message names the tier, the limit, the elapsed time and the
attempts, and the machine-readable cause in ``x-llmguard-cause``. The SDK then raises
its usual typed error (``APIStatusError`` subclasses) at once. What the call's attempts
met is raised in every mode, as a plain client would raise it: a timeout
(`AllAttemptsTimedOut`, a tier deadline) or a failure without an answer (`AllAttemptsFailed`).

When a server did answer (a 429, a 503, a 500...), the caller gets that answer
itself, with the same two headers added. In *raise mode* (plain httpx callers), the
guard's own failures are raised as `GuardFailure` subclasses of httpx's exceptions.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator

import httpx

from llmguard_client._core.call import Call
from llmguard_client._core.headers import CAUSE_HEADER
from llmguard_client._core.outcome import AttemptFailure
from llmguard_client._http.error_body import ERROR_BODY_LIMIT, ReadBound, WholeErrorBody
from llmguard_client.config import deadline_text
from llmguard_client.errors import (
    AllAttemptsFailed,
    AllAttemptsFailedToConnect,
    AllAttemptsTimedOut,
    GuardClosed,
    GuardFailure,
    GuardTimeout,
    StallTimeout,
    TotalTimeout,
    like_last_error,
)
from llmguard_client.telemetry._record_builder import AnyCall
from llmguard_client.telemetry.record import PhaseRecord

_DROPPED = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive"})


def describe_attempts(record: AnyCall) -> str:
    """'2 attempt(s): primary http://a: cancelled; hedge http://b: failed (http_503)'."""
    parts = []
    for a in record.attempts:
        detail = f" ({a.error})" if a.error else ""
        parts.append(f"{a.kind} {a.replica}: {a.outcome}{detail}")
    return f"{len(record.attempts)} attempt(s)" + (": " + "; ".join(parts) if parts else "")


def attempts_error(
    call: Call, failures: list[AttemptFailure], refusal: GuardFailure | None
) -> AllAttemptsFailed | AllAttemptsTimedOut:
    """The error a call's attempts met when none got a server answer, of the last attempt's httpx class
    (`like_last_error`), as the plain SDK's own retries raise their last request's error: `AllAttemptsTimedOut`
    when the last one ended in a timeout (every one, or the caller's own read timeout on a retry after a refused
    connection, say), `AllAttemptsFailedToConnect` when every one failed to connect, else `AllAttemptsFailed`;
    ``__cause__`` the last attempt's error. ``refusal``, why the guard sent no further attempt (cooling, budget,
    open circuits), is named in the message and the cause, but never changes the type: a refusal only speaks for
    itself before anything was sent."""
    last = failures[-1].error
    timed_out = isinstance(last, httpx.TimeoutException)
    if all(isinstance(f.error, httpx.TimeoutException) for f in failures):
        what = "timed out"
    elif timed_out:
        what = "failed before its first token, the last one at a timeout"
    else:
        what = "failed before its first token"  # some with an answer that was none
    message = (
        f"every attempt {what} (tier {call.tier_name!r}, {call.clock() - call.record.start:.3f}s elapsed); "
        f"{describe_attempts(call.record)}; the last one's error: {type(last).__name__}"
    )
    if str(last):  # a certificate the server's TLS failed to verify, say: what plain httpx would have said
        message += f": {last}"
    if refusal is not None:
        message += f"; no further attempt: {refusal.message}"
    kind: type[AllAttemptsFailed | AllAttemptsTimedOut]
    if timed_out:
        kind = like_last_error(AllAttemptsTimedOut, last)
    elif all(isinstance(f.error, httpx.ConnectError) for f in failures):
        kind = AllAttemptsFailedToConnect
    else:
        kind = like_last_error(AllAttemptsFailed, last)
    error = kind(
        message,
        request=call.request,
        record=call.record,
        retry_after=refusal.retry_after if refusal is not None else None,
    )
    if refusal is not None:
        error.cause = refusal.cause
    error.__cause__ = failures[-1].error
    return error


def _retry_after_headers(seconds: float | None) -> dict[str, str]:
    if seconds is None:
        return {}
    return {"retry-after": str(max(0, math.ceil(seconds))), "retry-after-ms": str(max(0, round(seconds * 1000)))}


def failure_response(error: GuardFailure, request: httpx.Request, record: PhaseRecord | None) -> httpx.Response:
    """A proxy-style error response for a failure the guard decided (``record`` None: the call was
    refused before it started, e.g. after ``Guard.aclose()`` or for an unknown tier)."""
    body = {
        "error": {
            "message": error.message,
            "type": "llmguard_error",
            "code": error.cause,
            "param": None,
            "tier": record.tier if record is not None else None,
            "attempts": len(record.attempts) if record is not None else 0,
        }
    }
    headers = {
        "content-type": "application/json",
        "x-should-retry": "false",
        CAUSE_HEADER: error.cause,
        **_retry_after_headers(error.retry_after),
    }
    return httpx.Response(
        error.status_code,
        headers=headers,
        content=json.dumps(body).encode(),
        request=request,
        extensions={"llmguard": record} if record is not None else {},
    )


def untold_answer(status: int) -> bytes:
    """The body of a server's answer handed back again (cooperative mode: the SDK's retry may not be sent after
    all) when the guard did not keep it (longer than `ERROR_BODY_LIMIT`): an OpenAI-format JSON error saying so,
    never the body cut."""
    message = (
        f"the retry budget is empty: this retry was not sent; the server's last answer ({status}) had a body "
        f"longer than the {ERROR_BODY_LIMIT // 1024} KiB the guard keeps, so it is not repeated here"
    )
    error = {"message": message, "type": "llmguard_error", "code": "budget_exhausted", "param": None}
    return json.dumps({"error": error}).encode()


def read_timeout(call: Call, stalled: bool, *, what: str, during: str) -> GuardTimeout:
    """The error for a read of ``call``'s answer past the tier's stall limit (``stalled``) or its total deadline:
    ``what`` stalled, or the deadline passed ``during`` that read; the connection is closed by then."""
    tier, name = call.tier, call.tier_name
    elapsed = call.clock() - call.record.start
    if stalled:
        return StallTimeout(
            f"{what} stalled: no bytes for {tier.stall}s (tier {name!r} stall limit) "
            f"{during}, {elapsed:.3f}s into the call; the connection was closed",
            request=call.request,
            record=call.record,
        )
    return TotalTimeout(
        f"the call exceeded the total deadline of tier {name!r} ({deadline_text(tier.total)}; "
        f"{elapsed:.3f}s elapsed, {during}); the connection was closed",
        request=call.request,
        record=call.record,
    )


def read_bound(call: Call) -> ReadBound:
    """``call``'s stall and total deadlines over the rest of a server's error answer it hands on: a server that
    drips it ends in the call's `StallTimeout` or `TotalTimeout`, as a stream that drips does."""

    def expired(stalled: bool) -> GuardTimeout:
        return read_timeout(call, stalled, what="the server's error answer", during="while its body was read")

    def closed() -> GuardClosed | None:
        if not call.lease.guard_closed:
            return None
        why = "the Guard was closed while the server's error answer was being read; the connection was closed"
        return GuardClosed(why, request=call.request, record=call.record)

    return ReadBound(call.time.loop_deadline(call.total_deadline), call.tier.stall or math.inf, expired, closed)


def upstream_response(
    failure: AttemptFailure,
    cause: str | None,
    call: Call,
    record: PhaseRecord,
    *,
    no_retry: bool,
    as_sent: bool = False,
) -> httpx.Response:
    """The last server answer, handed back as it was, its body whole (the rest of a long one read on from the
    server within the call's deadlines, `AttemptFailure.unread`: the caller's lease must not close it); ``cause``
    and ``no_retry`` mark it for the caller (``x-llmguard-cause``, ``x-should-retry: false``). With ``as_sent``, a
    200 whose error event the SDK reads itself is handed back as it came (`AttemptFailure.as_sent`), not as the
    status its error stands for."""
    sent = failure.as_sent if as_sent else None
    status, raw, body = sent or (failure.status_code or 502, failure.headers, failure.body)
    unread = failure.unread if sent is None else None
    headers = [(k, v) for k, v in raw.multi_items() if k.lower() not in _DROPPED]
    response = httpx.Response(
        status,
        headers=headers,
        content=body if unread is None else None,
        stream=WholeErrorBody(body, unread, read_bound(call)) if unread is not None else None,
        request=call.request,
        extensions={**failure.extensions, "llmguard": record},
    )
    if cause is not None:
        response.headers[CAUSE_HEADER] = cause
    if no_retry:
        response.headers["x-should-retry"] = "false"
    return response


def met_reading(failure: AttemptFailure, call: Call, record: PhaseRecord) -> httpx.Response:
    """A stream that failed as it was read, after its headers, before its first token (`AttemptFailure.failed_reading`:
    a cut, a reset, the caller's own read timeout), handed on as the caller had met it without a guard: the answer,
    what came of its body, then that error raised by the next read (`AttemptFailure.as_sent`)."""
    assert failure.as_sent is not None and failure.failed_reading and isinstance(failure.error, Exception)
    status, raw, body = failure.as_sent
    headers = [(k, v) for k, v in raw.multi_items() if k.lower() not in _DROPPED]
    return httpx.Response(
        status,
        headers=headers,
        stream=_ThenRaises(body, failure.error),
        request=call.request,
        extensions={**failure.extensions, "llmguard": record},
    )


class _ThenRaises(httpx.AsyncByteStream):
    """``body``, then ``error`` raised."""

    __slots__ = ("_body", "_error")

    def __init__(self, body: bytes, error: Exception) -> None:
        self._body = body
        self._error = error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._body:
            yield self._body
        raise self._error
