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

The work is split by job: ``_otel_providers`` (is an SDK there?), ``_otel_attributes`` (values derived
from records), ``_otel_metrics`` (the instruments), ``_otel_call`` (one call's spans and measurements).
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import SpanKind, TracerProvider

from llmguard_client.errors import GuardConfigError
from llmguard_client.telemetry import semconv as sc
from llmguard_client.telemetry._otel_attributes import (
    Attrs,
    UrlCache,
    attempt_error_type,
    call_error_type,
    operation_name,
    scrub_url,
    server_of,
)
from llmguard_client.telemetry._otel_call import CallObserver, Shared
from llmguard_client.telemetry._otel_metrics import budget_registry, shared_instruments
from llmguard_client.telemetry._otel_providers import VERSION, SignalState
from llmguard_client.telemetry.hooks import NO_INSTRUMENTATION, CallObservation, LiveCall

__all__ = [
    "OpenTelemetryInstrumentation",
    "attempt_error_type",
    "call_error_type",
    "operation_name",
    "scrub_url",
    "server_of",
]


def _check_arguments(
    tracer_provider: object,
    meter_provider: object,
    attempt_spans: object,
    provider_name: object,
    propagate: object,
    gen_ai_attributes: object,
    gen_ai_metrics: object,
) -> None:
    """`OpenTelemetryInstrumentation`'s arguments checked: a wrong one fails when it is built, not in a call."""
    owner = "OpenTelemetryInstrumentation"
    for name, provider, kind, method in (
        ("tracer_provider", tracer_provider, "TracerProvider", "get_tracer"),
        ("meter_provider", meter_provider, "MeterProvider", "get_meter"),
    ):
        if provider is not None and not callable(getattr(provider, method, None)):
            raise GuardConfigError(
                f"{owner}.{name} must be an OpenTelemetry {kind} (e.g. the SDK's {kind}()) or None for the global "
                f"one, got {provider!r}"
            )
    for name, value in (
        ("attempt_spans", attempt_spans),
        ("propagate", propagate),
        ("gen_ai_attributes", gen_ai_attributes),
        ("gen_ai_metrics", gen_ai_metrics),
    ):
        if not isinstance(value, bool):
            raise GuardConfigError(f"{owner}.{name} must be True or False, got {value!r}")
    if not isinstance(provider_name, str) or not provider_name:
        raise GuardConfigError(
            f"{owner}.provider_name must be a non-empty str (gen_ai.provider.name, e.g. 'openai'), "
            f"got {provider_name!r}"
        )


class OpenTelemetryInstrumentation:
    """Traces and metrics through the OpenTelemetry API.

    :param tracer_provider: defaults to the global one (set it before or after; the API's proxy
        follows).
    :param meter_provider: likewise.
    :param attempt_spans: set False when ``opentelemetry-instrumentation-httpx`` already traces
        each HTTP request: the per-attempt spans and the ``http.client.request.duration`` metric are
        then left to it (no duplicates); ``traceparent`` then names the logical span.
    :param provider_name: ``gen_ai.provider.name`` (``openai``, ``azure.ai.openai``, ``x_ai``...).
    :param propagate: put each attempt's trace context (``traceparent``, and ``tracestate`` / ``baggage``
        with the global propagator) in its request. False: the guard adds none, and the request carries what
        the caller's own did (e.g. anthropic's ``open_telemetry={"propagation": False}``: nothing).
    :param gen_ai_attributes: set False when an instrumentation of the SDK already makes a GenAI span of each
        call (``opentelemetry-instrumentation-openai-v2``, logfire's ``instrument_openai``, anthropic's
        ``open_telemetry``): the guard's span, under the SDK's, then carries no ``gen_ai.*`` attribute (its
        ``llmguard.*`` ones and its attempt spans stay), so the call's tokens are on one span.
    :param gen_ai_metrics: set False when that instrumentation also records the GenAI client metrics
        (``opentelemetry-instrumentation-openai-v2`` does): the guard then records none (``llmguard.*`` and HTTP
        metrics stay), so each call's duration and tokens are counted once.

    The GenAI metrics keep their v1.41.0 names unless ``OTEL_SEMCONV_STABILITY_OPT_IN`` lists
    ``gen_ai_latest_experimental`` when the instrumentation is built: then the latest names
    (``gen_ai.client.inference.*``, ``gen_ai.client.embeddings.*``) are emitted instead.
    """

    __slots__ = ("__weakref__", "_budgets", "_shared", "_signals")

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        *,
        attempt_spans: bool = True,
        provider_name: str = sc.PROVIDER_OPENAI,
        propagate: bool = True,
        gen_ai_attributes: bool = True,
        gen_ai_metrics: bool = True,
    ) -> None:
        _check_arguments(
            tracer_provider, meter_provider, attempt_spans, provider_name, propagate, gen_ai_attributes, gen_ai_metrics
        )
        tracer = trace.get_tracer(sc.INSTRUMENTATION_SCOPE, VERSION, tracer_provider, sc.SCHEMA_URL)
        self._signals = SignalState(tracer_provider, meter_provider)
        self._budgets = budget_registry(meter_provider)
        instruments = shared_instruments(meter_provider, latest=sc.gen_ai_latest())
        self._shared = Shared(
            tracer, instruments, UrlCache(), attempt_spans, provider_name, propagate, gen_ai_attributes, gen_ai_metrics
        )

    # -- Instrumentation protocol ---------------------------------------------------------------
    def call_started(self, record: LiveCall) -> CallObservation:
        # Checked per call (cheaply): the SDK is often configured after the guard is made.
        if self._signals.disabled():
            return NO_INSTRUMENTATION.call_started(record)
        shared = self._shared
        op = operation_name(record.path)
        model = record.model
        attrs: Attrs = {
            sc.LLMGUARD_TIER: record.tier,
            sc.LLMGUARD_COHORT: record.cohort,
            sc.LLMGUARD_REQUEST_ID: record.request_id,
        }
        if shared.gen_ai_attributes:
            attrs[sc.GEN_AI_OPERATION_NAME] = op
            attrs[sc.GEN_AI_PROVIDER_NAME] = shared.provider_name
            attrs[sc.GEN_AI_REQUEST_STREAM] = record.stream
            if model:
                attrs[sc.GEN_AI_REQUEST_MODEL] = model
            if record.max_tokens is not None:
                attrs[sc.GEN_AI_REQUEST_MAX_TOKENS] = record.max_tokens
        if record.rollout_fraction is not None:
            attrs[sc.LLMGUARD_ROLLOUT_FRACTION] = record.rollout_fraction
        span = shared.tracer.start_span(
            f"{op} {model}" if model else op,
            kind=SpanKind.CLIENT,
            attributes=attrs,
            start_time=round(record.start_unix * 1e9),
        )
        return CallObserver(shared, record, span, op)

    def replica_cooled(self, replica: str, seconds: float, reason: str) -> None:
        shared = self._shared
        shared.instruments.replica_cooled(shared.urls.server(replica), seconds, reason)

    def bulkhead_rejected(self, tier: str) -> None:
        self._shared.instruments.bulkhead_rejected(tier)

    def register_budget(self, level: Callable[[], float]) -> None:
        self._budgets.add(self, level)
