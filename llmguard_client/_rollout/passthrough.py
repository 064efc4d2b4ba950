"""The control cohort's path: the caller's request, sent once, untouched, and measured.

`passthrough` is what a call gets when the rollout puts it in the control cohort, and
what every call gets while the guard is off (``LLMGUARD_DISABLED=1`` or a fraction of 0):

- exactly one request, to the URL the caller built (no re-routing across replicas);
- the caller's method, URL, headers (minus the guard's own ``x-llmguard-*``, unless the client signed them:
  `llmguard_client._http.signed`), body stream,
  timeouts and extensions; nothing added (no ``traceparent``, no replica headers);
- the server's answer returned as it came, error statuses included (a compressed one decoded, as a
  guarded answer is: `llmguard_client._http.encoding`); a transport error is raised as httpx
  raised it; no deadline, hedge, retry, bulkhead or budget applies;
- the tier (the record's) is resolved as for a guarded call: an ``x-llmguard-tier`` or
  ``x-llmguard-cohort`` header naming nothing configured fails the call before it is sent
  (`llmguard_client.GuardRequestError`), so a typo fails at 5 % exactly as at 100 %;
- measured all the same: a `PhaseRecord` with cohort ``control``, one attempt, TTFT from the
  SSE stream's first content token, delivered to ``on_record`` and the instrumentation.

The same path sends a request that follows a redirect to an origin that is no replica's
(`llmguard_client._http.redirects`), recorded in its call's cohort.

A URL on a replica's origin reuses that replica's connection pool; any other URL goes
through one shared `httpx.AsyncHTTPTransport` that `PassthroughPool` creates on first use
and closes with the guard.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable

import httpx

from llmguard_client._core.clock import is_cancellation
from llmguard_client._core.given_up import SdkCall
from llmguard_client._core.request import RequestFacts
from llmguard_client._http.encoding import decode_in_place
from llmguard_client._http.network_stream import for_caller
from llmguard_client._http.origin import OriginKey, origin, origin_key
from llmguard_client._http.pool import replica_transport
from llmguard_client._http.proxy import environment_proxy
from llmguard_client._http.tls import default_tls_context
from llmguard_client._layers.attempt import error_kind, stamp_sent
from llmguard_client._rollout.rollout import Cohort
from llmguard_client._routing.replicas import ReplicaState
from llmguard_client.protocols import StreamReader, reader_for
from llmguard_client.telemetry._record_builder import AttemptRecordBuilder, CallRecordBuilder
from llmguard_client.telemetry.hooks import CallObservation, Instrumentation
from llmguard_client.telemetry.record import AttemptOutcome, CallStatus, OneAttempt, PhaseRecord

GUARD_HEADER_PREFIX = b"x-llmguard-"
FACTS_BODY_LIMIT = 1024 * 1024
"""Bytes of a non-streamed answer kept to read its usage from (a larger body is passed through unread)."""
_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)

TransportForUrl = Callable[[httpx.URL], httpx.AsyncBaseTransport]


class PassthroughPool:
    """Transports for pass-through calls: a replica's own pool for its origin, one shared pool for the rest."""

    def __init__(self, replicas: Iterable[ReplicaState]) -> None:
        self._by_origin = {origin_key(state.base): state for state in replicas}
        """Each replica by its origin: its transport is read per call (it is renewed for another event loop)."""
        self._other: dict[str | None, httpx.AsyncHTTPTransport] = {}
        """The shared pools for other origins, by the proxy the environment names for them (None: direct)."""
        self._other_origins: dict[OriginKey, httpx.AsyncHTTPTransport] = {}
        """Each other origin's pool once chosen: the environment is read once per origin, not per call."""
        self._lock = threading.Lock()
        self._closed = False

    def for_url(self, url: httpx.URL) -> httpx.AsyncBaseTransport:
        key = origin_key(url)
        replica = self._by_origin.get(key)
        if replica is not None:
            return replica.transport
        transport = self._other_origins.get(key)
        if transport is not None:
            return transport
        proxy = environment_proxy(url)
        by_proxy = None if proxy is None else str(proxy.url)
        with self._lock:
            if self._closed:
                raise RuntimeError("this Guard is closed; build a new Guard to send more requests")
            other = self._other.get(by_proxy)
            if other is None:
                other = self._other[by_proxy] = replica_transport(_LIMITS, default_tls_context(), proxy)
            self._other_origins[key] = other
            return other

    def shared(self) -> list[httpx.AsyncHTTPTransport]:
        """The shared pools for other origins now."""
        with self._lock:
            return list(self._other.values())

    def renew(self) -> list[httpx.AsyncHTTPTransport]:
        """Forget the shared pools (another event loop builds its own as it needs them) and return them."""
        with self._lock:
            others, self._other, self._other_origins = list(self._other.values()), {}, {}
        return others

    async def aclose(self) -> None:
        """Close the shared pools (the replicas' pools belong to the replica set)."""
        with self._lock:
            self._closed = True
        for other in self.renew():
            await other.aclose()


