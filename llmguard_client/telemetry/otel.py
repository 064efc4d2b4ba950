"""OpenTelemetry traces and metrics for the guard, from the phase records.

`OpenTelemetryInstrumentation` implements the `Instrumentation` protocol of
``llmguard_client.telemetry.hooks``. Only ``opentelemetry-api`` is imported: with no SDK
configured every span is non-recording and every instrument a no-op, and the per-call work
is cut short (see ``docs/observability.md`` and ``docs/benchmarks.md``).

Per logical call it emits one CLIENT span named ``{gen_ai.operation.name} {gen_ai.request.model}``
covering every attempt and wait, and (unless ``attempt_spans=False``) one child CLIENT span per
physical HTTP attempt, started live in ``attempt_started`` so that the ``traceparent`` injected
into that attempt's headers names it. Metrics are recorded once per logical call (GenAI) and once
per attempt (HTTP and llmguard's own). No prompt, completion or header value is ever read.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import time
import weakref
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, MeterProvider, NoOpMeterProvider, Observation
from opentelemetry.trace import (
    NoOpTracerProvider,
    ProxyTracerProvider,
    Span,
    SpanKind,
    Status,
    StatusCode,
    TracerProvider,
)
from opentelemetry.util.types import AttributeValue

from llmguard_client.telemetry import semconv as sc
from llmguard_client.telemetry.hooks import NO_INSTRUMENTATION, CallObservation
from llmguard_client.telemetry.record import AttemptRecord, PhaseRecord

__all__ = [
    "OpenTelemetryInstrumentation",
    "attempt_error_type",
    "call_error_type",
    "operation_name",
    "scrub_url",
    "server_of",
]

try:
    _VERSION = importlib.metadata.version("llmguard-client")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    _VERSION = "0.0.0"

_Attrs = dict[str, AttributeValue]
_FAILED_STATUSES = frozenset({"timeout", "http_error", "error", "rejected"})
_DEFAULT_PORTS = {"http": 80, "https": 443}
_URL_CACHE_MAX = 512

_NOOP_TRACER_PROVIDERS = (ProxyTracerProvider, NoOpTracerProvider)

_metrics_internal: Any
try:  # the API module holding the global meter provider (private: used only for a fast check)
    _metrics_internal = importlib.import_module("opentelemetry.metrics._internal")
except ImportError:  # pragma: no cover - another API version: _global_meter_provider falls back
    _metrics_internal = None


def _global_tracer_provider() -> TracerProvider | None:
    """The global tracer provider once one was set, else None (cheaply: no environment lookup)."""
    try:
        return trace._TRACER_PROVIDER  # set once, never unset
    except AttributeError:  # pragma: no cover - another API version: the public way
        tp = trace.get_tracer_provider()
        return None if isinstance(tp, ProxyTracerProvider) else tp


def _global_meter_provider() -> MeterProvider | None:
    """The global meter provider once one was set, else None (cheaply: no environment lookup)."""
    try:
        return _metrics_internal._METER_PROVIDER  # type: ignore[no-any-return]  # set once, never unset
    except AttributeError:  # pragma: no cover - another API version: the public way
        mp = metrics.get_meter_provider()
        return None if type(mp).__name__ == "_ProxyMeterProvider" else mp


# ---------------------------------------------------------------------------------------------
# Pure helpers (public for tests and for users building their own adapter)
# ---------------------------------------------------------------------------------------------
def operation_name(path: str) -> str:
    """``gen_ai.operation.name`` for a request path: chat, text_completion, embeddings or ``_OTHER``."""
    path = path.split("?", 1)[0].rstrip("/")
    for suffix, name in sc.OPERATION_BY_PATH_SUFFIX:
        if path.endswith(suffix):
            return name
    return sc.OPERATION_OTHER


def call_error_type(record: PhaseRecord) -> str | None:
    """``error.type`` of a logical call, or None when it did not fail.

    Only ``timeout``, ``http_error``, ``error`` and ``rejected`` are failures; ``ok`` and the
    caller's own ``cancelled`` / ``abandoned`` are not. An HTTP error is its status code
    (``"503"``), as in the HTTP conventions; the others are ``record.cause`` (``ttft_timeout``,
    ``connect_error``, ``budget_exhausted``...) or, without a cause, the status itself.
    """
    status = record.status
    if status not in _FAILED_STATUSES:
        return None
    if status == "http_error" and record.http_status is not None:
        return str(record.http_status)
    return record.cause or status


def attempt_error_type(attempt: AttemptRecord) -> str | None:
    """``error.type`` of one attempt, or None (a lost or cancelled attempt has none)."""
    outcome = attempt.outcome
    if outcome == "lost" or outcome == "cancelled":
        return None
    code = attempt.status_code
    if code is not None and code >= 400:
        return str(code)
    if outcome == "failed":
        return attempt.error or sc.ERROR_TYPE_OTHER
    return attempt.error  # a winner whose body then failed (read_error), else None


def scrub_url(url: str) -> str:
    """``url`` fit for ``url.full``: userinfo and every query value but ``api-version`` REDACTED.

    The fragment is dropped. An unparseable URL is reduced to ``REDACTED``.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return sc.REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        cred = f"{sc.REDACTED}:{sc.REDACTED}" if ":" in userinfo else sc.REDACTED
        netloc = f"{cred}@{hostport}"
    query = parts.query
    if query:
        pairs = []
        for pair in query.split("&"):
            name, sep, _value = pair.partition("=")
            if sep and name.lower() not in sc.URL_QUERY_KEEP:
                pair = f"{name}={sc.REDACTED}"
            pairs.append(pair)
        query = "&".join(pairs)
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def server_of(url: str) -> tuple[str, int] | None:
    """``(server.address, server.port)`` of a URL, the port defaulted from the scheme."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError:
        return None
    if not host:
        return None
    if port is None:
        port = _DEFAULT_PORTS.get(parts.scheme.lower())
        if port is None:
            return None
    return host, port


# ---------------------------------------------------------------------------------------------
# Shared budget gauge registry
# ---------------------------------------------------------------------------------------------
class _BudgetRegistry:
    """The budget levels reported by one observable gauge.

    An SDK meter keeps the callbacks of the *first* observable gauge registered under a name,
    so every instrumentation sharing a meter provider shares one registry. An entry lives as
    long as the instrumentation that registered it (a guard's default instrumentation dies
    with the guard); a bound method is also held weakly. Each live entry keeps a stable
    index; the lowest free one is reused, and index 0 is reported without attributes.
    """

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: list[tuple[weakref.ref[Any], Callable[[], Callable[[], float] | None], int]] = []

    def _prune(self) -> None:
        self._entries = [e for e in self._entries if e[0]() is not None and e[1]() is not None]

    def add(self, owner: object, level: Callable[[], float]) -> None:
        self._prune()
        used = {index for _, _, index in self._entries}
        index = next(i for i in range(len(used) + 1) if i not in used)
        ref: Callable[[], Callable[[], float] | None] = (
            weakref.WeakMethod(level) if inspect.ismethod(level) else _strong(level)
        )
        self._entries.append((weakref.ref(owner), ref, index))

    def observe(self, options: CallbackOptions) -> Iterable[Observation]:
        self._prune()
        out = []
        for _, ref, index in self._entries:
            level = ref()
            if level is None:
                continue
            try:
                value = float(level())
            except Exception:  # a broken level must not break the export of the others
                continue
            out.append(Observation(value, {sc.LLMGUARD_BUDGET_INDEX: index} if index else None))
        return out


def _strong(level: Callable[[], float]) -> Callable[[], Callable[[], float] | None]:
    return lambda: level


_GLOBAL_BUDGETS = _BudgetRegistry()
_BUDGETS_BY_PROVIDER: weakref.WeakKeyDictionary[MeterProvider, _BudgetRegistry] = weakref.WeakKeyDictionary()


def _budget_registry(meter_provider: MeterProvider | None) -> _BudgetRegistry:
    if meter_provider is None:
        return _GLOBAL_BUDGETS
    registry = _BUDGETS_BY_PROVIDER.get(meter_provider)
    if registry is None:
        registry = _BUDGETS_BY_PROVIDER[meter_provider] = _BudgetRegistry()
    return registry


# ---------------------------------------------------------------------------------------------
# The instrumentation
# ---------------------------------------------------------------------------------------------
class OpenTelemetryInstrumentation:
    """Traces and metrics through the OpenTelemetry API.

    :param tracer_provider: defaults to the global one (set it before or after; the API's proxy
        follows).
    :param meter_provider: likewise.
    :param attempt_spans: set False when ``opentelemetry-instrumentation-httpx`` already traces
        each HTTP request: the per-attempt spans and the ``http.client.request.duration`` metric are
        then left to it (no duplicates); ``traceparent`` then names the logical span.
    :param provider_name: ``gen_ai.provider.name`` (``openai``, ``azure.ai.openai``, ``x_ai``...).
    """

    __slots__ = (
        "__weakref__",
        "_attempt_spans",
        "_budgets",
        "_m_attempts",
        "_m_budget_refusals",
        "_m_bulkhead",
        "_m_calls",
        "_m_cooldown_s",
        "_m_cooldowns",
        "_m_duration",
        "_m_http_duration",
        "_m_tokens",
        "_m_tpoc",
        "_m_ttfc",
        "_metrics_on",
        "_provider_name",
        "_servers",
        "_tracer",
        "_traces_on",
        "_urls",
    )

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        *,
        attempt_spans: bool = True,
        provider_name: str = sc.PROVIDER_OPENAI,
    ) -> None:
        self._tracer = trace.get_tracer(sc.INSTRUMENTATION_SCOPE, _VERSION, tracer_provider, sc.SCHEMA_URL)
        meter = metrics.get_meter(sc.INSTRUMENTATION_SCOPE, _VERSION, meter_provider, sc.SCHEMA_URL)
        # Whether each signal reaches an SDK; None: the global provider, not set so far.
        self._traces_on = None if tracer_provider is None else not isinstance(tracer_provider, _NOOP_TRACER_PROVIDERS)
        self._metrics_on = None if meter_provider is None else not isinstance(meter_provider, NoOpMeterProvider)
        self._attempt_spans = attempt_spans
        self._provider_name = provider_name
        self._servers: dict[str, tuple[str, int] | None] = {}
        self._urls: dict[str, tuple[str, tuple[str, int] | None]] = {}

        self._m_duration = meter.create_histogram(
            sc.GEN_AI_CLIENT_OPERATION_DURATION,
            unit=sc.UNIT_SECONDS,
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=sc.GEN_AI_DURATION_BUCKETS,
        )
        self._m_ttfc = meter.create_histogram(
            sc.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK,
            unit=sc.UNIT_SECONDS,
            description="Time to receive the first chunk, measured from when the client issues the "
            "generation request to when the first chunk is received in the response stream.",
            explicit_bucket_boundaries_advisory=sc.GEN_AI_DURATION_BUCKETS,
        )
        self._m_tpoc = meter.create_histogram(
            sc.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK,
            unit=sc.UNIT_SECONDS,
            description="Time per output chunk after the first one (the mean over a streamed call).",
            explicit_bucket_boundaries_advisory=sc.GEN_AI_DURATION_BUCKETS,
        )
        self._m_tokens = meter.create_histogram(
            sc.GEN_AI_CLIENT_TOKEN_USAGE,
            unit=sc.UNIT_TOKEN,
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=sc.GEN_AI_TOKEN_BUCKETS,
        )
        self._m_http_duration = meter.create_histogram(
            sc.HTTP_CLIENT_REQUEST_DURATION,
            unit=sc.UNIT_SECONDS,
            description="Duration of HTTP client requests (one per physical attempt).",
            explicit_bucket_boundaries_advisory=sc.HTTP_DURATION_BUCKETS,
        )
        self._m_calls = meter.create_counter(
            sc.LLMGUARD_CLIENT_CALLS, unit=sc.UNIT_CALL, description="Logical calls, by cohort and status."
        )
        self._m_attempts = meter.create_counter(
            sc.LLMGUARD_CLIENT_ATTEMPTS,
            unit=sc.UNIT_ATTEMPT,
            description="Physical attempts, by kind (primary, retry, hedge) and outcome.",
        )
        self._m_budget_refusals = meter.create_counter(
            sc.LLMGUARD_CLIENT_BUDGET_REFUSALS,
            unit=sc.UNIT_ATTEMPT,
            description="Extra attempts (retries, hedges) refused by the shared budget.",
        )
        self._m_cooldowns = meter.create_counter(
            sc.LLMGUARD_CLIENT_REPLICA_COOLDOWNS,
            unit=sc.UNIT_COOLDOWN,
            description="Replicas put in cool-down, by reason.",
        )
        self._m_cooldown_s = meter.create_histogram(
            sc.LLMGUARD_CLIENT_REPLICA_COOLDOWN_DURATION,
            unit=sc.UNIT_SECONDS,
            description="Length of the cool-downs imposed on replicas.",
            explicit_bucket_boundaries_advisory=sc.COOLDOWN_BUCKETS,
        )
        self._m_bulkhead = meter.create_counter(
            sc.LLMGUARD_CLIENT_BULKHEAD_REJECTIONS,
            unit=sc.UNIT_CALL,
            description="Calls refused because their tier's bulkhead was full.",
        )
        self._budgets = _budget_registry(meter_provider)
        meter.create_observable_gauge(
            sc.LLMGUARD_CLIENT_BUDGET_LEVEL,
            callbacks=[self._budgets.observe],
            unit=sc.UNIT_ATTEMPT,
            description="Extra attempts the shared retry budget allows now.",
        )

    # -- Instrumentation protocol ---------------------------------------------------------------
    def call_started(self, record: PhaseRecord) -> CallObservation:
        if self._disabled():
            return NO_INSTRUMENTATION.call_started(record)
        op = operation_name(record.path)
        model = record.model
        attrs: _Attrs = {
            sc.GEN_AI_OPERATION_NAME: op,
            sc.GEN_AI_PROVIDER_NAME: self._provider_name,
            sc.GEN_AI_REQUEST_STREAM: record.stream,
            sc.LLMGUARD_TIER: record.tier,
            sc.LLMGUARD_COHORT: record.cohort,
            sc.LLMGUARD_REQUEST_ID: record.request_id,
        }
        if model:
            attrs[sc.GEN_AI_REQUEST_MODEL] = model
        if record.max_tokens is not None:
            attrs[sc.GEN_AI_REQUEST_MAX_TOKENS] = record.max_tokens
        if record.rollout_fraction is not None:
            attrs[sc.LLMGUARD_ROLLOUT_FRACTION] = record.rollout_fraction
        span = self._tracer.start_span(
            f"{op} {model}" if model else op,
            kind=SpanKind.CLIENT,
            attributes=attrs,
            start_time=round(record.start_unix * 1e9),
        )
        return _Call(self, record, span, op)

    def replica_cooled(self, replica: str, seconds: float, reason: str) -> None:
        attrs: _Attrs = {sc.LLMGUARD_COOLDOWN_REASON: reason}
        server = self._server(replica)
        if server is not None:
            attrs[sc.SERVER_ADDRESS], attrs[sc.SERVER_PORT] = server
        self._m_cooldowns.add(1, attrs)
        self._m_cooldown_s.record(seconds, attrs)

    def bulkhead_rejected(self, tier: str) -> None:
        self._m_bulkhead.add(1, {sc.LLMGUARD_TIER: tier})

    def register_budget(self, level: Callable[[], float]) -> None:
        self._budgets.add(self, level)

    # -- helpers --------------------------------------------------------------------------------
    def _disabled(self) -> bool:
        """True while no SDK would receive anything and there is no trace context to pass on.

        Checked per call (cheaply) because the SDK is often configured after the guard is made:
        the API's global proxies then start delegating, and so does this instrumentation. A
        global provider, once set, cannot be replaced, so the answer is then kept.
        """
        traces = self._traces_on
        if traces is None:
            tp = _global_tracer_provider()
            if tp is not None:
                traces = self._traces_on = not isinstance(tp, _NOOP_TRACER_PROVIDERS)
        if traces:
            return False
        on = self._metrics_on
        if on is None:
            mp = _global_meter_provider()
            if mp is not None:
                on = self._metrics_on = not isinstance(mp, NoOpMeterProvider)
        if on:
            return False
        # With no SDK an incoming context (e.g. extracted by a server framework) is still passed on.
        return not trace.get_current_span().get_span_context().is_valid

    def _server(self, base_url: str) -> tuple[str, int] | None:
        try:
            return self._servers[base_url]
        except KeyError:
            server = server_of(base_url)
            if len(self._servers) < _URL_CACHE_MAX:
                self._servers[base_url] = server
            return server

    def _url(self, url: str) -> tuple[str, tuple[str, int] | None]:
        try:
            return self._urls[url]
        except KeyError:
            out = (scrub_url(url), server_of(url))
            if len(self._urls) < _URL_CACHE_MAX:
                self._urls[url] = out
            return out


def _ns(record: PhaseRecord, t: float | None) -> int:
    """Epoch nanoseconds of the monotonic instant ``t`` (now when None)."""
    if t is None:
        return time.time_ns()
    return round(record.start_unix * 1e9) + round((t - record.start) * 1e9)


_ATTEMPT_PHASES = (
    (sc.LLMGUARD_PHASE_START, "start"),
    (sc.LLMGUARD_PHASE_SENT, "sent"),
    (sc.LLMGUARD_PHASE_HEADERS, "headers"),
    (sc.LLMGUARD_PHASE_FIRST_TOKEN, "first_token"),
    (sc.LLMGUARD_PHASE_FINISH, "finish"),
)
_CALL_PHASES = ((sc.LLMGUARD_PHASE_QUEUED, "queued"), *_ATTEMPT_PHASES[1:])


def _close_span(
    span: Span, attrs: _Attrs, phases: object, names: tuple[tuple[str, str], ...], start: float, err: str | None,
    end_ns: int | None,
) -> None:  # fmt: skip
    """Set the phases (seconds since the call started) and the error, then end the span."""
    for key, field in names:
        t = getattr(phases, field)
        if t is not None:
            attrs[key] = round(t - start, 6)
    if err is not None:
        attrs[sc.ERROR_TYPE] = err
        span.set_status(Status(StatusCode.ERROR, err))
    span.set_attributes(attrs)
    span.end(end_time=end_ns)


class _Call:
    """The `CallObservation` of one logical call."""

    __slots__ = ("_attempt_spans", "_ctx", "_done", "_inst", "_op", "_record", "_refusals", "_span", "_winner")

    def __init__(self, inst: OpenTelemetryInstrumentation, record: PhaseRecord, span: Span, op: str) -> None:
        self._inst = inst
        self._record = record
        self._span = span
        self._op = op
        self._ctx: Context | None = None
        self._attempt_spans: dict[int, Span] = {}
        self._refusals = 0
        self._done = False
        self._winner: AttemptRecord | None = None

    def _context(self) -> Context:
        ctx = self._ctx
        if ctx is None:
            ctx = self._ctx = trace.set_span_in_context(self._span)
        return ctx

    # -- CallObservation protocol ---------------------------------------------------------------
    def attempt_started(self, attempt: AttemptRecord, url: str, headers: MutableMapping[str, str]) -> None:
        inst = self._inst
        if not inst._attempt_spans:
            propagate.inject(headers, context=self._context())
            return
        record = self._record
        scrubbed, server = inst._url(url)
        attrs: _Attrs = {
            sc.HTTP_REQUEST_METHOD: record.method,
            sc.URL_FULL: scrubbed,
            sc.LLMGUARD_ATTEMPT_KIND: attempt.kind,
            sc.LLMGUARD_ATTEMPT_INDEX: attempt.index,
        }
        if server is not None:
            attrs[sc.SERVER_ADDRESS], attrs[sc.SERVER_PORT] = server
        if attempt.index > 0:
            attrs[sc.HTTP_REQUEST_RESEND_COUNT] = attempt.index
        span = inst._tracer.start_span(
            record.method,
            context=self._context(),
            kind=SpanKind.CLIENT,
            attributes=attrs,
            start_time=_ns(record, attempt.start),
        )
        self._attempt_spans[attempt.index] = span
        propagate.inject(headers, context=trace.set_span_in_context(span, self._context()))

    def attempt_finished(self, attempt: AttemptRecord) -> None:
        if attempt.outcome == "won" and not self._done:
            # The transport reports the winner just before the call's end: wait for it, to know
            # whether its body completed (a stream can still break or stall after winning).
            self._winner = attempt
            return
        self._attempt_done(attempt, None)

    def _attempt_done(self, attempt: AttemptRecord, call_err: str | None) -> None:
        inst = self._inst
        record = self._record
        err = attempt_error_type(attempt) or call_err
        base: _Attrs = {
            sc.LLMGUARD_TIER: record.tier,
            sc.LLMGUARD_COHORT: record.cohort,
            sc.LLMGUARD_ATTEMPT_KIND: attempt.kind,
            sc.LLMGUARD_ATTEMPT_OUTCOME: attempt.outcome,
        }
        inst._m_attempts.add(1, base)
        span = self._attempt_spans.pop(attempt.index, None)
        if not inst._attempt_spans:
            return
        if attempt.finish is not None:
            http: _Attrs = {
                sc.HTTP_REQUEST_METHOD: record.method,
                sc.LLMGUARD_TIER: record.tier,
                sc.LLMGUARD_COHORT: record.cohort,
                sc.LLMGUARD_ATTEMPT_OUTCOME: attempt.outcome,
            }
            server = inst._server(attempt.replica)
            if server is not None:
                http[sc.SERVER_ADDRESS], http[sc.SERVER_PORT] = server
            if attempt.status_code is not None:
                http[sc.HTTP_RESPONSE_STATUS_CODE] = attempt.status_code
            if err is not None:
                http[sc.ERROR_TYPE] = err
            inst._m_http_duration.record(max(attempt.finish - attempt.start, 0.0), http)
        if span is not None:
            self._end_attempt_span(span, attempt, err)

    def _end_attempt_span(self, span: Span, attempt: AttemptRecord, err: str | None) -> None:
        record = self._record
        if span.is_recording():
            start = record.start
            attrs: _Attrs = {sc.LLMGUARD_ATTEMPT_OUTCOME: attempt.outcome}
            if attempt.status_code is not None:
                attrs[sc.HTTP_RESPONSE_STATUS_CODE] = attempt.status_code
            if attempt.retry_after is not None:
                attrs[sc.LLMGUARD_RETRY_AFTER] = attempt.retry_after
            _close_span(span, attrs, attempt, _ATTEMPT_PHASES, start, err, _ns(record, attempt.finish))
        else:
            span.end(end_time=_ns(record, attempt.finish))

    def budget_refused(self, record: PhaseRecord) -> None:
        self._refusals += 1
        self._inst._m_budget_refusals.add(1, {sc.LLMGUARD_TIER: record.tier, sc.LLMGUARD_COHORT: record.cohort})

    def call_finished(self, record: PhaseRecord) -> None:
        if self._done:
            return
        self._done = True
        inst = self._inst
        err = call_error_type(record)
        winner, self._winner = self._winner, None
        if winner is not None:
            self._attempt_done(winner, err)
        # Attempts whose end was never reported: close them with the call (outcome as recorded).
        if self._attempt_spans:
            by_index = {a.index: a for a in record.attempts}
            for index, span in list(self._attempt_spans.items()):
                attempt = by_index.get(index)
                if attempt is None:
                    self._attempt_spans.pop(index)
                    span.end(end_time=_ns(record, record.finish))
                else:
                    self._attempt_done(attempt, err if attempt.outcome == "won" else None)

        server = inst._server(record.replica) if record.replica else None
        span = self._span
        if span.is_recording():
            self._end_logical_span(span, record, err, server)
        else:
            span.end(end_time=_ns(record, record.finish))

        # Metrics: once per logical call.
        attrs: _Attrs = {
            sc.GEN_AI_OPERATION_NAME: self._op,
            sc.GEN_AI_PROVIDER_NAME: inst._provider_name,
            sc.LLMGUARD_TIER: record.tier,
            sc.LLMGUARD_COHORT: record.cohort,
        }
        if record.model:
            attrs[sc.GEN_AI_REQUEST_MODEL] = record.model
        if record.response_model:
            attrs[sc.GEN_AI_RESPONSE_MODEL] = record.response_model
        if server is not None:
            attrs[sc.SERVER_ADDRESS], attrs[sc.SERVER_PORT] = server
        duration = record.duration
        if duration is not None:
            if err is None:
                inst._m_duration.record(duration, attrs)
            else:
                inst._m_duration.record(duration, {**attrs, sc.ERROR_TYPE: err})
        if record.stream and record.first_token is not None:
            inst._m_ttfc.record(record.first_token - record.start, attrs)
            tpoc = _time_per_output_chunk(record)
            if tpoc is not None:
                inst._m_tpoc.record(tpoc, attrs)
        if record.prompt_tokens is not None:
            inst._m_tokens.record(record.prompt_tokens, {**attrs, sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_TYPE_INPUT})
        if record.completion_tokens is not None:
            inst._m_tokens.record(record.completion_tokens, {**attrs, sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_TYPE_OUTPUT})
        calls: _Attrs = {
            sc.GEN_AI_OPERATION_NAME: self._op,
            sc.LLMGUARD_TIER: record.tier,
            sc.LLMGUARD_COHORT: record.cohort,
            sc.LLMGUARD_STATUS: record.status,
        }
        if err is not None:
            calls[sc.ERROR_TYPE] = err
        inst._m_calls.add(1, calls)

    def _end_logical_span(
        self, span: Span, record: PhaseRecord, err: str | None, server: tuple[str, int] | None
    ) -> None:
        start = record.start
        attempts = record.attempts
        attrs: _Attrs = {
            sc.LLMGUARD_STATUS: record.status,
            sc.LLMGUARD_ATTEMPTS: len(attempts),
            sc.LLMGUARD_HEDGED: any(a.kind == "hedge" for a in attempts),
            sc.LLMGUARD_RETRIED: any(a.kind == "retry" for a in attempts),
        }
        if record.cause:
            attrs[sc.LLMGUARD_CAUSE] = record.cause
        if self._refusals:
            attrs[sc.LLMGUARD_BUDGET_REFUSALS] = self._refusals
        if record.response_model:
            attrs[sc.GEN_AI_RESPONSE_MODEL] = record.response_model
        if record.response_id:
            attrs[sc.GEN_AI_RESPONSE_ID] = record.response_id
        if record.finish_reasons:
            attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = tuple(record.finish_reasons)
        if record.prompt_tokens is not None:
            attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] = record.prompt_tokens
        if record.completion_tokens is not None:
            attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = record.completion_tokens
        if record.stream and record.first_token is not None:
            attrs[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = round(record.first_token - start, 6)
        if server is not None:
            attrs[sc.SERVER_ADDRESS], attrs[sc.SERVER_PORT] = server
        if record.http_status is not None:
            attrs[sc.HTTP_RESPONSE_STATUS_CODE] = record.http_status
        _close_span(span, attrs, record, _CALL_PHASES, start, err, _ns(record, record.finish))


def _time_per_output_chunk(record: PhaseRecord) -> float | None:
    """Mean seconds between output chunks after the first, for a stream that completed.

    The record has no per-chunk timestamps, so the metric gets one value per call: the time
    from the first to the last chunk over the chunks after the first. The chunk count is
    ``record.chunks`` when the transport fills it, else ``completion_tokens`` (OpenAI-compatible
    servers send about one token per chunk).
    """
    if record.status != "ok" or record.finish is None or record.first_token is None:
        return None
    chunks: Any = getattr(record, "chunks", None)
    n = chunks if isinstance(chunks, int) else record.completion_tokens
    if n is None or n < 2:
        return None
    return max(record.finish - record.first_token, 0.0) / (n - 1)
