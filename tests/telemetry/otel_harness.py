"""Drive `OpenTelemetryInstrumentation` with synthetic phase records, as the transport does.

call_started -> attempt_started -> attempt_finished -> call_finished, with spans and metrics read back
from an in-memory SDK (the ``otel`` fixture in ``conftest.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Metric
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmguard_client.telemetry import semconv as sc
from llmguard_client.telemetry._record_builder import AttemptRecordBuilder, CallRecordBuilder
from llmguard_client.telemetry.hooks import CallObservation
from llmguard_client.telemetry.otel import OpenTelemetryInstrumentation
from llmguard_client.telemetry.record import AttemptKind, AttemptOutcome, CallStatus, PhaseRecord

T0 = 1000.0  # monotonic start of every synthetic call
T0_UNIX = 1_700_000_000.0
T0_NS = int(T0_UNIX * 1e9)
R1 = "http://10.0.0.1:8000/v1"
R2 = "http://10.0.0.2:8001/v1"


def ns(offset: float) -> int:
    """Epoch ns of the instant ``offset`` seconds after the synthetic call started."""
    return T0_NS + round(offset * 1e9)


# -------------------------------------------------------------------------------------------
# Harness
# -------------------------------------------------------------------------------------------
@dataclass
class Otel:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    meter_provider: MeterProvider

    def instrumentation(self, **kw: Any) -> OpenTelemetryInstrumentation:
        return OpenTelemetryInstrumentation(self.tracer_provider, self.meter_provider, **kw)

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def metrics(self) -> dict[str, Metric]:
        data = self.reader.get_metrics_data()
        out: dict[str, Metric] = {}
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                assert sm.scope.name == sc.INSTRUMENTATION_SCOPE
                assert sm.scope.schema_url == sc.SCHEMA_URL
                for m in sm.metrics:
                    out[m.name] = m
        return out


def new_record(
    *, stream: bool = True, path: str = "/v1/chat/completions", model: str | None = "gpt-4o", **kw: Any
) -> CallRecordBuilder:
    """A call's record as the transport starts it (the builder; `win` / `end_call` give the final record)."""
    return CallRecordBuilder(
        request_id=kw.pop("request_id", "req-0001"),
        tier=kw.pop("tier", "interactive"),
        cohort=kw.pop("cohort", "guarded"),
        method="POST",
        path=path,
        start=T0,
        start_unix=T0_UNIX,
        model=model,
        stream=stream,
        max_tokens=kw.pop("max_tokens", 64),
        rollout_fraction=kw.pop("rollout_fraction", None),
    )


def begin_attempt(
    obs: CallObservation,
    record: CallRecordBuilder,
    replica: str,
    kind: AttemptKind,
    at: float,
    url: str | None = None,
    resumes: tuple[int, int, str] | None = None,
) -> tuple[AttemptRecordBuilder, dict[str, str]]:
    """As the transport: start the attempt, then announce it just before sending."""
    attempt = record.attempt_started(replica, kind, T0 + at, resumes)
    headers = {"content-type": "application/json"}
    obs.attempt_started(attempt, url or f"{replica}/chat/completions", headers)
    return attempt, headers


def end_attempt(
    obs: CallObservation,
    attempt: AttemptRecordBuilder,
    outcome: AttemptOutcome,
    *,
    finish: float,
    sent: float | None = None,
    headers: float | None = None,
    accepted: float | None = None,
    first_token: float | None = None,
    status_code: int | None = None,
    error: str | None = None,
    retry_after: float | None = None,
) -> None:
    # Synthetic phases in any combination (the builder's methods stamp them in the transport's order only).
    for name, value in (("sent", sent), ("headers", headers), ("accepted", accepted), ("first_token", first_token)):
        if value is not None:
            attempt._fields[name] = T0 + value
    attempt._fields["status_code"] = status_code
    attempt.attempt_finished(outcome, T0 + finish, error=error, retry_after=retry_after)
    obs.attempt_finished(attempt)


def win(
    record: CallRecordBuilder,
    attempt: AttemptRecordBuilder,
    *,
    finish: float,
    prompt: int = 12,
    completion: int | None = 21,
    status: CallStatus = "ok",
    cause: str | None = None,
) -> PhaseRecord:
    """As the transport at the end of a call ``attempt`` won: its final record."""
    record.delivered(attempt, attempt.status_code or 200)
    record.response_facts(prompt, completion, "chatcmpl-abc123", "gpt-4o-2024-08-06", ["stop"], None)
    return record.call_finished(status, cause, T0 + finish)


def end_call(
    record: CallRecordBuilder, status: CallStatus, cause: str | None = None, *, finish: float,
    http_status: int | None = None,
) -> PhaseRecord:  # fmt: skip
    """As the transport at the end of a call without a winner: its final record."""
    if http_status is not None:
        record.answered(http_status)
    return record.call_finished(status, cause, T0 + finish)


def by_name(spans: Sequence[ReadableSpan]) -> tuple[ReadableSpan, list[ReadableSpan]]:
    """The logical span and its attempt spans (in start order)."""
    logical = [s for s in spans if s.parent is None]
    assert len(logical) == 1, [s.name for s in spans]
    attempts = sorted((s for s in spans if s.parent is not None), key=lambda s: s.start_time or 0)
    for s in attempts:
        assert s.parent is not None and s.parent.span_id == logical[0].context.span_id
    return logical[0], attempts


def points(metric: Metric) -> list[Any]:
    return list(metric.data.data_points)


def traceparent_span_id(headers: dict[str, str]) -> int:
    return int(headers["traceparent"].split("-")[2], 16)


SECRETS = ("sk-live-SECRET", "hunter2", "alice", "Bearer", "tok-QUERY", "SECRET PROMPT", "SECRET COMPLETION")


def all_strings(otel: Otel) -> list[str]:
    out: list[str] = []
    for span in otel.finished():
        out.append(span.name)
        for key, value in (span.attributes or {}).items():
            out += [key, str(value)]
        for event in span.events:
            out += [event.name, str(dict(event.attributes or {}))]
        out.append(str(span.status.description))
    for metric in otel.metrics().values():
        for p in points(metric):
            out += [str(dict(p.attributes))]
    return out
