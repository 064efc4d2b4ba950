"""The exceptions llmguard_client raises.

Every failure the guard decides subclasses one of httpx's own exceptions, so a
caller's existing ``except httpx.TimeoutException`` / ``except httpx.TransportError``
keeps working::

    LLMGuardError                       base of everything below
    ├── GuardConfigError(ValueError)    bad configuration, raised at construction
    └── GuardFailure                    the guard gave up on a call (carries .record, .cause)
        ├── GuardRequestError(ValueError)   a call's own x-llmguard-* header names nothing configured (400)
        │   ├── UnknownTierError        a tier name that is not configured (also a GuardConfigError)
        │   ├── UnknownCohortError      an x-llmguard-cohort other than guarded / control
        │   └── WrongEventLoop          a call from a second event loop while the Guard's first one runs
        ├── GuardTimeout(httpx.TimeoutException)
        │   ├── TTFTTimeout             no first content token within the tier's ttft
        │   ├── TotalTimeout            the call outlived the tier's total deadline
        │   ├── StallTimeout            the stream went silent longer than the tier's stall
        │   └── AllAttemptsTimedOut     every attempt failed, the last in a timeout (e.g. the SDK's ``timeout=``)
        ├── GuardUnavailable(httpx.TransportError)
        │   ├── AllAttemptsFailed       every attempt failed (transport errors), none left to try; also the
        │   │   │                       httpx class of the last one's error (e.g. httpx.RemoteProtocolError)
        │   │   └── AllAttemptsFailedToConnect   ... every one to connect (also an httpx.ConnectError)
        │   ├── BudgetExhausted         a retry or hedge was needed, the shared budget was empty
        │   ├── AllReplicasCooling      every replica is cooling down past the deadline (.retry_after)
        │   ├── BulkheadFull            the tier's in-flight and waiting slots were all taken
        │   ├── RateLimited             the provider's rate limit has no room within the ttft (.retry_after)
        │   ├── Overloaded              the replica cannot serve the call within its ttft (.retry_after)
        │   └── GuardClosed             ``Guard.aclose()`` ended the call, or it started after the close
        └── GuardStreamError(httpx.RemoteProtocolError)   a 200 answer that was not a complete stream
            ├── UpstreamStreamError     the server reported an error inside the stream (.code, .overload)
            └── StreamTruncated         the body ended before the protocol's end marker

``GuardStreamError`` subclasses ``httpx.RemoteProtocolError``, the error httpx itself raises when a
peer ends a response body early ("incomplete chunked read"): a caller's ``except httpx.TransportError``
(or ``httpx.RemoteProtocolError``) around its stream iteration keeps catching it. After the first token
these are raised from the response body's iterator; before it they only end an attempt (it is retried
elsewhere) and are the ``__cause__`` of ``AllAttemptsFailed`` when no attempt is left.

Towards the openai SDK (and other Stainless-generated SDKs, which retry whatever a
transport raises) the guard's own refusals (a full bulkhead, an empty budget, every
replica cooling, a closed Guard) are returned as proxy-style HTTP responses instead (docs/usage.md,
"How failures reach the caller"). What a call's attempts met is raised in every mode: a
timeout as ``GuardTimeout`` (the SDK's timeout error), failures without an answer as
``AllAttemptsFailed`` (its connection error); the SDK's retry of a call the guard gave up
on (``final``) fails at once with the same error, and openai
>= 3, given its client by ``guard.http_client_for``, gets such a failure as its own error and
sends no retry at all (`llmguard_client.edges.sdk`). Whenever a server
did answer (a 429, a 503, a 500), the guard hands that answer back, in either mode, rather
than raising. ``BudgetExhausted``, ``AllReplicasCooling`` and ``RateLimited`` are refusals:
raised (or answered) as such only when they stop a call before anything was sent; after
attempts, the caller gets the attempts' own failure and the refusal is named in its
``cause`` (``x-llmguard-cause``).
"""

from __future__ import annotations

from typing import TypeVar, cast

import httpx

from llmguard_client.telemetry._record_builder import CallRecordBuilder  # at run time: get_type_hints resolves it
from llmguard_client.telemetry.record import PhaseRecord


class LLMGuardError(Exception):
    """Base class of every exception llmguard_client raises."""


class GuardConfigError(LLMGuardError, ValueError):
    """The configuration is invalid; the message names the field and what is accepted."""


