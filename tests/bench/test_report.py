from __future__ import annotations

import io
import json

import numpy as np
import pytest

from llmguard_client.bench.clients import Sample, TierSpec
from llmguard_client.bench.report import (
    SLO,
    BenchReport,
    fmt_ratio,
    plot_cdfs,
    render,
    summarize,
)
from llmguard_client.bench.runner import ClientRun, ServerStats
from llmguard_client.bench.traffic import make_plan


def sample(i: int, client: str = "plain", status: str = "ok", ttft: float | None = 0.1, e2e: float = 1.0,
           tokens: int = 10, http: int | None = 200, attempts: int | None = 1) -> Sample:  # fmt: skip
    return Sample(
        index=i,
        client=client,
        status=status,
        http_status=http,
        cause=None,
        scheduled=0.0,
        lag=0.0,
        ttft=ttft,
        e2e=e2e,
        completion_tokens=tokens,
        prompt_tokens=5,
        attempts=attempts,
    )


def _mixed_run(name: str = "plain", ttft_scale: float = 1.0, server: ServerStats | None = None) -> ClientRun:
    ok = [
        sample(i, name, ttft=t * ttft_scale, e2e=t * ttft_scale + 0.9, tokens=10)
        for i, t in enumerate([0.1, 0.2, 0.3, 0.4, 0.5, 2.0, 3.0])
    ]
    bad = [
        sample(7, name, status="timeout", ttft=None, e2e=10.0, http=None, attempts=1),
        sample(8, name, status="http_429", ttft=None, e2e=0.01, http=429, attempts=1),
        sample(9, name, status="http_504", ttft=None, e2e=10.0, http=504, attempts=1),
    ]
    return ClientRun(name, ok + bad, server, wall=5.0)


def test_summary_ratios_and_percentiles_from_known_samples() -> None:
    server = ServerStats(
        [
            {
                "received": 6,
                "rejected": 1,
                "work_tokens": 80,
                "aborted_work_tokens": 8,
                "aborted_by_disconnect": 2,
            },
            {
                "received": 7,
                "rejected": 0,
                "work_tokens": 120,
                "aborted_work_tokens": 12,
                "aborted_by_disconnect": 1,
            },
        ]
    )
    s = summarize(_mixed_run(server=server), SLO(ttft=1.0, tpot=0.101))
    assert s.n == 10 and s.ok == 7
    assert s.success_ratio == pytest.approx(0.7)
    assert s.timeout_ratio == pytest.approx(0.2)  # the client timeout + the 504
    assert s.ratio_429 == pytest.approx(0.1)
    assert s.other_error_ratio == pytest.approx(0.0)
    # TPOT = 0.9 / 9 = 0.1 (<= 0.101) for every ok sample, so TTFT <= 1.0 decides: 5 of 10
    assert s.goodput == 5 and s.goodput_ratio == pytest.approx(0.5)
    assert s.goodput_rps == pytest.approx(1.0)
    ttfts = [0.1, 0.2, 0.3, 0.4, 0.5, 2.0, 3.0]
    assert s.ttft["p50"] == pytest.approx(0.4)
    assert s.ttft["p99"] == pytest.approx(float(np.percentile(ttfts, 99)))
    assert s.e2e["p95"] == pytest.approx(float(np.percentile([t + 0.9 for t in ttfts], 95)))
    assert s.completion_tokens == 70
    assert s.client_attempts == 10 and s.client_amplification == pytest.approx(1.0)
    assert s.server_received == 13 and s.amplification == pytest.approx(1.3)
    assert s.work_tokens == 200 and s.wasted_tokens == 20 and s.wasted_pct == pytest.approx(10.0)
    assert s.loser_aborts == 3 and s.server_rejected == 1
    assert s.status_counts == {"http_429": 1, "http_504": 1, "ok": 7, "timeout": 1}


def _report(scenario: str | None = "stragglers") -> BenchReport:
    plan = make_plan(10, seed=0, rate=10.0)
    plain_srv = ServerStats([{"received": 10, "work_tokens": 100, "aborted_work_tokens": 0}])
    guarded_srv = ServerStats([{"received": 11, "work_tokens": 110, "aborted_work_tokens": 5}])
    return BenchReport(
        title="t",
        plan=plan,
        slo=SLO(1.0, 0.1),
        tier=TierSpec(),
        counters="reset",
        model="m",
        runs=[_mixed_run("plain", 1.0, plain_srv), _mixed_run("guarded", 1 / 9, guarded_srv)],
        scenario=scenario,
    )


def test_ratios_and_interpretation() -> None:
    report = _report()
    ratios = report.ratios()["guarded/plain"]
    for key in ("ttft_p50", "ttft_p95", "ttft_p99"):
        assert ratios[key] == pytest.approx(1 / 9)
    g, b = report.summary("guarded"), report.summary("plain")
    assert g is not None and b is not None
    assert ratios["e2e_p99"] == pytest.approx(g.e2e["p99"] / b.e2e["p99"])  # type: ignore[operator]
    assert ratios["amplification"] == pytest.approx(1.1)
    line = report.interpretation()
    assert line.startswith("guarded TTFT p99 is 1/9 of plain's")
    assert "at 1.10x the server load" in line
    over = _report("overload").interpretation()
    assert over.startswith("guarded goodput") and "amplification 1.10 vs 1.00" in over
    assert "wasted work 4.5% vs 0.0%" in over


def test_fmt_ratio() -> None:
    assert fmt_ratio(1 / 9) == "1/9"
    assert fmt_ratio(0.26) == "1/4"
    assert fmt_ratio(0.6) == "0.60x"
    assert fmt_ratio(2.5) == "2.50x"


def test_json_render_and_plot(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console

    report = _report()
    doc = json.loads(json.dumps(report.to_dict()))
    assert set(doc["clients"]) == {"plain", "guarded"}
    assert doc["plan"]["fingerprint"] == report.plan.fingerprint()
    assert len(doc["samples"]["plain"]) == 10
    assert doc["ratios"]["guarded/plain"]["ttft_p99"] == pytest.approx(1 / 9)
    out = io.StringIO()
    render(report, Console(file=out, width=200))
    text = out.getvalue()
    assert "guarded/plain" in text and "TTFT p99" in text and "0.11x" in text
    assert report.interpretation() in text.replace("\n", " ") or "1/9" in text
    png = tmp_path / "cdf.png"
    plot_cdfs([report, _report("overload")], str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
