"""Per-client statistics (`bench.summary`) from samples with known figures."""

from __future__ import annotations

import numpy as np
import pytest

from llmguard_tools.bench.runner import ClientRun, ServerStats
from llmguard_tools.bench.summary import SLO, summarize
from tests.bench.reports import TTFTS, mixed_run, sample


def test_summary_ratios_and_percentiles_from_known_samples() -> None:
    server = ServerStats(
        [
            {"received": 6, "rejected": 1, "work_tokens": 80, "aborted_work_tokens": 8, "aborted_by_disconnect": 2},
            {"received": 7, "rejected": 0, "work_tokens": 120, "aborted_work_tokens": 12, "aborted_by_disconnect": 1},
            {"received": 0, "metrics_requests": 25},
        ]
    )
    s = summarize(mixed_run(server=server), SLO(ttft=1.0, tpot=0.101))
    assert s.n == 10 and s.ok == 7
    assert s.success_ratio == pytest.approx(0.7)
    assert s.timeout_ratio == pytest.approx(0.2)  # the client timeout + the 504
    assert s.ratio_429 == pytest.approx(0.1)
    assert s.other_error_ratio == pytest.approx(0.0)
    # TPOT = 0.9 / 9 = 0.1 (<= 0.101) for every ok sample, so TTFT <= 1.0 decides: 5 of 10
    assert s.goodput == 5 and s.goodput_ratio == pytest.approx(0.5)
    assert s.goodput_rps == pytest.approx(1.0)
    assert s.ttft["p50"] == pytest.approx(0.4)
    assert s.ttft["p99"] == pytest.approx(float(np.percentile(TTFTS, 99)))
    assert s.e2e["p95"] == pytest.approx(float(np.percentile([t + 0.9 for t in TTFTS], 95)))
    assert s.completion_tokens == 70
    assert s.client_attempts == 10 and s.client_amplification == pytest.approx(1.0)
    assert s.server_received == 13 and s.amplification == pytest.approx(1.3)
    assert s.metrics_polls == pytest.approx(2.5)  # polls counted apart from the requests
    assert s.work_tokens == 200 and s.wasted_tokens == 20 and s.wasted_pct == pytest.approx(10.0)
    assert s.loser_aborts == 3 and s.server_rejected == 1
    assert s.status_counts == {"http_429": 1, "http_504": 1, "ok": 7, "timeout": 1}


def test_without_server_counters_the_server_figures_are_unknown() -> None:
    s = summarize(mixed_run(), SLO())
    assert s.amplification is None and s.wasted_pct is None and s.loser_aborts is None and s.metrics_polls is None


def test_failure_latency_excludes_only_the_waits_the_client_honoured() -> None:
    failed = [
        sample(i, "guarded", status="http_429", ttft=None, e2e=e2e, http=429) for i, e2e in enumerate([0.01, 0.02])
    ]
    failed[1].waited = 0.5
    failed[1].e2e = 0.53  # 0.5 s honoured Retry-After + 30 ms of its own
    run = ClientRun("guarded", [sample(9, "guarded"), *failed], None, wall=1.0)
    summary = summarize(run, SLO(ttft=1.0, tpot=0.1))
    assert summary.failure_latency["p50"] == pytest.approx(0.02)
    assert summary.failure_latency["p100"] == pytest.approx(0.03)


def test_refusal_latency_counts_only_the_guards_own_refusals() -> None:
    import dataclasses

    refused = [
        dataclasses.replace(
            sample(i, "guarded-admission", "http_429", None, e2e=0.01 * (i + 1), http=429), cause="overloaded"
        )
        for i in range(5)
    ]
    provider_429 = sample(5, "guarded-admission", "http_429", None, e2e=3.0, http=429)
    timeout = sample(6, "guarded-admission", "timeout", None, e2e=1.0, http=None)
    s = summarize(ClientRun("guarded-admission", [*refused, provider_429, timeout], None, 1.0), SLO())
    assert s.refusal_latency["p100"] == pytest.approx(0.05)
    assert s.failure_latency["p100"] == pytest.approx(3.0)
    assert summarize(mixed_run("plain"), SLO()).refusal_latency["p99"] is None