class GuardFailure(LLMGuardError):
    """The guard gave up on a call.

    ``cause`` is a stable machine-readable string (also sent as the
    ``x-llmguard-cause`` header in response mode), ``status_code`` the HTTP status a
    proxy would answer with, ``retry_after`` the seconds the caller should wait (or
    None), ``record`` the call's phase record (frozen; final once the call has ended, as it has by the
    time the caller gets the error).
    """

    cause: str = "guard_failure"
    status_code: int = 502
    final: bool = False
    """True when the guard will not try this call again: it spent the attempts or the deadline the call had, and
    a retry of it (by the SDK, within its backoff) fails at once with the same error, sending nothing."""

    def __init__(
        self,
        message: str,
        *,
        request: httpx.Request | None = None,
        record: PhaseRecord | CallRecordBuilder | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self._record = record
        self.retry_after = retry_after
        self._guard_request = request

    @property
    def record(self) -> PhaseRecord | None:
        """The call's frozen `PhaseRecord`: the final one once the call ended, else a snapshot of it so far."""
        record = self._record
        if record is None or isinstance(record, PhaseRecord):
            return record
        return record.snapshot()


class GuardRequestError(GuardFailure, ValueError):
    """A call's own ``x-llmguard-*`` header asks for something the guard does not have.

    Checked for every call, whatever its rollout cohort (and while the guard is off), before
    anything is sent: the call would fail the same way again, so it is never retried (in response
    mode a 400 answer with ``x-should-retry: false``).
    """

    cause = "bad_request"
    status_code = 400


class UnknownTierError(GuardRequestError, GuardConfigError):
    """A tier name that is not configured: in a call's ``x-llmguard-tier`` header (cause
    ``unknown_tier``, a 400 in response mode), or given to ``guard.tier()`` or at construction."""

    cause = "unknown_tier"


class UnknownCohortError(GuardRequestError):
    """A call's ``x-llmguard-cohort`` header is neither ``guarded`` nor ``control``."""

    cause = "unknown_cohort"


class WrongEventLoop(GuardRequestError):
    """A call from an event loop other than the one the Guard's connections belong to, while that one still
    runs (e.g. two threads each running ``asyncio.run``): refused before anything is sent."""

    cause = "wrong_event_loop"


class GuardTimeout(GuardFailure, httpx.TimeoutException):
    """A tier deadline passed; the in-flight attempts were closed."""

    cause = "timeout"
    status_code = 504

    def __init__(self, message: str, **kwargs: object) -> None:
        request = kwargs.get("request")
        GuardFailure.__init__(self, message, **kwargs)  # type: ignore[arg-type]
        httpx.TimeoutException.__init__(self, message, request=request)  # type: ignore[arg-type]


class TTFTTimeout(GuardTimeout):
    cause = "ttft_timeout"


class TotalTimeout(GuardTimeout):
    cause = "total_timeout"


class StallTimeout(GuardTimeout, httpx.ReadTimeout):
    """No bytes for the tier's ``stall`` (or the caller's shorter read timeout) after the first token: also an
    ``httpx.ReadTimeout``, as the plain client's own read timeout mid-stream is (an SDK that does not wrap errors
    raised while a stream is read passes it on as it is)."""

    cause = "stall_timeout"


class AllAttemptsTimedOut(GuardTimeout):
    """Every attempt the guard sent failed, the last in a timeout (a read, connect, write or pool timeout, e.g.
    from the caller's own ``timeout=``; the earlier ones too, or failed otherwise): raised in every failure mode,
    so an SDK maps it to its timeout error (openai: ``APITimeoutError``); also the httpx class of the last
    attempt's timeout (`like_last_error`: an ``httpx.ReadTimeout`` for the caller's read timeout). ``__cause__``
    is the last attempt's timeout; ``cause`` is ``all_attempts_timed_out``, or the reason the guard sent no further
    attempt (``all_replicas_cooling``, ``budget_exhausted``, ...)."""

    cause = "all_attempts_timed_out"


class GuardUnavailable(GuardFailure, httpx.TransportError):
    """No attempt could produce an answer."""

    cause = "unavailable"
    status_code = 503

    def __init__(self, message: str, **kwargs: object) -> None:
        request = kwargs.get("request")
        GuardFailure.__init__(self, message, **kwargs)  # type: ignore[arg-type]
        httpx.TransportError.__init__(self, message, request=request)  # type: ignore[arg-type]


class AllAttemptsFailed(GuardUnavailable):
    """Every attempt the guard sent failed before a server answered (a refused or reset connection, a stream
    that was not one), and none is left to try: raised in every failure mode, so an SDK maps it to its
    connection error (openai: ``APIConnectionError``), as it maps the transport error a plain client meets.
    ``__cause__`` is the last attempt's error; ``cause`` is ``all_attempts_failed``, or the reason the guard
    sent no further attempt. Also raised, or answered with a 502 in response mode, when every replica's
    circuit is open with panic mode off: a refusal before anything was sent."""

    cause = "all_attempts_failed"
    status_code = 502


class AllAttemptsFailedToConnect(AllAttemptsFailed, httpx.ConnectError):
    """`AllAttemptsFailed` where every attempt failed to connect: also an ``httpx.ConnectError``, the error
    a plain httpx client raises for a server that refuses the connection."""


_like: dict[tuple[type[GuardFailure], type[httpx.RequestError]], type[GuardFailure]] = {}
_Kind = TypeVar("_Kind", bound=GuardFailure)


def like_last_error(kind: type[_Kind], error: BaseException | None) -> type[_Kind]:
    """``kind`` (`AllAttemptsFailed`, `AllAttemptsTimedOut`), raised when an attempt's ``error`` was the call's last:
    also that error's httpx class (``httpx.RemoteProtocolError`` for a server that hung up, ``httpx.ReadError``,
    ``httpx.ProxyError``, ``httpx.ReadTimeout``...), as a plain client's own retries raise the last error, so
    ``except httpx.RemoteProtocolError`` and an SDK's reading of the error's kind see what they would without the
    guard. An error of no httpx class, or one ``kind`` already is, gives ``kind`` itself."""
    bases = (c for c in type(error).__mro__ if issubclass(c, httpx.RequestError) and c.__module__ != __name__)
    base = next(bases, None)  # the library's own class (a guard failure's httpx base), by identity, not by name
    return kind if base is None or issubclass(kind, base) else _both(kind, base)


def _both(kind: type[_Kind], base: type[httpx.RequestError]) -> type[_Kind]:
    """The one class that is both ``kind`` and ``base``, made the first time it is asked for."""
    if (kind, base) not in _like:
        namespace = {"__module__": __name__, "__reduce__": _reduce_like, "_classes": (kind, base)}
        _like[kind, base] = type(kind.__name__, (kind, base), namespace)
    return cast("type[_Kind]", _like[kind, base])


def _reduce_like(error: GuardFailure) -> tuple[object, ...]:
    """Pickle such an error (to a process pool, a task queue) by its two classes, since its own class has no name
    pickle can look up; unpickled, it is an instance of the same class, its attributes restored."""
    return _unpickled_like, (*type(error)._classes, error.args), error.__dict__  # type: ignore[attr-defined]


def _unpickled_like(kind: type[_Kind], base: type[httpx.RequestError], args: tuple[object, ...]) -> _Kind:
    both = _both(kind, base)
    error = both.__new__(both)
    error.args = args
    return error


class BudgetExhausted(GuardUnavailable):
    cause = "budget_exhausted"
    status_code = 503


class AllReplicasCooling(GuardUnavailable):
    cause = "all_replicas_cooling"
    status_code = 429


class BulkheadFull(GuardUnavailable):
    cause = "bulkhead_full"
    status_code = 503


class RateLimited(GuardUnavailable):
    """The call does not fit the provider's rate limit (`RateLimit`) before its ttft deadline: refused
    before it was sent. ``retry_after`` is the computed wait (missing tokens / refill rate)."""

    cause = "rate_limited"
    status_code = 429


class Overloaded(GuardUnavailable):
    """Adaptive admission (`Admission`): the replica's learned limit is full and the call could not get its
    first token within its ttft deadline by waiting for a slot, so it was refused before it was sent.
    ``retry_after`` is the computed wait (the calls in line / the rate the replica frees slots)."""

    cause = "overloaded"
    status_code = 429


class GuardClosed(GuardUnavailable):
    """The Guard was closed: no attempt starts after ``aclose()``, and calls in flight end with this."""

    cause = "guard_closed"
    status_code = 503


class GuardStreamError(GuardFailure, httpx.RemoteProtocolError):
    """A 200 answer that was not a complete stream of its protocol (see `llmguard_client.protocols`).

    ``cause`` is ``stream_<kind>`` (``stream_error_event``, ``stream_truncated``, ``stream_malformed``,
    ``stream_json_body``, ...); ``code`` the server's own error code or type when it sent one,
    ``overload`` whether it signalled overload (503, 429, ``overloaded_error``).
    """

    cause = "stream_error"
    status_code = 502

    def __init__(
        self,
        message: str,
        *,
        cause: str | None = None,
        code: str | None = None,
        overload: bool = False,
        **kwargs: object,
    ) -> None:
        request = kwargs.get("request")
        GuardFailure.__init__(self, message, **kwargs)  # type: ignore[arg-type]
        httpx.RemoteProtocolError.__init__(self, message, request=request)  # type: ignore[arg-type]
        if cause is not None:
            self.cause = cause
        self.code = code
        self.overload = overload


class UpstreamStreamError(GuardStreamError):
    """The server sent an error event inside a 200 stream (vLLM's in-stream 503, Anthropic's
    ``event: error``, the Responses API's ``response.failed`` / ``error``)."""

    cause = "stream_error_event"


class StreamTruncated(GuardStreamError):
    """The body ended (EOF) before the protocol's end marker: ``[DONE]`` or a finish reason,
    ``response.completed`` / ``response.incomplete``, ``message_stop`` or a ``message_delta`` with a
    ``stop_reason``."""

    cause = "stream_truncated"
