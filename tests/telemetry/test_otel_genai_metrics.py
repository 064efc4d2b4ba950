"""The two sets of GenAI metric names (`_otel_genai_metrics`), read back from an in-memory reader.

Default: the v1.41.0 names. With ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` when the
instrumentation is built: the names of semantic-conventions-genai v0.1.0, and none of the old ones.
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics.export import Histogram, Metric, Sum

from llmguard_client.telemetry import semconv as sc
from llmguard_client.telemetry.otel import OpenTelemetryInstrumentation
from llmguard_client.telemetry.record import PhaseRecord
from tests.telemetry.otel_harness import R1, Otel, begin_attempt, end_attempt, end_call, new_record, points, win

OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"
SECONDS, TOKEN = "s", "{token}"


def streamed_chat(inst: OpenTelemetryInstrumentation) -> PhaseRecord:
    """One streamed chat call: first chunk at 0.2 s, done at 0.5 s, 12 prompt and 21 completion tokens."""
    record = new_record()
    obs = inst.call_started(record)
    attempt, _ = begin_attempt(obs, record, R1, "primary", 0.0)
    end_attempt(obs, attempt, "won", sent=0.01, headers=0.1, first_token=0.2, status_code=200, finish=0.5)
    obs.call_finished(win(record, attempt, finish=0.5, prompt=12, completion=21))
    return record


def histogram(metric: Metric, unit: str) -> tuple[int, float]:
    """(count, sum) over the points of a histogram metric, after checking its kind and unit."""
    assert isinstance(metric.data, Histogram), metric.name
    assert metric.unit == unit, metric.name
    pts = points(metric)
    return sum(p.count for p in pts), sum(p.sum for p in pts)


def counter(metric: Metric) -> dict[str, int]:
    """Monotonic sum by ``gen_ai.token.modality``, after checking kind and unit."""
    assert isinstance(metric.data, Sum) and metric.data.is_monotonic, metric.name
    assert metric.unit == TOKEN, metric.name
    return {p.attributes[sc.GEN_AI_TOKEN_MODALITY]: p.value for p in points(metric)}


USAGE_NAMES = (sc.GEN_AI_CLIENT_INFERENCE_USAGE_INPUT_TOKENS, sc.GEN_AI_CLIENT_INFERENCE_USAGE_OUTPUT_TOKENS)
LATEST_NAMES = {
    sc.GEN_AI_CLIENT_INFERENCE_DURATION,
    sc.GEN_AI_CLIENT_INFERENCE_TIME_TO_FIRST_CHUNK,
    sc.GEN_AI_CLIENT_INFERENCE_TIME_PER_OUTPUT_CHUNK,
    sc.GEN_AI_CLIENT_INFERENCE_USAGE_INPUT_TOKENS,
    sc.GEN_AI_CLIENT_INFERENCE_USAGE_OUTPUT_TOKENS,
    sc.GEN_AI_CLIENT_INFERENCE_OPERATION_INPUT_TOKENS,
    sc.GEN_AI_CLIENT_INFERENCE_OPERATION_OUTPUT_TOKENS,
}
DEFAULT_NAMES = {
    sc.GEN_AI_CLIENT_OPERATION_DURATION,
    sc.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK,
    sc.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK,
    sc.GEN_AI_CLIENT_TOKEN_USAGE,
}


def gen_ai_names(otel: Otel) -> set[str]:
    return {name for name in otel.metrics() if name.startswith("gen_ai.")}


def test_default_names_when_not_opted_in(otel: Otel, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OPT_IN, "http")  # another category only
    streamed_chat(otel.instrumentation())
    m = otel.metrics()
    assert gen_ai_names(otel) == DEFAULT_NAMES
    assert histogram(m[sc.GEN_AI_CLIENT_OPERATION_DURATION], SECONDS) == pytest.approx((1, 0.5))
    assert histogram(m[sc.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK], SECONDS) == pytest.approx((1, 0.2))
    assert histogram(m[sc.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK], SECONDS) == pytest.approx((1, 0.3 / 20))
    tokens = {p.attributes[sc.GEN_AI_TOKEN_TYPE]: p.sum for p in points(m[sc.GEN_AI_CLIENT_TOKEN_USAGE])}
    assert m[sc.GEN_AI_CLIENT_TOKEN_USAGE].unit == TOKEN and tokens == {"input": 12, "output": 21}


def test_latest_names_when_opted_in(otel: Otel, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OPT_IN, "http, gen_ai_latest_experimental")  # a list, spaces allowed
    streamed_chat(otel.instrumentation())
    m = otel.metrics()
    assert gen_ai_names(otel) == LATEST_NAMES  # and none of the default names
    assert histogram(m[sc.GEN_AI_CLIENT_INFERENCE_DURATION], SECONDS) == pytest.approx((1, 0.5))
    assert histogram(m[sc.GEN_AI_CLIENT_INFERENCE_TIME_TO_FIRST_CHUNK], SECONDS) == pytest.approx((1, 0.2))
    assert histogram(m[sc.GEN_AI_CLIENT_INFERENCE_TIME_PER_OUTPUT_CHUNK], SECONDS) == pytest.approx((1, 0.3 / 20))
    assert counter(m[sc.GEN_AI_CLIENT_INFERENCE_USAGE_INPUT_TOKENS]) == {"unknown": 12}
    assert counter(m[sc.GEN_AI_CLIENT_INFERENCE_USAGE_OUTPUT_TOKENS]) == {"unknown": 21}
    assert histogram(m[sc.GEN_AI_CLIENT_INFERENCE_OPERATION_INPUT_TOKENS], TOKEN) == (1, 12)
    assert histogram(m[sc.GEN_AI_CLIENT_INFERENCE_OPERATION_OUTPUT_TOKENS], TOKEN) == (1, 21)
    for name in LATEST_NAMES:
        for p in points(m[name]):
            assert p.attributes[sc.GEN_AI_OPERATION_NAME] == "chat"
            assert p.attributes[sc.GEN_AI_PROVIDER_NAME] == "openai"
            assert p.attributes[sc.GEN_AI_REQUEST_MODEL] == "gpt-4o"
            assert (p.attributes[sc.SERVER_ADDRESS], p.attributes[sc.SERVER_PORT]) == ("10.0.0.1", 8000)
            if sc.GEN_AI_TOKEN_MODALITY in p.attributes:  # on the usage counters only
                assert name in USAGE_NAMES
    (duration,) = points(m[sc.GEN_AI_CLIENT_INFERENCE_DURATION])
    assert tuple(duration.explicit_bounds) == sc.GEN_AI_DURATION_BUCKETS
    (per_call,) = points(m[sc.GEN_AI_CLIENT_INFERENCE_OPERATION_INPUT_TOKENS])
    assert tuple(per_call.explicit_bounds) == sc.GEN_AI_TOKEN_BUCKETS


def test_latest_failed_call_counts_zero_usage(otel: Otel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The conventions ask for usage on every inference call, failed ones included: 0, modality unknown."""
    monkeypatch.setenv(OPT_IN, "gen_ai_latest_experimental")
    inst = otel.instrumentation()
    record = new_record(stream=False)
    obs = inst.call_started(record)
    attempt, _ = begin_attempt(obs, record, R1, "primary", 0.0)
    end_attempt(obs, attempt, "failed", status_code=503, finish=0.4)
    obs.call_finished(end_call(record, "http_error", finish=0.4, http_status=503))
    m = otel.metrics()
    (duration,) = points(m[sc.GEN_AI_CLIENT_INFERENCE_DURATION])
    assert duration.attributes[sc.ERROR_TYPE] == "503" and duration.sum == pytest.approx(0.4)
    assert counter(m[sc.GEN_AI_CLIENT_INFERENCE_USAGE_INPUT_TOKENS]) == {"unknown": 0}
    assert counter(m[sc.GEN_AI_CLIENT_INFERENCE_USAGE_OUTPUT_TOKENS]) == {"unknown": 0}
    (per_call,) = points(m[sc.GEN_AI_CLIENT_INFERENCE_OPERATION_OUTPUT_TOKENS])
    assert (per_call.count, per_call.sum, per_call.attributes[sc.ERROR_TYPE]) == (1, 0, "503")
    assert sc.GEN_AI_CLIENT_INFERENCE_TIME_TO_FIRST_CHUNK not in m  # not streamed


