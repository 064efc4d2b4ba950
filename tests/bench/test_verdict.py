"""Verdict lines: the headline, the best gain and the worst regression, ranked on one scale."""

from __future__ import annotations

import pytest

from llmguard_tools.bench.runner import ClientRun
from llmguard_tools.bench.summary import SLO, summarize
from llmguard_tools.bench.verdict import NOISE, changes
from tests.bench.reports import make_report, mixed_run, sample, server


def run(name: str, *, ok: int, failed: int, ttft: float, received: int, wasted: int = 0) -> ClientRun:
    """``ok`` successes with the given TTFT (e2e 0.5 s later) and ``failed`` 500s, out of ok + failed."""
    samples = [sample(i, name, ttft=ttft, e2e=ttft + 0.5, tokens=11) for i in range(ok)]
    samples += [sample(ok + i, name, status="http_500", ttft=None, e2e=0.05, http=500) for i in range(failed)]
    return ClientRun(name, samples, server(received, 1000, wasted), wall=1.0)


def test_headline_then_the_worst_regression() -> None:
    line = make_report().interpretation()
    assert line.startswith("guarded TTFT p99 is 1/9 of plain's (327 ms vs 2.94 s) at 1.10x the server load")
    # the headline metric is the best gain, so it is not repeated; wasted work went 0.0% -> 4.5%
    assert line.endswith(". Worst regression: wasted work 4.5% vs plain 0.0%.")
    over = make_report("overload").interpretation()
    assert over.startswith("guarded goodput") and "server requests per call 1.10 vs plain 1.00" in over
    assert "wasted work 4.5% vs plain 0.0%" in over


def test_a_lower_success_is_reported_even_when_latency_improved() -> None:
    """As with faults: the guarded client is faster but loses a few more requests."""
    report = make_report(
        "faults",
        [run("plain", ok=191, failed=9, ttft=0.2, received=200), run("guarded", ok=188, failed=12, ttft=0.1,
                                                                     received=200)],
    )  # fmt: skip
    line = report.interpretation()
    assert "Best gain: TTFT p50 100 ms vs plain 200 ms (0.50x)" in line
    assert line.endswith("Worst regression: success 94.0% vs plain 95.5%.")  # ties go to the first in table order


def test_nothing_changed_is_none_both_ways() -> None:
    same = make_report("stragglers", [run("plain", ok=10, failed=0, ttft=0.1, received=10),
                                      run("guarded", ok=10, failed=0, ttft=0.1, received=10)])  # fmt: skip
    assert same.interpretation().endswith("Best gain: none. Worst regression: none.")


def test_every_client_gets_its_own_verdict_against_plain() -> None:
    report = make_report(
        "overload",
        [run("plain", ok=6, failed=4, ttft=0.1, received=10), run("naive-retry", ok=7, failed=3, ttft=0.4,
                                                                  received=25)],
    )  # fmt: skip
    verdicts = report.verdicts()
    assert list(verdicts) == ["naive-retry"]
    assert verdicts["naive-retry"].startswith("naive-retry goodput 70.0% vs plain 60.0%")
    assert "server requests per call 2.50 vs plain 1.00" in verdicts["naive-retry"]
    assert verdicts["naive-retry"].endswith("Worst regression: TTFT p50 400 ms vs plain 100 ms (4.00x).")
    assert make_report(runs=[mixed_run("guarded")]).interpretation().startswith("(add the plain client")


def test_shares_are_compared_with_one_point_added_to_both() -> None:
    slo = SLO()
    g = summarize(run("guarded", ok=972, failed=28, ttft=0.1, received=1000), slo)
    b = summarize(run("plain", ok=1000, failed=0, ttft=0.1, received=1000), slo)
    success = next(c for c in changes(g, b) if c.metric == "success")
    assert success.factor == pytest.approx((0.028 + 0.01) / 0.01)  # 0% -> 2.8% failed: 3.8x
    assert (success.value, success.baseline) == ("97.2%", "100.0%")
    load = next(c for c in changes(g, b) if c.metric == "server requests per call")
    assert load.factor == 1.0 and 1 / NOISE < load.factor < NOISE


