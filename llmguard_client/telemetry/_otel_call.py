"""The `CallObservation` of one logical call: its spans, its ``traceparent`` and its measurements.

One CLIENT span per logical call, and (unless attempt spans are off) one child CLIENT span per physical
attempt, started live in ``attempt_started`` so that the ``traceparent`` injected into that attempt's
headers names it. Spans are ended with the phase timestamps of the record, not the time of the event.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from llmguard_client.telemetry import semconv as sc
from llmguard_client.telemetry._otel_attributes import (
    ATTEMPT_PHASES,
    CALL_PHASES,
    Attrs,
    UrlCache,
    attempt_error_type,
    call_error_type,
    continuation_attributes,
    epoch_ns,
)
from llmguard_client.telemetry._otel_metrics import Instruments
from llmguard_client.telemetry._record_builder import AnyAttempt
from llmguard_client.telemetry.hooks import LiveAttempt, LiveCall
from llmguard_client.telemetry.record import PhaseRecord

__all__ = ["CallObserver", "Shared"]


@dataclass(frozen=True, slots=True)
class Shared:
    """What every call of one instrumentation uses."""

    tracer: Tracer
    instruments: Instruments
    urls: UrlCache
    attempt_spans: bool
    provider_name: str
    propagate: bool
    gen_ai_attributes: bool
    """False: the logical span carries no ``gen_ai.*`` attribute (the SDK's instrumentation has its own span)."""
    gen_ai_metrics: bool
    """False: no GenAI client metric is recorded (the SDK's instrumentation records them)."""


def close_span(
    span: Span, attrs: Attrs, phases: object, names: tuple[tuple[str, str], ...], start: float, err: str | None,
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


def gen_ai_response_attributes(record: PhaseRecord, attrs: Attrs) -> None:
    """The GenAI conventions' attributes of the answer, on the logical span."""
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
        attrs[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = round(record.first_token - record.start, 6)


class CallObserver:
    """The `CallObservation` of one logical call."""

    __slots__ = ("_attempt_spans", "_ctx", "_done", "_op", "_record", "_refusals", "_shared", "_span", "_winner")

    def __init__(self, shared: Shared, record: LiveCall, span: Span, op: str) -> None:
        self._shared = shared
        self._record = record
        self._span = span
        self._op = op
        self._ctx: Context | None = None
        self._attempt_spans: dict[int, Span] = {}
        self._refusals = 0
        self._done = False
        self._winner: LiveAttempt | None = None

    def _context(self) -> Context:
        ctx = self._ctx
        if ctx is None:
            ctx = self._ctx = trace.set_span_in_context(self._span)
        return ctx

    # -- CallObservation protocol ---------------------------------------------------------------
    def attempt_started(self, attempt: LiveAttempt, url: str, headers: MutableMapping[str, str]) -> None:
        shared = self._shared
        if not shared.attempt_spans:
            if shared.propagate:
                propagate.inject(headers, context=self._context())
            return
        record = self._record
        scrubbed, server = shared.urls.url(url)
        attrs: Attrs = {
            sc.HTTP_REQUEST_METHOD: record.method,
            sc.URL_FULL: scrubbed,
            sc.LLMGUARD_ATTEMPT_KIND: attempt.kind,
            sc.LLMGUARD_ATTEMPT_INDEX: attempt.index,
        }
        if server is not None:
            attrs[sc.SERVER_ADDRESS], attrs[sc.SERVER_PORT] = server
        if attempt.index > 0:
            attrs[sc.HTTP_REQUEST_RESEND_COUNT] = attempt.index
        if attempt.kind == "continuation":
            continuation_attributes(attempt, attrs)
        span = shared.tracer.start_span(
            record.method,
            context=self._context(),
            kind=SpanKind.CLIENT,
            attributes=attrs,
            start_time=epoch_ns(record, attempt.start),
        )
        self._attempt_spans[attempt.index] = span
        if shared.propagate:
            propagate.inject(headers, context=trace.set_span_in_context(span, self._context()))

    def attempt_finished(self, attempt: LiveAttempt) -> None:
        if attempt.outcome == "won" and not self._done:
            # The transport reports the winner just before the call's end: wait for it, to know
            # whether its body completed (a stream can still break or stall after winning).
            self._winner = attempt
            return
        self._attempt_done(attempt, None)

    def budget_refused(self, record: LiveCall) -> None:
        self._refusals += 1
        self._shared.instruments.budget_refused(record)

    def call_finished(self, record: PhaseRecord) -> None:
        if self._done:
            return
        self._done = True
        shared = self._shared
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
                    span.end(end_time=epoch_ns(record, record.finish))
                else:
                    self._attempt_done(attempt, err if attempt.outcome == "won" else None)

        server = shared.urls.server(record.replica) if record.replica else None
        span = self._span
        if span.is_recording():
            self._end_logical_span(span, record, err, server)
        else:
            span.end(end_time=epoch_ns(record, record.finish))
        if shared.gen_ai_metrics:
            shared.instruments.gen_ai_call(record, self._op, shared.provider_name, err, server)
        shared.instruments.call(record, self._op, err)

    # -- helpers --------------------------------------------------------------------------------
    def _attempt_done(self, attempt: AnyAttempt, call_err: str | None) -> None:
        shared = self._shared
        record = self._record
        err = attempt_error_type(attempt) or call_err
        shared.instruments.attempt_kind_outcome(record, attempt)
        span = self._attempt_spans.pop(attempt.index, None)
        if not shared.attempt_spans:
            return
        if attempt.finish is not None:
            shared.instruments.http_request(record, attempt, shared.urls.server(attempt.replica), err)
        if span is not None:
            self._end_attempt_span(span, attempt, err)

    def _end_attempt_span(self, span: Span, attempt: AnyAttempt, err: str | None) -> None:
        record = self._record
        if span.is_recording():
            attrs: Attrs = {sc.LLMGUARD_ATTEMPT_OUTCOME: attempt.outcome}
            if attempt.status_code is not None:
                attrs[sc.HTTP_RESPONSE_STATUS_CODE] = attempt.status_code
            if attempt.retry_after is not None:
                attrs[sc.LLMGUARD_RETRY_AFTER] = attempt.retry_after
            if attempt.chaos:
                attrs[sc.LLMGUARD_CHAOS] = attempt.chaos
            close_span(span, attrs, attempt, ATTEMPT_PHASES, record.start, err, epoch_ns(record, attempt.finish))
        else:
            span.end(end_time=epoch_ns(record, attempt.finish))

    def _end_logical_span(
        self, span: Span, record: PhaseRecord, err: str | None, server: tuple[str, int] | None
    ) -> None:
        start = record.start
        attempts = record.attempts
        attrs: Attrs = {
            sc.LLMGUARD_STATUS: record.status,
            sc.LLMGUARD_ATTEMPTS: len(attempts),
            sc.LLMGUARD_HEDGED: any(a.kind == "hedge" for a in attempts),
            sc.LLMGUARD_RETRIED: any(a.kind == "retry" for a in attempts),
        }
        if record.cause:
            attrs[sc.LLMGUARD_CAUSE] = record.cause
        if record.continued:
            attrs[sc.LLMGUARD_CONTINUED] = True
        if record.not_continued is not None:
            attrs[sc.LLMGUARD_NOT_CONTINUED] = record.not_continued
        if record.one_attempt is not None:
            attrs[sc.LLMGUARD_ONE_ATTEMPT] = record.one_attempt
        if self._refusals:
            attrs[sc.LLMGUARD_BUDGET_REFUSALS] = self._refusals
        if self._shared.gen_ai_attributes:
            gen_ai_response_attributes(record, attrs)
        if server is not None:
            attrs[sc.SERVER_ADDRESS], attrs[sc.SERVER_PORT] = server
        if record.http_status is not None:
            attrs[sc.HTTP_RESPONSE_STATUS_CODE] = record.http_status
        close_span(span, attrs, record, CALL_PHASES, start, err, epoch_ns(record, record.finish))
