"""One call's spans and measurements (`_otel_call`): synthetic records, as the transport sends them."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from llmguard_client.telemetry import semconv as sc
from llmguard_client.telemetry.record import AttemptOutcome
from tests.telemetry.otel_harness import (
    R1,
    R2,
    SECRETS,
    T0,
    T0_NS,
    Otel,
    all_strings,
    begin_attempt,
    by_name,
    end_attempt,
    end_call,
    new_record,
    ns,
    points,
    traceparent_span_id,
    win,
)


def test_the_servers_acceptance_is_a_phase_of_both_spans(otel: Otel) -> None:
    inst = otel.instrumentation()
    record = new_record()
    obs = inst.call_started(record)
    attempt, _ = begin_attempt(obs, record, R1, "primary", 0.002)
    end_attempt(
        obs, attempt, "won", sent=0.003, headers=0.050, accepted=0.051, first_token=0.400, status_code=200, finish=0.9
    )
    obs.call_finished(win(record, attempt, finish=0.900))
    logical, (child,) = by_name(otel.finished())
    assert (logical.attributes or {})["llmguard.phase.accepted_s"] == pytest.approx(0.051)
    assert (child.attributes or {})["llmguard.phase.accepted_s"] == pytest.approx(0.051)
    assert (logical.attributes or {})["llmguard.phase.first_token_s"] == pytest.approx(0.400)


def test_streamed_call(otel: Otel) -> None:
    inst = otel.instrumentation()
    record = new_record()
    record.queued_until(T0 + 0.001)
    obs = inst.call_started(record)
    attempt, headers = begin_attempt(obs, record, R1, "primary", 0.002)
    end_attempt(obs, attempt, "won", sent=0.003, headers=0.050, first_token=0.120, status_code=200, finish=0.900)
    obs.call_finished(win(record, attempt, finish=0.900, completion=41))

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
        "llmguard.sdk_retry": False,
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
    obs.call_finished(win(record, hedge, finish=1.0))

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
    obs.call_finished(win(record, retry, finish=0.400))

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
    obs.call_finished(end_call(record, status, cause, finish=0.07, http_status=http_status))

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
    obs.call_finished(win(record, attempt, finish=0.4, status=status, cause=cause))
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
    obs.call_finished(end_call(record, status, finish=0.5))
    logical, (child,) = by_name(otel.finished())
    assert logical.status.status_code is StatusCode.UNSET
    assert "error.type" not in (logical.attributes or {})
    assert (logical.attributes or {})["llmguard.status"] == status
    assert child.status.status_code is StatusCode.UNSET


def test_no_secret_in_any_attribute(otel: Otel) -> None:
    inst = otel.instrumentation()
    record = new_record()
    obs = inst.call_started(record)
    url = "https://alice:hunter2@api.example.com/openai/v1/chat/completions?api-version=2024-06-01&key=tok-QUERY#frag"
    attempt = record.attempt_started("https://api.example.com/openai/v1", "primary", T0)
    headers = {"authorization": "Bearer sk-live-SECRET", "api-key": "sk-live-SECRET"}
    obs.attempt_started(attempt, url, headers)
    assert headers["authorization"] == "Bearer sk-live-SECRET"  # untouched, only traceparent added
    assert set(headers) <= {"authorization", "api-key", "traceparent", "tracestate", "baggage"}
    end_attempt(obs, attempt, "won", sent=0.01, headers=0.02, first_token=0.03, status_code=200, finish=0.1)
    obs.call_finished(win(record, attempt, finish=0.1))

    (_, (child,)) = by_name(otel.finished())
    assert (child.attributes or {})["url.full"] == (
        "https://REDACTED:REDACTED@api.example.com/openai/v1/chat/completions?api-version=2024-06-01&key=REDACTED"
    )
    assert ((child.attributes or {})["server.address"], (child.attributes or {})["server.port"]) == (
        "api.example.com",
        443,
    )
    for text in all_strings(otel):
        for secret in SECRETS:
            assert secret not in text, (secret, text)


def test_attempt_spans_off(otel: Otel) -> None:
    inst = otel.instrumentation(attempt_spans=False)
    record = new_record()
    obs = inst.call_started(record)
    attempt, headers = begin_attempt(obs, record, R1, "primary", 0.0)
    end_attempt(obs, attempt, "won", sent=0.01, headers=0.02, first_token=0.03, status_code=200, finish=0.1)
    obs.call_finished(win(record, attempt, finish=0.1))
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
    attempt.attempt_finished("cancelled", T0 + 0.2)
    obs.call_finished(end_call(record, "timeout", "total_timeout", finish=0.2))  # attempt_finished never came
    logical, (child,) = by_name(otel.finished())
    assert child.end_time == ns(0.2)
    assert (logical.attributes or {})["error.type"] == "total_timeout"