def mixed(name: str, *, ok: int, late: int = 0, timeouts: int = 0, errors: int = 0) -> ClientRun:
    """``ok`` successes (``late`` of them with TTFT 1.5 s, past the default tier's 1 s), then failures."""
    samples = [sample(i, name, ttft=(t := 1.5 if i < late else 0.2), e2e=t + 0.5, tokens=11) for i in range(ok)]
    samples += [sample(ok + i, name, status="timeout", ttft=None, e2e=1.0, http=None) for i in range(timeouts)]
    samples += [sample(len(samples) + i, name, status="http_500", ttft=None, e2e=0.05, http=500) for i in range(errors)]
    return ClientRun(name, samples, server(len(samples), 1000), wall=1.0)


def test_each_figure_is_compared_with_the_best_baseline_on_it() -> None:
    """As in a faults run: guarded beats plain on errors, but openai-default had fewer."""
    report = make_report(
        "faults",
        [run("plain", ok=190, failed=10, ttft=0.2, received=200),
         run("openai-default", ok=197, failed=3, ttft=0.25, received=203),
         run("guarded", ok=193, failed=7, ttft=0.1, received=200)],
    )  # fmt: skip
    line = report.interpretation()
    assert line.startswith("guarded (each figure against the best baseline) TTFT p99 is 0.50x of plain's")
    assert "goodput 96.5% vs openai-default 98.5%" in line  # the best goodput is not plain's
    assert line.endswith("Worst regression: success 96.5% vs openai-default 98.5%.")
    assert report.verdicts()["openai-default"].startswith("openai-default TTFT p99 is 1.25x of plain's")


def test_lower_success_from_deadlines_is_said_in_one_sentence() -> None:
    """As in overload: guarded's deadlines fail requests that openai-default finished, but late."""
    report = make_report(
        "overload",
        [mixed("plain", ok=60, errors=40), mixed("openai-default", ok=84, late=30, errors=16),
         mixed("guarded", ok=57, timeouts=40, errors=3)],
    )  # fmt: skip
    line = report.interpretation()
    assert "success 57.0% vs openai-default 84.0%, timeouts 40.0% vs plain 0.0%" in line  # in the headline
    assert line.endswith(
        "Success 57.0% is lower than openai-default's 84.0% because deadlines cut slow requests: 93% of guarded's "
        "failures "
        "hit a deadline, while 30.0% of openai-default's requests succeeded later than the tier allows "
        "(TTFT > 1 s or total > 10 s); a caller with that deadline would count those as failures."
    )
    # the same gap from errors, or from a baseline that was not slow, gets no such excuse
    errors = make_report("overload", [mixed("plain", ok=84, late=30, errors=16), mixed("guarded", ok=57, errors=43)])
    assert "deadlines cut" not in errors.interpretation()
    fast = make_report("overload", [mixed("plain", ok=84, errors=16), mixed("guarded", ok=57, timeouts=43)])
    assert "deadlines cut" not in fast.interpretation()


def test_a_run_behind_plan_gets_no_verdict() -> None:
    runs = [mixed_run("plain"), mixed_run("guarded", 1 / 9)]
    runs[1].behind = 0.51  # the default tier's 1 s TTFT deadline tolerates 0.5 s
    report = make_report("stragglers", runs)
    assert report.invalid is not None and "behind plan by up to 0.51 s (guarded)" in report.invalid
    assert report.verdicts() == {}
    line = report.interpretation()
    assert line.startswith("NO VERDICT: this run is INVALID") and "fewer calls/s" in line
    assert "TTFT p99" not in line
    doc = report.to_dict(samples=False)
    assert doc["valid"] is False and doc["verdicts"] == {} and doc["interpretation"] == line
    runs[1].behind = 0.5
    assert make_report("stragglers", runs).invalid is None
