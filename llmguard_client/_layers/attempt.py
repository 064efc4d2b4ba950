"""The innermost handler: one physical request to one replica, read up to its first content token.

An attempt ends in exactly one of two ways:
- `Win`: the first content token arrived (for a non-streaming body: the whole body; for an
  answer no protocol reader claims: its first bytes), or the stream ended complete without
  one; or, for a call whose opening the caller reads as it comes (`Call.opening_live`), its
  headers. The open response, the bytes read so far and the replica's in-flight count stay with
  the call's lease, which closes them when the call ends.
- `Failed`: an error status (its body read up to 64 KiB, `llmguard_client._http.error_body`; a longer one's
  response is left open, its rest unread, for the caller if it is the call's last answer), a transport error, or
  a 200 that failed before its first token: an in-stream error event, a malformed event, a
  plain body where a stream was asked for, an EOF before the end marker
  (`llmguard_client.protocols`). Its connection is closed (but for an unread error body's) and its
  in-flight count released before it returns.

Everything is registered on the lease the moment it is acquired, so an attempt cancelled at
any point (it lost a hedge race, a deadline passed, the caller left, the Guard closed)
leaves nothing behind: its response is closed under a shielded scope, so the server sees
the disconnect and stops generating.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from llmguard_client._core.call import Call
from llmguard_client._core.clock import Clock
from llmguard_client._core.lease import LeaseRegistry
from llmguard_client._core.outcome import AttemptFailure, Failed, Outcome, Route, Win
from llmguard_client._http.encoding import decode_in_place
from llmguard_client._http.error_body import read_head
from llmguard_client._http.http2_reset import reset_when_abandoned
from llmguard_client._http.network_stream import for_caller
from llmguard_client._http.retry_after import parse_retry_after
from llmguard_client._http.upload import rereadable
from llmguard_client._routing.replicas import ReplicaState
from llmguard_client.errors import GuardClosed
from llmguard_client.protocols import Opening, StreamFailure, read_opening, reader_for
from llmguard_client.protocols.raising import stream_error
from llmguard_client.telemetry._record_builder import ATTEMPT_EXTENSION, AttemptRecordBuilder
from llmguard_client.telemetry.record import AttemptOutcome


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
        attempt = call.record.attempt_started(state.name, route.kind, clock(), route.resumes)
        in_flight = call.lease.occupy(state)
        response: httpx.Response | None = None
        read: list[bytes] = []  # the answer's chunks before its first token
        won = False
        try:
            request = stamp_sent(call.attempt_request(state, attempt, route.body), attempt, clock)
            reset_when_abandoned(request, state.transport)  # HTTP/2: a stream dropped before its headers too
            response = decode_in_place(await state.transport.handle_async_request(request))
            call.lease.own(response)
            attempt.attempt_headers(clock(), response.status_code)
            if response.status_code >= 400:
                failure = await _error_status(attempt, state, response, clock, call.record.stream)
                if failure.unread is not None:  # the lease keeps it open until it is handed on or closed
                    call.lease.own(response, failure.unread.chunks)
                    response = None
                return Failed([failure])
            content_type = response.headers.get("content-type", "")
            reader = reader_for(
                request.method, request.url.path, content_type, call.record.stream, response.status_code, call.choices
            )
            if call.keeps_text and route.kind != "continuation":
                reader.keep_text()  # the text delivered is what a continuation resumes from
            if call.opening_live and route.kind != "continuation":  # nothing to decide on it: the caller reads it
                rest = _body(response).__aiter__()
                call.lease.own(response, rest)
                won = True
                return Win(attempt, state, response, [], rest, reader, in_flight)
            opening = await read_opening(_body(response), reader, lambda: attempt.attempt_accepted(clock()), read)
            if opening.rest is not None:
                call.lease.own(response, opening.rest)
            if reader.failure is not None and not reader.first_token:  # a failed attempt, like a 503
                return Failed([_stream_failure(call, attempt, state, reader.failure, response, opening, clock)])
            attempt.attempt_first_token(clock(), complete=opening.rest is None)
            won = True
            return Win(attempt, state, response, opening.chunks, opening.rest, reader, in_flight)
        except GuardClosed:
            raise
        except Exception as exc:  # transport errors are retryable failures; the retry layer judges others
            attempt.attempt_finished("failed", clock(), error=error_kind(exc))
            failure = AttemptFailure(attempt, state, error=exc)
            if (
                response is not None
                and response.status_code < 400
                and call.record.stream
                and failure.is_transport_error
                and route.kind != "continuation"  # a continuation's stream is never its caller's
            ):
                failure.as_sent = (response.status_code, response.headers, b"".join(read))  # what its caller had seen
            return Failed([failure])
        finally:
            cut_short = not won and attempt.outcome == "pending"  # however that was raised (see `_cut_short`)
            if route.payment is not None:  # before any await: a cancelled attempt settles its payment too
                if cut_short and response is None and attempt.sent is None:
                    route.payment.refund()  # still connecting (a hedge that lost, a deadline): nothing was sent
                else:
                    route.payment.settle()
            if not won:
                if cut_short:
                    attempt.attempt_finished(_cut_short(route, attempt), clock())
                await call.lease.end_attempt(in_flight, response)
                call.observation.attempt_finished(attempt)


def _cut_short(route: Route, attempt: AttemptRecordBuilder) -> AttemptOutcome:
    """How an attempt that ended with nothing to report ended: ``lost`` when another attempt of its race won,
    else ``cancelled`` (a deadline, the caller, the Guard closing). Decided by what was recorded, not by the
    exception: trio raises a cancellation from inside a transport's own nursery (its happy-eyeballs connect)
    wrapped in an exception group, which no ``except Cancelled`` matches."""
    winner = None if route.race is None else route.race.winner
    return "lost" if winner is not None and winner.attempt is not attempt else "cancelled"


async def _error_status(
    attempt: AttemptRecordBuilder, state: ReplicaState, response: httpx.Response, clock: Clock, streamed: bool
) -> AttemptFailure:
    """An error answer, judged by its status and headers. Its body cut short (`Unread.cut`) is judged as the
    caller's SDK meets it: a call that streams (``streamed``) has the status and headers first and judges them (the
    cut meets the caller reading the body); any other reads the whole body inside its request, so the cut is a
    dropped connection, whatever the status and headers (a 529 asking for a day's rest too: nothing of them cools
    the replica), and is raised as one; but where it says ``x-should-retry: false``, which anthropic reads on such a
    cut and does not retry it: then it is kept as the answer, to hand on as it came, and teaches nothing
    (`AttemptFailure.torn`)."""
    body, unread = await read_head(response)
    cut = None if unread is None else unread.cut
    torn = False
    if cut is not None and not streamed:
        if response.headers.get("x-should-retry") != "false":
            raise cut
        torn = True
    retry_after = None if torn else parse_retry_after(response.headers)
    attempt.attempt_finished("failed", clock(), error=f"http_{response.status_code}", retry_after=retry_after)
    return AttemptFailure(
        attempt,
        state,
        status_code=response.status_code,
        headers=response.headers,
        body=body,
        retry_after=retry_after,
        extensions=for_caller(dict(response.extensions)),
        unread=unread,
        torn=torn,
    )


def _body(response: httpx.Response) -> httpx.AsyncByteStream:
    stream = response.stream
    assert isinstance(stream, httpx.AsyncByteStream)
    return stream


def _stream_failure(
    call: Call,
    attempt: AttemptRecordBuilder,
    state: ReplicaState,
    failure: StreamFailure,
    response: httpx.Response,
    opening: Opening,
    clock: Clock,
) -> AttemptFailure:
    """A 200 that failed before its first token, as a failed attempt: with the status its error stands
    for (a JSON error body to hand back if it is the call's last answer), else as a stream error. An error
    event its SDK reads itself (`StreamReader.errors_are_events`) is also kept as it came (``as_sent``: the body
    to its end, or up to that event when the server holds it open), to hand back as such."""
    attempt.attempt_finished("failed", clock(), error=failure.cause, retry_after=failure.retry_after)
    as_sent = None
    if opening.reader.errors_are_events and failure.kind == "error_event":
        as_sent = (response.status_code, response.headers, b"".join(opening.chunks))
    error = None
    headers = _error_answer_headers(response.headers, failure)
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
        extensions=for_caller(dict(response.extensions)),
        stream_failure=failure,
        as_sent=as_sent,
    )


_NOT_OF_THE_ERROR = frozenset(
    {
        "content-type",
        "content-length",
        "content-encoding",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "trailer",
        "retry-after",
        "retry-after-ms",
        "x-should-retry",
    }
)
"""The server's headers on its 200 that are untrue of the error answer the guard builds from an error inside it:
how that 200's body was framed and encoded, and what the server said of retrying the 200 (no SDK reads those on a
200; on the built answer they would decide the retry of an error the server never answered them for). The others
(``request-id``, ``x-request-id``, rate-limit headers...) describe the request, and the error answer keeps them as a
plain client's response to that 200 would."""


