"""`BenchReport`: ratios to plain, verdicts per client, and the JSON document."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from llmguard_tools.bench.tables import render
from tests.bench.reports import make_report, mixed_run


def test_ratios_to_plain() -> None:
    report = make_report()
    ratios = report.ratios()["guarded/plain"]
    for key in ("ttft_p50", "ttft_p95", "ttft_p99"):
        assert ratios[key] == pytest.approx(1 / 9)
    g, b = report.summary("guarded"), report.summary("plain")
    assert g is not None and b is not None
    assert ratios["e2e_p99"] == pytest.approx(g.e2e["p99"] / b.e2e["p99"])  # type: ignore[operator]
    assert ratios["amplification"] == pytest.approx(1.1)
    assert ratios["goodput"] == pytest.approx(g.goodput_ratio / b.goodput_ratio)


def test_json_document() -> None:
    report = make_report()
    doc = json.loads(json.dumps(report.to_dict()))
    assert set(doc["clients"]) == {"plain", "guarded"}
    assert doc["plan"]["fingerprint"] == report.plan.fingerprint()
    assert len(doc["samples"]["plain"]) == 10
    assert doc["ratios"]["guarded/plain"]["ttft_p99"] == pytest.approx(1 / 9)
    assert doc["interpretation"] == report.interpretation() == doc["verdicts"]["guarded"]
    assert "samples" not in report.to_dict(samples=False)


@pytest.mark.parametrize(
    ("clients", "every", "line"),
    [
        (("plain", "guarded-hints"), 0.1, "guarded-hints reads each replica's /metrics every 0.1 s"),
        (("plain", "guarded-hints"), None, "guarded-hints reads each replica's /metrics at the poller's default rate"),
        (("plain", "guarded"), None, None),
    ],
)
def test_the_report_says_how_often_the_hints_client_polled(
    clients: tuple[str, ...], every: float | None, line: str | None
) -> None:
    report = make_report(runs=[mixed_run(name) for name in clients])
    report.hints_every = every
    out = io.StringIO()
    render(report, Console(file=out, width=120, highlight=False))
    hints = [row.split("server hints", 1)[1].strip() for row in out.getvalue().splitlines() if "server hints" in row]
    assert hints == ([line] if line else [])
    assert json.loads(json.dumps(report.to_dict(samples=False)))["hints_every"] == every