async def passthrough(
    request: httpx.Request,
    transport_for_url: TransportForUrl,
    *,
    tier: str,
    cohort: Cohort = "control",
    fraction: float,
    one_attempt: OneAttempt | None = None,
    sdk_call: SdkCall = (None, 0),
    signed: frozenset[bytes] = frozenset(),
    instrumentation: Instrumentation,
    on_record: Callable[[PhaseRecord], None] | None,
    clock: Callable[[], float] = time.monotonic,
) -> httpx.Response:
    """Send ``request`` once as the caller built it, minus ``x-llmguard-*`` headers (but those in ``signed``, the
    headers the client signed); measure it in ``cohort`` (a request that follows a redirect elsewhere keeps its
    call's, with ``one_attempt`` saying why it went there), as a request of the SDK call ``sdk_call``."""
    now = clock()
    try:
        body = request.content  # already in memory for json=/content= bodies; a streamed upload is not read
    except httpx.RequestNotRead:  # an httpx2 edge's body: in memory all the same, given as a stream of it
        body = b"".join(request.stream) if isinstance(request.stream, httpx.ByteStream) else b""
    facts = RequestFacts.parse(request, body)
    origin_name = origin(request.url)
    record = CallRecordBuilder(
        request_id=uuid.uuid4().hex,
        tier=tier,
        cohort=cohort,
        method=request.method,
        path=request.url.path,
        start=now,
        start_unix=time.time(),
        model=facts.model,
        stream=facts.stream,
        max_tokens=facts.max_tokens,
        rollout_fraction=fraction,
        sdk_call=sdk_call,
    )
    if one_attempt is not None:
        record.one_attempt_because(one_attempt)
    attempt = record.attempt_started(origin_name, "primary", now)
    end = _End(record, attempt, instrumentation.call_started(record), on_record, clock)
    end.observation.attempt_started(attempt, str(request.url), {})  # whatever it would inject is dropped
    outgoing = stamp_sent(
        httpx.Request(
            request.method,
            request.url,
            headers=[
                (k, v)
                for k, v in request.headers.raw
                if not k.lower().startswith(GUARD_HEADER_PREFIX) or k.lower() in signed  # sent as the client signed it
            ],
            stream=request.stream,
            extensions=request.extensions,
        ),
        attempt,
        clock,
    )
    try:
        response = decode_in_place(await transport_for_url(request.url).handle_async_request(outgoing))
    except BaseException as exc:  # a cancellation (bare, or in a group: `is_cancellation`), or an error
        if is_cancellation(exc):
            end("cancelled", "cancelled_by_caller", "cancelled")
        elif isinstance(exc, Exception):
            cause = error_kind(exc)
            end("timeout" if isinstance(exc, httpx.TimeoutException) else "error", cause, "failed", cause)
        raise
    attempt.attempt_headers(clock(), response.status_code)
    record.delivered(attempt, response.status_code)
    content_type = response.headers.get("content-type", "")
    reader = None
    if response.status_code < 400:
        reader = reader_for(
            request.method, request.url.path, content_type, facts.stream, response.status_code, facts.choices
        )
    measured = httpx.Response(
        response.status_code,
        headers=response.headers,
        stream=MeasuredStream(response, reader, end),
        request=request,
        extensions=response.extensions,  # copied by httpx
    )
    record.hand_over(for_caller(measured.extensions))
    return measured


