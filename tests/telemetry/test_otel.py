"""OpenTelemetry instrumentation: spans, metrics, propagation and privacy.

The first tests drive `OpenTelemetryInstrumentation` with synthetic records exactly as the
transport does (call_started -> attempt_started -> attempt_finished -> call_finished); the
end-to-end tests at the bottom go through a real `Guard` and a loopback server.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import context, trace
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader, Metric, NumberDataPoint
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    NonRecordingSpan,
    NoOpTracerProvider,
    ProxyTracerProvider,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
)

from llmguard_client.telemetry import semconv as sc
from llmguard_client.telemetry.hooks import NO_INSTRUMENTATION, CallObservation
from llmguard_client.telemetry.otel import (
    OpenTelemetryInstrumentation,
    call_error_type,
    operation_name,
    scrub_url,
    server_of,
)
from llmguard_client.telemetry.record import AttemptKind, AttemptOutcome, AttemptRecord, PhaseRecord
from tests.loopback import LoopbackServer, Script

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


@pytest.fixture
def otel() -> Iterator[Otel]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    yield Otel(exporter, reader, tp, mp)
    tp.shutdown()
    mp.shutdown()


def new_record(
    *, stream: bool = True, path: str = "/v1/chat/completions", model: str | None = "gpt-4o", **kw: Any
) -> PhaseRecord:
    return PhaseRecord(
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
        **kw,
    )


def begin_attempt(
    obs: CallObservation, record: PhaseRecord, replica: str, kind: AttemptKind, at: float, url: str | None = None
) -> tuple[AttemptRecord, dict[str, str]]:
    """As the transport: append the attempt, then announce it just before sending."""
    attempt = AttemptRecord(index=len(record.attempts), replica=replica, kind=kind, start=T0 + at)
    record.attempts.append(attempt)
    headers = {"content-type": "application/json"}
    obs.attempt_started(attempt, url or f"{replica}/chat/completions", headers)
    return attempt, headers


def end_attempt(
    obs: CallObservation,
    attempt: AttemptRecord,
    outcome: AttemptOutcome,
    *,
    finish: float,
    sent: float | None = None,
    headers: float | None = None,
    first_token: float | None = None,
    status_code: int | None = None,
    error: str | None = None,
    retry_after: float | None = None,
) -> None:
    for name, value in (("sent", sent), ("headers", headers), ("first_token", first_token)):
        if value is not None:
            setattr(attempt, name, T0 + value)
    attempt.finish = T0 + finish
    attempt.outcome = outcome
    attempt.status_code = status_code
    attempt.error = error
    attempt.retry_after = retry_after
    obs.attempt_finished(attempt)


def win(record: PhaseRecord, attempt: AttemptRecord, *, finish: float, prompt: int = 12, completion: int = 21) -> None:
    record.replica = attempt.replica
    record.sent, record.headers, record.first_token = attempt.sent, attempt.headers, attempt.first_token
    record.finish = T0 + finish
    record.status = "ok"
    record.http_status = attempt.status_code
    record.prompt_tokens, record.completion_tokens = prompt, completion
    record.response_id = "chatcmpl-abc123"
    record.response_model = "gpt-4o-2024-08-06"
    record.finish_reasons = ["stop"]


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


# -------------------------------------------------------------------------------------------
# Synthetic calls
# -------------------------------------------------------------------------------------------
def test_streamed_call(otel: Otel) -> None:
    inst = otel.instrumentation()
    record = new_record()
    record.queued = T0 + 0.001
    obs = inst.call_started(record)
    attempt, headers = begin_attempt(obs, record, R1, "primary", 0.002)
    end_attempt(obs, attempt, "won", sent=0.003, headers=0.050, first_token=0.120, status_code=200, finish=0.900)
    win(record, attempt, finish=0.900, completion=41)
    obs.call_finished(record)

    logical, (child,) = by_name(otel.finished())
    assert logical.name == "chat gpt-4o"
    assert logical.kind is SpanKind.CLIENT
    assert logical.status.status_code is StatusCode.UNSET
    assert logical.instrumentation_scope is not None
    assert logical.instrumentation_scope.schema_url == sc.SCHEMA_URL
    assert (logical.start_time, logical.end_time) == (T0_NS, ns(0.900))
    a = dict(logical.attributes or {})
    assert a == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.request.max_tokens": 64,
        "gen_ai.request.stream": True,
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "gen_ai.response.id": "chatcmpl-abc123",
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 41,
        "gen_ai.response.time_to_first_chunk": pytest.approx(0.120),
        "server.address": "10.0.0.1",
        "server.port": 8000,
        "http.response.status_code": 200,
        "llmguard.tier": "interactive",
        "llmguard.cohort": "guarded",
        "llmguard.request_id": "req-0001",
        "llmguard.status": "ok",
        "llmguard.attempts": 1,
        "llmguard.hedged": False,
        "llmguard.retried": False,
        "llmguard.phase.queued_s": pytest.approx(0.001),
        "llmguard.phase.sent_s": pytest.approx(0.003),
        "llmguard.phase.headers_s": pytest.approx(0.050),
        "llmguard.phase.first_token_s": pytest.approx(0.120),
        "llmguard.phase.finish_s": pytest.approx(0.900),
    }

    assert child.name == "POST"
    assert child.kind is SpanKind.CLIENT
    assert child.status.status_code is StatusCode.UNSET
    assert (child.start_time, child.end_time) == (ns(0.002), ns(0.900))
    assert child.context.trace_id == logical.context.trace_id
    assert traceparent_span_id(headers) == child.context.span_id  # the server joins the attempt span
    c = dict(child.attributes or {})
    assert c == {
        "http.request.method": "POST",
        "url.full": "http://10.0.0.1:8000/v1/chat/completions",
        "server.address": "10.0.0.1",
        "server.port": 8000,
        "http.response.status_code": 200,
        "llmguard.attempt.kind": "primary",
        "llmguard.attempt.index": 0,
        "llmguard.attempt.outcome": "won",
        "llmguard.phase.start_s": pytest.approx(0.002),
        "llmguard.phase.sent_s": pytest.approx(0.003),
        "llmguard.phase.headers_s": pytest.approx(0.050),
        "llmguard.phase.first_token_s": pytest.approx(0.120),
        "llmguard.phase.finish_s": pytest.approx(0.900),
    }

    m = otel.metrics()
    (dur,) = points(m[sc.GEN_AI_CLIENT_OPERATION_DURATION])
    assert dur.count == 1 and dur.sum == pytest.approx(0.900)
    assert dict(dur.attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "server.address": "10.0.0.1",
        "server.port": 8000,
        "llmguard.tier": "interactive",
        "llmguard.cohort": "guarded",
    }
    (ttfc,) = points(m[sc.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK])
    assert ttfc.count == 1 and ttfc.sum == pytest.approx(0.120)
    (tpoc,) = points(m[sc.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK])
    assert tpoc.count == 1 and tpoc.sum == pytest.approx((0.900 - 0.120) / 40)
    tokens = {p.attributes["gen_ai.token.type"]: p for p in points(m[sc.GEN_AI_CLIENT_TOKEN_USAGE])}
    assert (tokens["input"].sum, tokens["output"].sum) == (12, 41)
    (http,) = points(m[sc.HTTP_CLIENT_REQUEST_DURATION])
    assert http.count == 1 and http.sum == pytest.approx(0.898)
    assert dict(http.attributes) == {
        "http.request.method": "POST",
        "server.address": "10.0.0.1",
        "server.port": 8000,
        "http.response.status_code": 200,
        "llmguard.tier": "interactive",
        "llmguard.cohort": "guarded",
        "llmguard.attempt.outcome": "won",
    }
    (att,) = points(m[sc.LLMGUARD_CLIENT_ATTEMPTS])
    assert att.value == 1
    assert att.attributes["llmguard.attempt.kind"] == "primary"
    (calls,) = points(m[sc.LLMGUARD_CLIENT_CALLS])
    assert calls.value == 1
    assert dict(calls.attributes) == {
        "gen_ai.operation.name": "chat",
        "llmguard.tier": "interactive",
        "llmguard.cohort": "guarded",
        "llmguard.status": "ok",
    }


@pytest.mark.parametrize("loser_outcome", ["lost", "cancelled"])
def test_hedged_call(otel: Otel, loser_outcome: AttemptOutcome) -> None:
    inst = otel.instrumentation()
    record = new_record()
    obs = inst.call_started(record)
    primary, h1 = begin_attempt(obs, record, R1, "primary", 0.0)
    hedge, h2 = begin_attempt(obs, record, R2, "hedge", 0.300)
    end_attempt(obs, hedge, "won", sent=0.301, headers=0.330, first_token=0.360, status_code=200, finish=0.361)
    # The primary is closed once the hedge won its race on the first token.
    end_attempt(obs, primary, loser_outcome, sent=0.001, finish=0.362)
    win(record, hedge, finish=1.0)
    obs.call_finished(record)

    logical, (p_span, h_span) = by_name(otel.finished())
    assert h1["traceparent"] != h2["traceparent"]
    assert traceparent_span_id(h1) == p_span.context.span_id
    assert traceparent_span_id(h2) == h_span.context.span_id
    la = logical.attributes or {}
    assert la["llmguard.hedged"] is True and la["llmguard.retried"] is False
    assert la["llmguard.attempts"] == 2
    assert (la["server.address"], la["server.port"]) == ("10.0.0.2", 8001)  # the winner
    assert logical.status.status_code is StatusCode.UNSET

    assert (p_span.attributes or {})["llmguard.attempt.outcome"] == loser_outcome
    assert p_span.status.status_code is StatusCode.UNSET  # a cancelled loser is no error
    assert "error.type" not in (p_span.attributes or {})
    assert "http.response.status_code" not in (p_span.attributes or {})
    assert p_span.end_time == ns(0.362)
    ha = h_span.attributes or {}
    assert ha["llmguard.attempt.kind"] == "hedge"
    assert ha["llmguard.attempt.outcome"] == "won"
    assert ha["http.request.resend_count"] == 1
    assert h_span.start_time == ns(0.300)

    m = otel.metrics()
    outcomes = {(p.attributes["llmguard.attempt.kind"], p.attributes["llmguard.attempt.outcome"]): p.value
                for p in points(m[sc.LLMGUARD_CLIENT_ATTEMPTS])}  # fmt: skip
    assert outcomes == {("primary", loser_outcome): 1, ("hedge", "won"): 1}
    assert sum(p.count for p in points(m[sc.HTTP_CLIENT_REQUEST_DURATION])) == 2
    assert sum(p.count for p in points(m[sc.GEN_AI_CLIENT_OPERATION_DURATION])) == 1


def test_retried_call(otel: Otel) -> None:
    inst = otel.instrumentation()
    record = new_record(stream=False)
    obs = inst.call_started(record)
    first, _ = begin_attempt(obs, record, R1, "primary", 0.0)
    end_attempt(obs, first, "failed", sent=0.001, headers=0.010, status_code=429, error="http_429",
                retry_after=1.5, finish=0.011)  # fmt: skip
    inst.replica_cooled(R1, 1.5, "retry_after")
    retry, _ = begin_attempt(obs, record, R2, "retry", 0.050)
    end_attempt(obs, retry, "won", sent=0.051, headers=0.200, first_token=0.400, status_code=200, finish=0.400)
    win(record, retry, finish=0.400)
    obs.call_finished(record)

    logical, (f_span, r_span) = by_name(otel.finished())
    assert logical.status.status_code is StatusCode.UNSET  # a retried error is not the call's
    la = logical.attributes or {}
    assert "error.type" not in la
    assert la["llmguard.retried"] is True and la["llmguard.hedged"] is False
    assert la["gen_ai.request.stream"] is False
    assert "gen_ai.response.time_to_first_chunk" not in la  # streams only

    fa = f_span.attributes or {}
    assert f_span.status.status_code is StatusCode.ERROR
    assert fa["error.type"] == "429"
    assert fa["http.response.status_code"] == 429
    assert fa["llmguard.retry_after_s"] == 1.5
    assert fa["llmguard.attempt.outcome"] == "failed"
    assert "http.request.resend_count" not in fa
    ra = r_span.attributes or {}
    assert ra["http.request.resend_count"] == 1
    assert ra["llmguard.attempt.kind"] == "retry"
    assert "llmguard.retry_after_s" not in ra
    assert r_span.status.status_code is StatusCode.UNSET

    m = otel.metrics()
    assert sc.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK not in m  # not a stream
    assert sc.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK not in m
    (dur,) = points(m[sc.GEN_AI_CLIENT_OPERATION_DURATION])
    assert "error.type" not in dur.attributes
    http = {p.attributes.get("error.type"): p for p in points(m[sc.HTTP_CLIENT_REQUEST_DURATION])}
    assert set(http) == {"429", None}
    (cool,) = points(m[sc.LLMGUARD_CLIENT_REPLICA_COOLDOWNS])
    assert cool.value == 1
    assert dict(cool.attributes) == {
        "server.address": "10.0.0.1",
        "server.port": 8000,
        "llmguard.cooldown.reason": "retry_after",
    }
    (cool_s,) = points(m[sc.LLMGUARD_CLIENT_REPLICA_COOLDOWN_DURATION])
    assert cool_s.sum == 1.5


@pytest.mark.parametrize(
    ("status", "cause", "http_status", "error_type"),
    [
        ("http_error", "upstream_status", 503, "503"),
        ("timeout", "ttft_timeout", None, "ttft_timeout"),
        ("error", "connect_error", None, "connect_error"),
        ("rejected", "budget_exhausted", None, "budget_exhausted"),
    ],
)
def test_failed_call(otel: Otel, status: Any, cause: str, http_status: int | None, error_type: str) -> None:
    inst = otel.instrumentation()
    record = new_record()
    obs = inst.call_started(record)
    first, _ = begin_attempt(obs, record, R1, "primary", 0.0)
    end_attempt(obs, first, "failed", sent=0.001, headers=0.01, status_code=503, error="http_503", finish=0.02)
    second, _ = begin_attempt(obs, record, R2, "retry", 0.05)
    end_attempt(obs, second, "failed", error="connect_error", finish=0.06)
    obs.budget_refused(record)
    record.status, record.cause, record.http_status = status, cause, http_status
    record.finish = T0 + 0.07
    obs.call_finished(record)

    logical, (a1, a2) = by_name(otel.finished())
    assert logical.status.status_code is StatusCode.ERROR
    assert logical.status.description == error_type
    la = logical.attributes or {}
    assert la["error.type"] == error_type
    assert la["llmguard.status"] == status
    assert la["llmguard.cause"] == cause
    assert la["llmguard.budget_refusals"] == 1
    assert "server.address" not in la  # no winner
    assert (a1.attributes or {})["error.type"] == "503"
    assert (a2.attributes or {})["error.type"] == "connect_error"
    assert a2.status.status_code is StatusCode.ERROR

    m = otel.metrics()
    (dur,) = points(m[sc.GEN_AI_CLIENT_OPERATION_DURATION])
    assert dur.attributes["error.type"] == error_type
    assert dur.count == 1 and dur.sum == pytest.approx(0.07)
    assert sc.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK not in m  # no first chunk
    (ref,) = points(m[sc.LLMGUARD_CLIENT_BUDGET_REFUSALS])
    assert ref.value == 1
    assert dict(ref.attributes) == {"llmguard.tier": "interactive", "llmguard.cohort": "guarded"}
    (calls,) = points(m[sc.LLMGUARD_CLIENT_CALLS])
    assert calls.attributes["llmguard.status"] == status
    assert calls.attributes["error.type"] == error_type


@pytest.mark.parametrize(("status", "cause"), [("error", "read_error"), ("timeout", "stall_timeout")])
def test_stream_that_breaks_after_winning(otel: Otel, status: Any, cause: str) -> None:
    inst = otel.instrumentation()
    record = new_record()
    obs = inst.call_started(record)
    attempt, _ = begin_attempt(obs, record, R1, "primary", 0.0)
    # As the transport: the winner is reported just before the call's end.
    end_attempt(obs, attempt, "won", sent=0.01, headers=0.02, first_token=0.03, status_code=200, finish=0.4)
    win(record, attempt, finish=0.4)
    record.status, record.cause = status, cause
    obs.call_finished(record)
    logical, (child,) = by_name(otel.finished())
    assert (logical.attributes or {})["error.type"] == cause
    assert (child.attributes or {})["error.type"] == cause
    assert (child.attributes or {})["llmguard.attempt.outcome"] == "won"
    assert child.status.status_code is StatusCode.ERROR
    (http,) = points(otel.metrics()[sc.HTTP_CLIENT_REQUEST_DURATION])
    assert http.attributes["error.type"] == cause


@pytest.mark.parametrize("status", ["cancelled", "abandoned"])
def test_caller_cancel_is_not_an_error(otel: Otel, status: Any) -> None:
    inst = otel.instrumentation()
    record = new_record()
    obs = inst.call_started(record)
    attempt, _ = begin_attempt(obs, record, R1, "primary", 0.0)
    end_attempt(obs, attempt, "cancelled", sent=0.001, finish=0.5)
    record.status, record.finish = status, T0 + 0.5
    obs.call_finished(record)
    logical, (child,) = by_name(otel.finished())
    assert logical.status.status_code is StatusCode.UNSET
    assert "error.type" not in (logical.attributes or {})
    assert (logical.attributes or {})["llmguard.status"] == status
    assert child.status.status_code is StatusCode.UNSET


def test_metrics_once_per_logical_call_with_units_and_buckets(otel: Otel) -> None:
    inst = otel.instrumentation()
    for i in range(3):
        record = new_record(request_id=f"req-{i}", cohort="control" if i == 2 else "guarded")
        obs = inst.call_started(record)
        primary, _ = begin_attempt(obs, record, R1, "primary", 0.0)
        hedge, _ = begin_attempt(obs, record, R2, "hedge", 0.1)
        end_attempt(obs, hedge, "won", sent=0.11, headers=0.12, first_token=0.2, status_code=200, finish=0.3)
        end_attempt(obs, primary, "lost", sent=0.01, finish=0.21)
        win(record, hedge, finish=0.3 + i)
        obs.call_finished(record)
        obs.call_finished(record)  # a second end is ignored
    assert len(otel.finished()) == 9

    m = otel.metrics()
    expected = {
        sc.GEN_AI_CLIENT_OPERATION_DURATION: ("s", sc.GEN_AI_DURATION_BUCKETS, 3),
        sc.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK: ("s", sc.GEN_AI_DURATION_BUCKETS, 3),
        sc.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK: ("s", sc.GEN_AI_DURATION_BUCKETS, 3),
        sc.GEN_AI_CLIENT_TOKEN_USAGE: ("{token}", sc.GEN_AI_TOKEN_BUCKETS, 6),  # input + output
        sc.HTTP_CLIENT_REQUEST_DURATION: ("s", sc.HTTP_DURATION_BUCKETS, 6),  # per attempt
    }
    for name, (unit, buckets, count) in expected.items():
        metric = m[name]
        assert metric.unit == unit, name
        pts = points(metric)
        assert all(isinstance(p, HistogramDataPoint) for p in pts)
        assert all(tuple(p.explicit_bounds) == tuple(buckets) for p in pts), name
        assert sum(p.count for p in pts) == count, name
    assert sc.GEN_AI_DURATION_BUCKETS[0] == 0.01 and sc.GEN_AI_DURATION_BUCKETS[-1] == 81.92
    assert sc.GEN_AI_TOKEN_BUCKETS[-1] == 67108864

    cohorts = {p.attributes["llmguard.cohort"]: p.count for p in points(m[sc.GEN_AI_CLIENT_OPERATION_DURATION])}
    assert cohorts == {"guarded": 2, "control": 1}
    calls = {p.attributes["llmguard.cohort"]: p.value for p in points(m[sc.LLMGUARD_CLIENT_CALLS])}
    assert calls == {"guarded": 2, "control": 1}
    assert m[sc.LLMGUARD_CLIENT_CALLS].unit == "{call}"
    assert m[sc.LLMGUARD_CLIENT_ATTEMPTS].unit == "{attempt}"

    # Low cardinality: no request id, no URL in any metric attribute.
    for metric in m.values():
        for p in points(metric):
            for key, value in p.attributes.items():
                assert key not in (sc.LLMGUARD_REQUEST_ID, sc.URL_FULL, sc.GEN_AI_RESPONSE_ID)
                assert "req-" not in str(value) and "/" not in str(value)


SECRETS = ("sk-live-SECRET", "hunter2", "alice", "Bearer", "tok-QUERY", "SECRET PROMPT", "SECRET COMPLETION")


def _all_strings(otel: Otel) -> list[str]:
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


def test_no_secret_in_any_attribute(otel: Otel) -> None:
    inst = otel.instrumentation()
    record = new_record()
    obs = inst.call_started(record)
    url = "https://alice:hunter2@api.example.com/openai/v1/chat/completions?api-version=2024-06-01&key=tok-QUERY#frag"
    attempt = AttemptRecord(index=0, replica="https://api.example.com/openai/v1", kind="primary", start=T0)
    record.attempts.append(attempt)
    headers = {"authorization": "Bearer sk-live-SECRET", "api-key": "sk-live-SECRET"}
    obs.attempt_started(attempt, url, headers)
    assert headers["authorization"] == "Bearer sk-live-SECRET"  # untouched, only traceparent added
    assert set(headers) <= {"authorization", "api-key", "traceparent", "tracestate", "baggage"}
    end_attempt(obs, attempt, "won", sent=0.01, headers=0.02, first_token=0.03, status_code=200, finish=0.1)
    win(record, attempt, finish=0.1)
    obs.call_finished(record)

    (_, (child,)) = by_name(otel.finished())
    assert (child.attributes or {})["url.full"] == (
        "https://REDACTED:REDACTED@api.example.com/openai/v1/chat/completions?api-version=2024-06-01&key=REDACTED"
    )
    assert ((child.attributes or {})["server.address"], (child.attributes or {})["server.port"]) == (
        "api.example.com",
        443,
    )
    for text in _all_strings(otel):
        for secret in SECRETS:
            assert secret not in text, (secret, text)


def test_attempt_spans_off(otel: Otel) -> None:
    inst = otel.instrumentation(attempt_spans=False)
    record = new_record()
    obs = inst.call_started(record)
    attempt, headers = begin_attempt(obs, record, R1, "primary", 0.0)
    end_attempt(obs, attempt, "won", sent=0.01, headers=0.02, first_token=0.03, status_code=200, finish=0.1)
    win(record, attempt, finish=0.1)
    obs.call_finished(record)
    (logical,) = otel.finished()
    assert traceparent_span_id(headers) == logical.context.span_id
    m = otel.metrics()
    assert sc.HTTP_CLIENT_REQUEST_DURATION not in m  # left to opentelemetry-instrumentation-httpx
    assert sc.LLMGUARD_CLIENT_ATTEMPTS in m
    assert sc.GEN_AI_CLIENT_OPERATION_DURATION in m


def test_unfinished_attempt_is_closed_with_the_call(otel: Otel) -> None:
    inst = otel.instrumentation()
    record = new_record()
    obs = inst.call_started(record)
    attempt, _ = begin_attempt(obs, record, R1, "primary", 0.0)
    attempt.outcome, attempt.finish = "cancelled", T0 + 0.2
    record.status, record.cause, record.finish = "timeout", "total_timeout", T0 + 0.2
    obs.call_finished(record)  # attempt_finished never came
    logical, (child,) = by_name(otel.finished())
    assert child.end_time == ns(0.2)
    assert (logical.attributes or {})["error.type"] == "total_timeout"


def test_provider_name_and_operations(otel: Otel) -> None:
    inst = otel.instrumentation(provider_name="azure.ai.openai")
    for path, model, name in [
        ("/v1/embeddings", "text-embedding-3-small", "embeddings text-embedding-3-small"),
        ("/v1/completions", "gpt-3.5-turbo-instruct", "text_completion gpt-3.5-turbo-instruct"),
        ("/v1/chat/completions", None, "chat"),
    ]:
        record = new_record(path=path, model=model, stream=False, max_tokens=None)
        obs = inst.call_started(record)
        record.status, record.finish = "ok", T0 + 0.01
        obs.call_finished(record)
        span = otel.finished()[-1]
        assert span.name == name
        attrs = span.attributes or {}
        assert attrs["gen_ai.provider.name"] == "azure.ai.openai"
        assert "gen_ai.request.max_tokens" not in attrs


def test_guard_level_metrics(otel: Otel) -> None:
    inst = otel.instrumentation()
    other = otel.instrumentation()  # a second guard on the same providers

    class Budget:
        def __init__(self, level: float) -> None:
            self.value = level

        def level(self) -> float:
            return self.value

    b1, b2 = Budget(7.5), Budget(2.0)
    inst.register_budget(b1.level)
    other.register_budget(lambda: b2.value)  # as Guard registers it
    inst.bulkhead_rejected("batch")
    inst.bulkhead_rejected("batch")
    m = otel.metrics()
    (bulk,) = points(m[sc.LLMGUARD_CLIENT_BULKHEAD_REJECTIONS])
    assert (bulk.value, dict(bulk.attributes)) == (2, {"llmguard.tier": "batch"})
    assert m[sc.LLMGUARD_CLIENT_BUDGET_LEVEL].unit == "{attempt}"
    assert all(isinstance(p, NumberDataPoint) for p in points(m[sc.LLMGUARD_CLIENT_BUDGET_LEVEL]))

    def levels() -> list[tuple[float, dict[str, Any]]]:
        pts = points(otel.metrics()[sc.LLMGUARD_CLIENT_BUDGET_LEVEL])
        return sorted((p.value, dict(p.attributes or {})) for p in pts)

    assert levels() == [(2.0, {"llmguard.budget.index": 1}), (7.5, {})]
    b1.value = 3.0
    del other  # an entry lives as long as the instrumentation that registered it
    gc.collect()
    assert levels() == [(3.0, {})]
    third = otel.instrumentation()
    third.register_budget(b2.level)  # the free index is reused
    assert levels() == [(2.0, {"llmguard.budget.index": 1}), (3.0, {})]
    del b1  # a bound method is held weakly
    gc.collect()
    assert levels() == [(2.0, {"llmguard.budget.index": 1})]


def test_noop_providers_do_nothing_and_inject_nothing() -> None:
    inst = OpenTelemetryInstrumentation(NoOpTracerProvider(), NoOpMeterProvider())
    record = new_record()
    obs = inst.call_started(record)
    attempt, headers = begin_attempt(obs, record, R1, "primary", 0.0)
    end_attempt(obs, attempt, "won", status_code=200, finish=0.1)
    win(record, attempt, finish=0.1)
    inst.replica_cooled(R1, 1.0, "circuit_open")
    inst.bulkhead_rejected("interactive")
    inst.register_budget(lambda: 1.0)
    obs.call_finished(record)
    assert "traceparent" not in headers


def test_default_without_sdk_is_the_noop_fast_path() -> None:
    if not isinstance(trace.get_tracer_provider(), ProxyTracerProvider):
        pytest.skip("a global tracer provider was set in this process")
    inst = OpenTelemetryInstrumentation()  # what Guard uses by default
    assert inst.call_started(new_record()) is NO_INSTRUMENTATION.call_started(new_record())
    # Without an SDK an incoming trace context is still passed on to the server.
    remote = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    token = context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
    try:
        record = new_record()
        obs = inst.call_started(record)
        attempt, headers = begin_attempt(obs, record, R1, "primary", 0.0)
        end_attempt(obs, attempt, "won", status_code=200, finish=0.1)
        win(record, attempt, finish=0.1)
        obs.call_finished(record)
    finally:
        context.detach(token)
    assert headers["traceparent"] == f"00-{0x1234:032x}-{0x5678:016x}-01"


_LATE_SDK = """
import json, sys
sys.path.insert(0, {root!r})
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from llmguard_client.telemetry.otel import OpenTelemetryInstrumentation
from tests.telemetry.test_otel import R1, begin_attempt, end_attempt, new_record, win

