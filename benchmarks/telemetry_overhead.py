"""Cost of the telemetry per logical call, driven with synthetic phase records.

Each "call" is what the transport does for one request: build a PhaseRecord, ``call_started``,
then per attempt ``attempt_started`` (with a headers dict for ``traceparent``) and
``attempt_finished``, then ``call_finished``. It is timed with:

* ``baseline``  - ``NO_INSTRUMENTATION`` (the hooks' do-nothing implementation);
* ``otel-noop`` - ``OpenTelemetryInstrumentation()`` with no SDK installed/configured: the API's
  global proxy providers, i.e. what every user without OpenTelemetry gets by default;
* ``otel-sdk``  - the SDK with a ``SimpleSpanProcessor(InMemorySpanExporter())`` and an
  ``InMemoryMetricReader`` (spans exported synchronously at each end; metrics aggregated);
* ``otel-sdk-no-attempt-spans`` - the same with ``attempt_spans=False``;
* ``otel-sdk-traces-only`` / ``otel-sdk-metrics-only`` - the SDK for one signal, a no-op
  provider for the other (where the SDK's cost goes).

Two shapes: ``plain`` (one attempt, streamed) and ``hedged`` (a primary that loses and a hedge
that wins). Rounds run every mode in turn; the figure is the best round's elapsed / calls in
microseconds (the median in brackets), and the overhead is that minus the baseline's.

    python -m benchmarks.telemetry_overhead [--calls 2000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import opentelemetry.version
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.trace import NoOpTracerProvider

from llmguard_client.telemetry._record_builder import CallRecordBuilder
from llmguard_client.telemetry.hooks import NO_INSTRUMENTATION, Instrumentation
from llmguard_client.telemetry.otel import OpenTelemetryInstrumentation

R1 = "http://10.0.0.1:8000/v1"
R2 = "http://10.0.0.2:8000/v1"


def plain_call(inst: Instrumentation, i: int) -> None:
    t0 = time.monotonic()
    record = CallRecordBuilder(
        request_id=f"r{i}", tier="interactive", cohort="guarded", method="POST", path="/v1/chat/completions",
        start=t0, start_unix=time.time(), model="gpt-4o", stream=True, max_tokens=256, rollout_fraction=None,
    )  # fmt: skip
    obs = inst.call_started(record)
    attempt = record.attempt_started(R1, "primary", t0 + 0.001)
    obs.attempt_started(attempt, R1 + "/chat/completions", {})
    attempt.attempt_sent(t0 + 0.002)
    attempt.attempt_headers(t0 + 0.05, 200)
    attempt.attempt_first_token(t0 + 0.1)
    attempt.attempt_finished("won", t0 + 0.9)
    obs.attempt_finished(attempt)
    record.delivered(attempt, 200)
    record.response_facts(30, 120, "chatcmpl-1", "gpt-4o-2024-08-06", ["stop"], None)
    obs.call_finished(record.call_finished("ok", None, t0 + 0.9))


def hedged_call(inst: Instrumentation, i: int) -> None:
    t0 = time.monotonic()
    record = CallRecordBuilder(
        request_id=f"r{i}", tier="interactive", cohort="guarded", method="POST", path="/v1/chat/completions",
        start=t0, start_unix=time.time(), model="gpt-4o", stream=True, max_tokens=256, rollout_fraction=None,
    )  # fmt: skip
    obs = inst.call_started(record)
    primary = record.attempt_started(R1, "primary", t0)
    obs.attempt_started(primary, R1 + "/chat/completions", {})
    hedge = record.attempt_started(R2, "hedge", t0 + 0.3)
    obs.attempt_started(hedge, R2 + "/chat/completions", {})
    hedge.attempt_sent(t0 + 0.301)
    hedge.attempt_headers(t0 + 0.33, 200)
    hedge.attempt_first_token(t0 + 0.36, complete=True)
    hedge.attempt_finished("won", None)
    obs.attempt_finished(hedge)
    primary.attempt_sent(t0 + 0.001)
    primary.attempt_finished("lost", t0 + 0.361)
    obs.attempt_finished(primary)
    record.delivered(hedge, 200)
    record.response_facts(30, 120, "chatcmpl-1", "gpt-4o-2024-08-06", ["stop"], None)
    obs.call_finished(record.call_finished("ok", None, t0 + 1.2))


def timed(inst: Instrumentation, shape: Callable[[Instrumentation, int], None], calls: int) -> float:
    """Microseconds per call over ``calls`` calls."""
    start = time.perf_counter()
    for i in range(calls):
        shape(inst, i)
    return (time.perf_counter() - start) / calls * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per mode in each round")
    parser.add_argument("--repeats", type=int, default=15, help="rounds")
    args = parser.parse_args(argv)

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])

    def reset_sdk() -> None:
        exporter.clear()
        reader.get_metrics_data()

    def nothing() -> None:
        return None

    modes: list[tuple[str, Instrumentation, Callable[[], None]]] = [
        ("baseline", NO_INSTRUMENTATION, nothing),
        ("otel-noop", OpenTelemetryInstrumentation(), nothing),  # global proxies, no SDK configured
        ("otel-sdk", OpenTelemetryInstrumentation(tracer_provider, meter_provider), reset_sdk),
        (
            "otel-sdk-no-attempt-spans",
            OpenTelemetryInstrumentation(tracer_provider, meter_provider, attempt_spans=False),
            reset_sdk,
        ),
        ("otel-sdk-traces-only", OpenTelemetryInstrumentation(tracer_provider, NoOpMeterProvider()), reset_sdk),
        ("otel-sdk-metrics-only", OpenTelemetryInstrumentation(NoOpTracerProvider(), meter_provider), reset_sdk),
    ]
    shapes: list[tuple[str, Callable[[Instrumentation, int], None]]] = [("plain", plain_call), ("hedged", hedged_call)]
    for _, inst, reset in modes:  # warm-up: caches, instrument series
        for _, shape in shapes:
            timed(inst, shape, 2000)
        reset()
    # Rounds interleave the modes, so that a noisy neighbour hits them alike; best and median of rounds.
    runs: dict[tuple[str, str], list[float]] = {(m, s): [] for m, _, _ in modes for s, _ in shapes}
    for _ in range(args.repeats):
        for name, inst, reset in modes:
            for shape_name, shape in shapes:
                runs[name, shape_name].append(timed(inst, shape, args.calls))
                reset()
    print(
        f"python {platform.python_version()} on {platform.machine()} ({os.cpu_count()} cpu), "
        f"opentelemetry {opentelemetry.version.__version__}, {args.calls} calls x {args.repeats} rounds; "
        "us per call: best of rounds (median), +over = best minus the baseline's best"
    )
    print(f"{'mode':<28}{'plain':>18}{'+over':>8}{'hedged':>18}{'+over':>8}")
    base = {s: min(runs["baseline", s]) for s, _ in shapes}
    for name, _, _ in modes:
        row = f"{name:<28}"
        for shape_name, _ in shapes:
            best, med = min(runs[name, shape_name]), statistics.median(runs[name, shape_name])
            row += f"{best:>9.2f} ({med:>6.2f}){best - base[shape_name]:>8.2f}"
        print(row)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
