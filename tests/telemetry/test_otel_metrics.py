"""The instruments (`_otel_metrics`): units, buckets, cardinality, guard-level metrics, the budget gauge."""

from __future__ import annotations

import dataclasses
import gc
import threading
import weakref
from collections import Counter
from typing import Any

import pytest
from opentelemetry.metrics import Meter, MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, NumberDataPoint
from opentelemetry.trace import NoOpTracerProvider

from llmguard_client import Guard
from llmguard_client.telemetry import _otel_metrics
from llmguard_client.telemetry import semconv as sc
from llmguard_client.telemetry.otel import OpenTelemetryInstrumentation
from tests.scripts import run_script
from tests.sdk_retries import failing_once, sdk_call
from tests.telemetry.otel_harness import R1, R2, Otel, begin_attempt, end_attempt, new_record, points, win


def test_metrics_once_per_logical_call_with_units_and_buckets(otel: Otel) -> None:
    inst = otel.instrumentation()
    for i in range(3):
        record = new_record(request_id=f"req-{i}", cohort="control" if i == 2 else "guarded")
        obs = inst.call_started(record)
        primary, _ = begin_attempt(obs, record, R1, "primary", 0.0)
        hedge, _ = begin_attempt(obs, record, R2, "hedge", 0.1)
        end_attempt(obs, hedge, "won", sent=0.11, headers=0.12, first_token=0.2, status_code=200, finish=0.3)
        end_attempt(obs, primary, "lost", sent=0.01, finish=0.21)
        final = win(record, hedge, finish=0.3 + i)
        obs.call_finished(final)
        obs.call_finished(final)  # a second end is ignored
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


async def test_calls_mark_an_sdks_retries_so_each_cohort_reads_as_its_sdk_calls(otel: Otel) -> None:
    """20 keyless calls at 0.5, each answered 500 once and served on its SDK retry (the guard retrying nothing, so
    both cohorts see the SDK's retries): ``llmguard.client.calls`` counts each request, and ``llmguard.sdk_retry``
    marks the retries, so a cohort's SDK calls are its unmarked requests and its successes its ``ok`` ones: 100 % in
    both, as the callers saw. Before: no mark; each cohort read as twice its calls, half of them failed."""
    guard = failing_once(instrumentation=otel.instrumentation())
    async with guard, guard.http_client() as client:
        for i in range(20):
            await sdk_call(client, i)
    counted: Counter[tuple[str, bool | None, str]] = Counter()
    for p in points(otel.metrics()[sc.LLMGUARD_CLIENT_CALLS]):
        a = p.attributes
        counted[(a[sc.LLMGUARD_COHORT], a.get("llmguard.sdk_retry"), a[sc.LLMGUARD_STATUS])] += p.value
    assert set(counted) <= {
        (c, retry, s) for c in ("guarded", "control") for retry, s in ((False, "http_error"), (True, "ok"))
    }
    for cohort in ("guarded", "control"):
        sdk_calls = sum(n for (c, retry, _), n in counted.items() if c == cohort and not retry)
        assert counted[(cohort, True, "ok")] == sdk_calls  # every SDK call succeeded
    assert sum(counted.values()) == 40 and sum(n for (_, retry, _), n in counted.items() if not retry) == 20


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
    other.register_budget(lambda: b2.value)  # a plain function: held as long as the instrumentation
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


def test_metrics_without_traces(otel: Otel) -> None:
    inst = OpenTelemetryInstrumentation(NoOpTracerProvider(), otel.meter_provider)
    record = new_record()
    obs = inst.call_started(record)
    attempt, headers = begin_attempt(obs, record, R1, "primary", 0.0)
    end_attempt(obs, attempt, "won", status_code=200, first_token=0.05, finish=0.1)
    obs.call_finished(win(record, attempt, finish=0.1))
    assert "traceparent" not in headers and otel.finished() == []
    assert sum(p.count for p in points(otel.metrics()[sc.GEN_AI_CLIENT_OPERATION_DURATION])) == 1


# -- the budget gauge and the guard's lifetime ------------------------------------------------------
def live_global_budgets() -> int:
    return sum(1 for owner, level, _ in _otel_metrics._GLOBAL_BUDGETS._entries if owner() and level())


async def test_a_guard_with_the_default_instrumentation_is_collected_after_aclose() -> None:
    """The global budget registry must not keep a dropped guard (and its pools, tiers, stats) alive."""
    before = live_global_budgets()
    guard = Guard(replicas=["http://127.0.0.1:9/v1"])  # default instrumentation: the global providers
    assert live_global_budgets() == before + 1  # its budget is reported
    await guard.aclose()
    ref = weakref.ref(guard)
    del guard
    gc.collect()
    assert ref() is None
    assert live_global_budgets() == before