def call(inst):
    record = new_record()
    obs = inst.call_started(record)
    attempt, headers = begin_attempt(obs, record, R1, "primary", 0.0)
    end_attempt(obs, attempt, "won", status_code=200, first_token=0.05, finish=0.1)
    win(record, attempt, finish=0.1)
    obs.call_finished(record)
    return headers

inst = OpenTelemetryInstrumentation()  # made before the SDK is configured, as a Guard often is
before = call(inst)
exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
tp = TracerProvider()
tp.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(tp)
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
after = call(inst)
names = [m.name for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
print(json.dumps({{"before": before, "after": after, "spans": [s.name for s in exporter.get_finished_spans()],
                  "metrics": sorted(names)}}))
"""


def test_sdk_configured_after_the_instrumentation_is_followed() -> None:
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(
        [sys.executable, "-c", _LATE_SDK.format(root=root)], capture_output=True, text=True, timeout=60, cwd=root
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "traceparent" not in result["before"]
    assert "traceparent" in result["after"]
    assert result["spans"] == ["POST", "chat gpt-4o"]
    assert sc.GEN_AI_CLIENT_OPERATION_DURATION in result["metrics"]


def test_runtime_needs_only_the_api() -> None:
    code = (
        "import sys; sys.modules['opentelemetry.sdk'] = None\n"  # importing the SDK would now fail
        "from llmguard_client import Guard\n"
        "from llmguard_client.telemetry.otel import OpenTelemetryInstrumentation\n"
        "OpenTelemetryInstrumentation(); Guard(replicas=['http://127.0.0.1:9'])\n"
        "print('ok')"
    )
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_metrics_without_traces(otel: Otel) -> None:
    inst = OpenTelemetryInstrumentation(NoOpTracerProvider(), otel.meter_provider)
    record = new_record()
    obs = inst.call_started(record)
    attempt, headers = begin_attempt(obs, record, R1, "primary", 0.0)
    end_attempt(obs, attempt, "won", status_code=200, first_token=0.05, finish=0.1)
    win(record, attempt, finish=0.1)
    obs.call_finished(record)
    assert "traceparent" not in headers and otel.finished() == []
    assert sum(p.count for p in points(otel.metrics()[sc.GEN_AI_CLIENT_OPERATION_DURATION])) == 1


# -------------------------------------------------------------------------------------------
# Helpers
# -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/chat/completions", "chat"),
        ("/v1/chat/completions", "chat"),
        ("/openai/deployments/x/chat/completions/", "chat"),
        ("/v1/completions", "text_completion"),
        ("/v1/embeddings", "embeddings"),
        ("/v1/models", "_OTHER"),
    ],
)
def test_operation_name(path: str, name: str) -> None:
    assert operation_name(path) == name


@pytest.mark.parametrize(
    ("url", "scrubbed"),
    [
        ("http://h:1/v1/chat/completions", "http://h:1/v1/chat/completions"),
        ("https://u:p@h/v1", "https://REDACTED:REDACTED@h/v1"),
        ("https://sk-token@h/v1", "https://REDACTED@h/v1"),
        ("https://h/v1?api-version=1&api_key=s&flag", "https://h/v1?api-version=1&api_key=REDACTED&flag"),
        ("https://h/v1#x", "https://h/v1"),
        ("http://[::1]:80/x", "http://[::1]:80/x"),
    ],
)
def test_scrub_url(url: str, scrubbed: str) -> None:
    assert scrub_url(url) == scrubbed


def test_server_of() -> None:
    assert server_of("http://127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert server_of("https://Example.COM/v1") == ("example.com", 443)
    assert server_of("http://[::1]/v1") == ("::1", 80)
    assert server_of("http://h:notaport/") is None
    assert server_of("/relative") is None


def test_call_error_type() -> None:
    record = new_record()
    assert call_error_type(record) is None  # pending
    record.status = "ok"
    assert call_error_type(record) is None
    record.status, record.http_status = "http_error", 500
    assert call_error_type(record) == "500"
    record.status, record.http_status, record.cause = "timeout", None, None
    assert call_error_type(record) == "timeout"


# -------------------------------------------------------------------------------------------
# End to end: a real Guard, real loopback servers (tests/conftest.py, tests/loopback.py)
# -------------------------------------------------------------------------------------------
CHAT = "/v1/chat/completions"
PROMPT = "SECRET PROMPT do not log"
STREAM_BODY: dict[str, Any] = {
    "model": "test-model",
    "messages": [{"role": "user", "content": PROMPT}],
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_tokens": 50,
}


def e2e_guard(otel: Otel, replicas: Sequence[Any], **kw: Any) -> Any:
    from llmguard_client import Guard, Tier

    kw.setdefault("tiers", {"interactive": Tier(ttft=2.0, total=10.0, stall=2.0)})
    kw.setdefault("hedge", None)
    return Guard(replicas=list(replicas), instrumentation=otel.instrumentation(), **kw)


def traceparent_of(server: LoopbackServer, i: int = 0) -> tuple[int, int]:
    """(trace id, span id) of the traceparent the server received with its i-th request."""
    _, trace_id, span_id, _ = server.received[i].headers["traceparent"].split("-")
    return int(trace_id, 16), int(span_id, 16)


async def test_e2e_streamed_call(otel: Otel, servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=5, gap=0.002, stall_before_first=0.03)
    async with (
        e2e_guard(otel, [servers[0].url]) as guard,
        guard.http_client() as client,
        client.stream("POST", servers[0].url + CHAT, json=STREAM_BODY) as response,
    ):
        await response.aread()
        record = response.extensions["llmguard"]
    logical, (attempt,) = by_name(otel.finished())
    assert logical.name == "chat test-model"
    la = logical.attributes or {}
    assert la["gen_ai.request.model"] == "test-model" and la["gen_ai.request.max_tokens"] == 50
    assert la["gen_ai.request.stream"] is True
    assert (la["gen_ai.usage.input_tokens"], la["gen_ai.usage.output_tokens"]) == (7, 5)
    assert la["gen_ai.response.id"] == "chatcmpl-test" and la["gen_ai.response.model"] == "test-model"
    assert la["gen_ai.response.finish_reasons"] == ("stop",)
    ttfc = la["gen_ai.response.time_to_first_chunk"]
    assert isinstance(ttfc, float) and ttfc >= 0.03
    assert (la["server.address"], la["server.port"]) == ("127.0.0.1", servers[0].port)
    assert la["llmguard.request_id"] == record.request_id
    assert logical.status.status_code is StatusCode.UNSET
    assert logical.end_time == ns_of(record, record.finish)
    aa = attempt.attributes or {}
    assert aa["url.full"] == servers[0].url + CHAT
    assert aa["llmguard.attempt.outcome"] == "won" and aa["http.response.status_code"] == 200
    # The server can join the trace: it received the attempt span's context.
    assert traceparent_of(servers[0]) == (logical.context.trace_id, attempt.context.span_id)
    m = otel.metrics()
    for name in (sc.GEN_AI_CLIENT_OPERATION_DURATION, sc.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK):
        assert sum(p.count for p in points(m[name])) == 1
    tpoc = points(m[sc.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK])
    assert sum(p.count for p in tpoc) == 1
    assert {p.attributes["gen_ai.token.type"]: p.sum for p in points(m[sc.GEN_AI_CLIENT_TOKEN_USAGE])} == {
        "input": 7,
        "output": 5,
    }


def ns_of(record: PhaseRecord, t: float | None) -> int:
    assert t is not None
    return round(record.start_unix * 1e9) + round((t - record.start) * 1e9)


async def test_e2e_failed_call(otel: Otel, servers: list[LoopbackServer]) -> None:
    for server in servers[:2]:
        server.script = Script(status=503, body={"error": {"message": "overloaded", "type": "x"}})
    async with e2e_guard(otel, [s.url for s in servers[:2]]) as guard, guard.http_client() as client:
        response = await client.post(servers[0].url + CHAT, json=STREAM_BODY)
    assert response.status_code == 503
    logical, attempts = by_name(otel.finished())
    assert logical.status.status_code is StatusCode.ERROR
    la = logical.attributes or {}
    assert la["error.type"] == "503" and la["llmguard.status"] == "http_error"
    assert la["llmguard.retried"] is True and la["llmguard.attempts"] == len(attempts) >= 2
    assert all((a.attributes or {})["error.type"] == "503" for a in attempts)
    assert all(a.status.status_code is StatusCode.ERROR for a in attempts)
    assert [(a.attributes or {}).get("http.request.resend_count") for a in attempts] == [None, *range(1, len(attempts))]
    (dur,) = points(otel.metrics()[sc.GEN_AI_CLIENT_OPERATION_DURATION])
    assert dur.count == 1 and dur.attributes["error.type"] == "503"


async def test_e2e_stream_broken_after_the_first_token(otel: Otel, servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=10, reset_after_tokens=3)
    async with e2e_guard(otel, [servers[0].url]) as guard, guard.http_client() as client:
        with pytest.raises(httpx.HTTPError):
            async with client.stream("POST", servers[0].url + CHAT, json=STREAM_BODY) as response:
                await response.aread()
    logical, (attempt,) = by_name(otel.finished())
    la, aa = logical.attributes or {}, attempt.attributes or {}
    assert la["llmguard.status"] == "error" and la["error.type"] == aa["error.type"] == la["llmguard.cause"]
    assert "gen_ai.response.time_to_first_chunk" in la  # it did get a first chunk
    assert aa["llmguard.attempt.outcome"] == "won" and attempt.status.status_code is StatusCode.ERROR


async def test_e2e_ttft_timeout(otel: Otel, servers: list[LoopbackServer]) -> None:
    from llmguard_client import Tier, TTFTTimeout

    servers[0].script = Script(stall_before_first=3.0)
    tiers = {"fast": Tier(ttft=0.2, total=5.0, stall=1.0)}
    async with e2e_guard(otel, [servers[0].url], tiers=tiers, retry=None) as guard, guard.http_client() as client:
        with pytest.raises(TTFTTimeout):
            await client.post(servers[0].url + CHAT, json=STREAM_BODY)
    logical, (attempt,) = by_name(otel.finished())
    assert (logical.attributes or {})["error.type"] == "ttft_timeout"
    assert logical.status.status_code is StatusCode.ERROR
    assert (logical.attributes or {})["llmguard.tier"] == "fast"
    assert "gen_ai.response.time_to_first_chunk" not in (logical.attributes or {})
    assert (attempt.attributes or {})["llmguard.attempt.outcome"] == "cancelled"
    assert attempt.status.status_code is StatusCode.UNSET  # the call's deadline ended it


async def test_e2e_hedged_call(otel: Otel, servers: list[LoopbackServer]) -> None:
    from llmguard_client import HedgePolicy

    servers[0].script = Script(stall_before_first=3.0)
    servers[1].script = Script(tokens=4)
    guard = e2e_guard(otel, [s.url for s in servers[:2]], hedge=HedgePolicy(delay=0.1))
    async with (
        guard,
        guard.http_client() as client,
        client.stream("POST", servers[0].url + CHAT, json=STREAM_BODY) as response,
    ):
        await response.aread()
    logical, (primary, hedge) = by_name(otel.finished())
    la = logical.attributes or {}
    assert la["llmguard.hedged"] is True and la["llmguard.attempts"] == 2
    assert la["server.port"] == servers[1].port  # the winner
    assert (primary.attributes or {})["llmguard.attempt.outcome"] == "lost"
    assert primary.status.status_code is StatusCode.UNSET
    assert (hedge.attributes or {})["llmguard.attempt.outcome"] == "won"
    assert (hedge.attributes or {})["llmguard.attempt.kind"] == "hedge"
    assert traceparent_of(servers[0])[1] == primary.context.span_id
    assert traceparent_of(servers[1])[1] == hedge.context.span_id


async def test_e2e_retried_call(otel: Otel, servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(status=429, headers={"retry-after": "5"})
    async with e2e_guard(otel, [s.url for s in servers[:2]]) as guard, guard.http_client() as client:
        response = await client.post(servers[0].url + CHAT, json=STREAM_BODY)
        assert response.status_code == 200
    logical, (first, retry) = by_name(otel.finished())
    assert logical.status.status_code is StatusCode.UNSET and "error.type" not in (logical.attributes or {})
    fa, ra = first.attributes or {}, retry.attributes or {}
    assert (fa["error.type"], fa["llmguard.retry_after_s"], fa["http.response.status_code"]) == ("429", 5.0, 429)
    assert (ra["http.request.resend_count"], ra["llmguard.attempt.kind"]) == (1, "retry")
    (cool,) = points(otel.metrics()[sc.LLMGUARD_CLIENT_REPLICA_COOLDOWNS])
    assert cool.attributes["llmguard.cooldown.reason"] == "retry_after"
    assert cool.attributes["server.port"] == servers[0].port


async def test_e2e_no_secret_or_prompt_anywhere(otel: Otel, servers: list[LoopbackServer]) -> None:
    from llmguard_client import Replica

    completion = {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "model": "test-model",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "SECRET COMPLETION"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    servers[0].script = Script(body=completion)
    replica = Replica(f"http://alice:hunter2@127.0.0.1:{servers[0].port}", headers={"api-key": "sk-live-SECRET"})
    body = {**STREAM_BODY, "stream": False}
    async with e2e_guard(otel, [replica]) as guard, guard.http_client() as client:
        url = servers[0].url + CHAT + "?key=tok-QUERY"
        response = await client.post(url, json=body, headers={"authorization": "Bearer sk-live-SECRET"})
    assert "SECRET COMPLETION" in response.text
    assert servers[0].received[0].headers["api-key"] == "sk-live-SECRET"  # sent, but never recorded
    (_, (attempt,)) = by_name(otel.finished())
    assert (attempt.attributes or {})["url.full"] == (
        f"http://REDACTED:REDACTED@127.0.0.1:{servers[0].port}{CHAT}?key=REDACTED"
    )
    texts = _all_strings(otel)
    for secret in SECRETS:
        assert not any(secret in text for text in texts), secret
