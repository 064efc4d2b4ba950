"""Provider detection (`_otel_providers`): no SDK is a no-op fast path; an SDK set later is followed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry import context, trace
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.trace import NonRecordingSpan, NoOpTracerProvider, ProxyTracerProvider, SpanContext, TraceFlags

from llmguard_client.telemetry import semconv as sc
from llmguard_client.telemetry.hooks import NO_INSTRUMENTATION
from llmguard_client.telemetry.otel import OpenTelemetryInstrumentation
from tests.telemetry.otel_harness import R1, begin_attempt, end_attempt, new_record, win


def test_noop_providers_do_nothing_and_inject_nothing() -> None:
    inst = OpenTelemetryInstrumentation(NoOpTracerProvider(), NoOpMeterProvider())
    record = new_record()
    obs = inst.call_started(record)
    attempt, headers = begin_attempt(obs, record, R1, "primary", 0.0)
    end_attempt(obs, attempt, "won", status_code=200, finish=0.1)
    final = win(record, attempt, finish=0.1)
    inst.replica_cooled(R1, 1.0, "circuit_open")
    inst.bulkhead_rejected("interactive")
    inst.register_budget(lambda: 1.0)
    obs.call_finished(final)
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
        obs.call_finished(win(record, attempt, finish=0.1))
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
from tests.telemetry.otel_harness import R1, begin_attempt, end_attempt, new_record, win

def call(inst):
    record = new_record()
    obs = inst.call_started(record)
    attempt, headers = begin_attempt(obs, record, R1, "primary", 0.0)
    end_attempt(obs, attempt, "won", status_code=200, first_token=0.05, finish=0.1)
    obs.call_finished(win(record, attempt, finish=0.1))
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