def test_latest_embeddings_have_their_own_metrics(otel: Otel, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OPT_IN, "gen_ai_latest_experimental")
    inst = otel.instrumentation()
    record = new_record(stream=False, path="/v1/embeddings", model="text-embedding-3-small")
    obs = inst.call_started(record)
    attempt, _ = begin_attempt(obs, record, R1, "primary", 0.0, url=f"{R1}/embeddings")
    end_attempt(obs, attempt, "won", status_code=200, finish=0.25)
    obs.call_finished(win(record, attempt, finish=0.25, prompt=8, completion=None))
    m = otel.metrics()
    embeddings = {sc.GEN_AI_CLIENT_EMBEDDINGS_DURATION, sc.GEN_AI_CLIENT_EMBEDDINGS_OPERATION_INPUT_TOKENS}
    assert gen_ai_names(otel) == embeddings
    assert histogram(m[sc.GEN_AI_CLIENT_EMBEDDINGS_DURATION], SECONDS) == pytest.approx((1, 0.25))
    assert histogram(m[sc.GEN_AI_CLIENT_EMBEDDINGS_OPERATION_INPUT_TOKENS], TOKEN) == (1, 8)
    (p,) = points(m[sc.GEN_AI_CLIENT_EMBEDDINGS_DURATION])
    assert p.attributes[sc.GEN_AI_OPERATION_NAME] == "embeddings"


def test_opt_in_is_read_when_the_instrumentation_is_built(otel: Otel, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OPT_IN, "gen_ai_latest_experimental")
    latest = otel.instrumentation()
    monkeypatch.delenv(OPT_IN)
    streamed_chat(latest)  # built opted in: stays so
    assert gen_ai_names(otel) == LATEST_NAMES