def _error_answer_headers(server: httpx.Headers, failure: StreamFailure) -> httpx.Headers:
    """The headers of the error answer built from a 200's in-stream error: the server's own but those untrue of it
    (`_NOT_OF_THE_ERROR`), with the built body's type, the failure's kind and the Retry-After its event said."""
    headers = httpx.Headers([(k, v) for k, v in server.multi_items() if k.lower() not in _NOT_OF_THE_ERROR])
    headers["content-type"] = "application/json"
    headers["x-llmguard-stream-failure"] = failure.kind
    if failure.retry_after is not None:
        headers["retry-after"] = str(failure.retry_after)
    return headers


def stamp_sent(request: httpx.Request, attempt: AttemptRecordBuilder, clock: Clock) -> httpx.Request:
    """``request`` marked as ``attempt``'s (`ATTEMPT_EXTENSION`), its body wrapped to stamp the attempt's
    ``sent`` once the transport has written all of it. (An httpcore ``trace`` hook did it before, at the price of
    a call for each of the dozen events httpcore reports per request; the caller's own hook is left alone.)"""
    request.extensions = {**request.extensions, ATTEMPT_EXTENSION: attempt}
    body = request.stream
    assert isinstance(body, httpx.AsyncByteStream), "the guard's attempts carry async bodies"
    request.stream = _StampsSent(body, attempt, clock)
    return request


class _StampsSent(httpx.AsyncByteStream):
    """An attempt's body: stamps the attempt's ``sent`` when the transport has taken its last byte."""

    __slots__ = ("_attempt", "_body", "_clock")

    def __init__(self, body: httpx.AsyncByteStream, attempt: AttemptRecordBuilder, clock: Clock) -> None:
        self._body = body
        self._attempt = attempt
        self._clock = clock

    @property
    def rereadable(self) -> bool:
        """Whether the body can be read again (`llmguard_client._http.upload.rereadable`)."""
        return rereadable(self._body)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._body:
            yield chunk
        self._attempt.attempt_sent(self._clock())

    async def aclose(self) -> None:
        await self._body.aclose()