async def test_the_budget_gauge_reads_a_published_level_and_never_touches_the_window(otel: Otel) -> None:
    """The gauge's callback runs on the exporter's thread; the budget is single-loop and lock-free."""
    guard = Guard(replicas=["http://127.0.0.1:9/v1"], instrumentation=otel.instrumentation())
    budget = guard.budget
    assert budget is not None and (budget.ratio, budget.floor) == (0.1, 4)
    budget.record_request()
    ticket = budget.try_acquire()  # level: 0.1 x 1 request + 4 - 1 extra = 3.1
    assert ticket is not None
    ticket.settle()

    reads: list[str] = []
    loop_clock = budget._clock

    def watched_clock() -> float:  # every operation on the window reads the clock first
        reads.append(threading.current_thread().name)
        return loop_clock() + 100.0  # late enough that a read from here would empty the window

    budget._clock = watched_clock
    window = [(b.first, b.last, b.requests, b.extras) for b in budget._buckets]
    collected: list[list[float]] = []

    def export() -> None:  # as a PeriodicExportingMetricReader does, on its own thread
        collected.append([p.value for p in points(otel.metrics()[sc.LLMGUARD_CLIENT_BUDGET_LEVEL])])

    exporter = threading.Thread(target=export, name="exporter")
    try:
        exporter.start()
        exporter.join()
        assert collected == [[pytest.approx(3.1)]]
        assert reads == []
        assert [(b.first, b.last, b.requests, b.extras) for b in budget._buckets] == window
    finally:
        budget._clock = loop_clock
        await guard.aclose()


GUARDS_WITHOUT_AN_SDK = """
import gc
from opentelemetry import metrics
from llmguard_client import Guard

for _ in range(50):  # a Guard per test, per request, per asyncio.run
    Guard(["http://127.0.0.1:9"]).close()
gc.collect()
print(len(metrics.get_meter_provider()._meters))  # the API's proxy keeps every meter it hands out
"""


def test_guards_built_without_an_sdk_share_one_meter_in_the_global_proxy() -> None:
    """Before, each Guard's default instrumentation asked for a meter of its own, which the global proxy kept
    (with its 12 instruments) for the process's life: about 2 KB a Guard. In a process of its own: no SDK set."""
    proc = run_script(GUARDS_WITHOUT_AN_SDK)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1"]


@dataclasses.dataclass
class DelegatingMeterProvider(MeterProvider):
    """A valid provider that is not hashable (a dataclass with ``eq``), as logfire's global provider is."""

    inner: MeterProvider

    def get_meter(
        self, name: str, version: str | None = None, schema_url: str | None = None, attributes: Any = None
    ) -> Meter:
        return self.inner.get_meter(name, version, schema_url, attributes)


async def test_an_unhashable_meter_provider_is_accepted_and_shared(otel: Otel) -> None:
    """``OpenTelemetryInstrumentation(meter_provider=...)`` raised ``TypeError: unhashable type`` for such a
    provider, so no Guard could be built with it. It now works as any other: instrumentations on it share one
    set of instruments and one budget gauge, and its entries go with it."""
    provider = DelegatingMeterProvider(otel.meter_provider)
    with pytest.raises(TypeError):
        hash(provider)
    before = len(_otel_metrics._INSTRUMENTS_BY_PROVIDER), len(_otel_metrics._BUDGETS_BY_PROVIDER)
    first = OpenTelemetryInstrumentation(otel.tracer_provider, provider)
    async with (
        Guard(replicas=["http://127.0.0.1:9/v1"], instrumentation=first),
        Guard(replicas=["http://127.0.0.1:9/v1"], instrumentation=OpenTelemetryInstrumentation(None, provider)),
    ):
        record = new_record()
        obs = first.call_started(record)
        attempt, _ = begin_attempt(obs, record, R1, "primary", 0.0)
        end_attempt(obs, attempt, "won", status_code=200, first_token=0.05, finish=0.1)
        obs.call_finished(win(record, attempt, finish=0.1))
        m = otel.metrics()
        assert sum(p.count for p in points(m[sc.GEN_AI_CLIENT_OPERATION_DURATION])) == 1
        # Both guards' budgets on the one gauge the provider has: one registry, found by the provider.
        indexes = sorted(
            (p.attributes or {}).get("llmguard.budget.index", 0) for p in points(m[sc.LLMGUARD_CLIENT_BUDGET_LEVEL])
        )
        assert indexes == [0, 1]
    assert (len(_otel_metrics._INSTRUMENTS_BY_PROVIDER), len(_otel_metrics._BUDGETS_BY_PROVIDER)) == (
        before[0] + 1,
        before[1] + 1,
    )
    del first, obs, provider
    gc.collect()
    assert (len(_otel_metrics._INSTRUMENTS_BY_PROVIDER), len(_otel_metrics._BUDGETS_BY_PROVIDER)) == before


@dataclasses.dataclass(slots=True)
class SlottedMeterProvider:
    """A duck-typed provider that can be neither hashed nor weakly referenced."""

    inner: MeterProvider

    def get_meter(
        self, name: str, version: str | None = None, schema_url: str | None = None, attributes: Any = None
    ) -> Meter:
        return self.inner.get_meter(name, version, schema_url, attributes)


def test_a_meter_provider_that_cannot_be_weakly_referenced_is_accepted(otel: Otel) -> None:
    provider: Any = SlottedMeterProvider(otel.meter_provider)
    with pytest.raises(TypeError):
        weakref.ref(provider)
    inst = OpenTelemetryInstrumentation(otel.tracer_provider, provider)
    other = OpenTelemetryInstrumentation(otel.tracer_provider, provider)
    inst.register_budget(lambda: 2.0)
    other.register_budget(lambda: 3.0)
    pts = points(otel.metrics()[sc.LLMGUARD_CLIENT_BUDGET_LEVEL])
    assert sorted(p.value for p in pts) == [2.0, 3.0]  # one registry for both, found by the provider