class _End:
    """Finishes a pass-through call's record exactly once and reports it."""

    def __init__(
        self,
        record: CallRecordBuilder,
        attempt: AttemptRecordBuilder,
        observation: CallObservation,
        on_record: Callable[[PhaseRecord], None] | None,
        clock: Callable[[], float],
    ) -> None:
        self.record, self.attempt, self.observation = record, attempt, observation
        self._on_record, self.clock = on_record, clock
        self.done = False

    def __call__(
        self, status: CallStatus, cause: str | None, outcome: AttemptOutcome, error: str | None = None
    ) -> None:
        """End the call with ``status`` and ``cause``, its attempt with ``outcome`` (and ``error``)."""
        if self.done:
            return
        self.done = True
        now = self.clock()
        self.attempt.attempt_finished(outcome, now, error=error)
        self.observation.attempt_finished(self.attempt)
        record = self.record.call_finished(status, cause, now)
        self.observation.call_finished(record)
        if self._on_record is not None:
            self._on_record(record)  # never raises: the transport's report, with the application's callback contained


class MeasuredStream(httpx.AsyncByteStream):
    """The server's body, byte for byte, read by its protocol's reader to stamp the first token, the
    end and usage on the record (a failure inside the stream is recorded, never raised).

    An error status is the call's outcome (``http_error``) however its body ends: read to its end, cut by an
    error, or closed unread (an SDK that retries it closes it so), as a guarded call's error answer is."""

    def __init__(self, response: httpx.Response, reader: StreamReader | None, end: _End) -> None:
        self._response = response
        self._reader = reader
        self._end = end
        self._read_cancelled = False
        """A read was cancelled by the caller: a close then ends the call ``cancelled``."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        end, reader = self._end, self._reader
        stream = self._response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        try:
            async for chunk in stream:
                if reader is not None and reader.feed(chunk) and end.record.first_token is None:
                    now = end.clock()
                    end.record.first_token_at(now)
                    end.attempt.attempt_first_token(now)  # as it comes: a fault injected mid-body waits for it
                yield chunk
        except Exception as exc:
            cause = error_kind(exc)
            self._broke("timeout" if isinstance(exc, httpx.TimeoutException) else "error", cause)
            raise
        except BaseException as exc:
            if is_cancellation(exc):
                self._read_cancelled = True
            raise
        if reader is not None:
            reader.end_of_body()
        self._finish()

    def _broke(self, status: CallStatus, cause: str) -> None:
        """A read of the body failed with ``cause``: the call's ``status``, unless it answered an error status."""
        if self._response.status_code >= 400:
            self._finish()
        else:
            self._end(status, cause, "failed", cause)

    def _finish(self) -> None:
        end, record, code, reader = self._end, self._end.record, self._response.status_code, self._reader
        if code >= 400 or reader is None:
            end("http_error", "upstream_status", "failed", f"http_{code}")
            return
        facts = reader.facts
        first_token = record.first_token
        if first_token is None:  # a body or a stream without content tokens: complete at its end
            first_token = end.clock()
            record.first_token_at(first_token)
        record.response_facts(
            facts.prompt_tokens,
            facts.completion_tokens,
            facts.response_id,
            facts.model,
            facts.finish_reasons,
            reader.chunks,
        )
        if end.attempt.first_token is None:
            end.attempt.attempt_first_token(first_token)
        if reader.failure is not None:
            end("error", reader.failure.cause, "failed", reader.failure.cause)
        elif facts.failed:  # an answer that failed, handed over as it came (as on the guarded side)
            end("error", facts.failed, "won", facts.failed)
        else:
            end("ok", None, "won")

    async def aclose(self, *, cause: str | None = None) -> None:
        """Close the server's response. A body closed before its protocol's end marker is ``cancelled``
        (``cancelled_by_caller``) if the caller's read was cancelled, else ``abandoned`` (``closed_by_caller``, or
        ``cause``: why the sync edge that reads the body closed it after cancelling its read), unless the answer
        was an error status."""
        end, reader = self._end, self._reader
        if not end.done and (self._response.status_code >= 400 or (reader is not None and reader.complete)):
            self._finish()  # an error answer (an SDK retrying it closes it unread); or openai 2.x stopped at [DONE]
        try:
            await self._response.aclose()
        finally:
            if cause is None and self._read_cancelled:
                end("cancelled", "cancelled_by_caller", "cancelled")
            else:
                end("abandoned", cause or "closed_by_caller", "cancelled")
