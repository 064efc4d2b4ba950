"""One verdict line per client, computed from the numbers: a headline, the best gain and the worst regression.

A guarded client is compared with every baseline that ran (plain, openai-default, naive-retry): on each figure
with the baseline that did best on it, named in the line, so a gain over plain never hides a loss to another
baseline. A baseline is compared with plain. The headline is the TTFT tail (p99) at a given server load, or
goodput when plain is overloaded. Gains and regressions are ranked by `llmguard_tools.bench.changes`.
When a guarded client succeeds less often than a baseline because its deadlines cut requests that the baseline
finished late, one more sentence says so. A run whose load generator fell behind plan gets no verdict
(`llmguard_tools.bench.validity`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from llmguard_tools.bench.changes import NOISE, Change, changes, load_change
from llmguard_tools.bench.formatting import fmt_pct, fmt_ratio, fmt_s
from llmguard_tools.bench.measure import TierSpec
from llmguard_tools.bench.summary import ClientSummary, ratio
from llmguard_tools.bench.validity import is_baseline, no_verdict


class Judged(Protocol):
    """What a verdict reads of a report (`llmguard_tools.bench.report.BenchReport`, which calls `interpret`)."""

    summaries: list[ClientSummary]
    invalid: str | None
    left_out: dict[str, float]
    scenario: str | None
    tier: TierSpec

    def summary(self, client: str) -> ClientSummary | None: ...

    @property
    def baseline(self) -> ClientSummary | None: ...


__all__ = [
    "NOISE",
    "Change",
    "against_best",
    "baselines_for",
    "changes",
    "deadline_trade",
    "interpret",
    "is_baseline",
    "pick_challenger",
]


def baselines_for(report: Judged, g: ClientSummary) -> list[ClientSummary]:
    """What ``g`` is judged against: every baseline for a guarded client, plain for a baseline."""
    if is_baseline(g.client):
        return [b for b in (report.baseline,) if b is not None and b is not g]
    return [s for s in report.summaries if is_baseline(s.client) and s.client not in report.left_out]


def against_best(g: ClientSummary, baselines: Sequence[ClientSummary]) -> list[Change]:
    """Per figure, ``g`` against the baseline that did best on it (ties: the first baseline)."""
    best: dict[str, Change] = {}
    for b in baselines:
        for c in changes(g, b):
            if c.metric not in best or c.factor > best[c.metric].factor:
                best[c.metric] = c
    return list(best.values())


def pick_challenger(report: Judged) -> ClientSummary | None:
    """The client the headline verdict is about: the guarded one if it ran, else the first non-plain."""
    for name in ("guarded", "guarded-nohedge", "guarded-noretry"):
        s = report.summary(name)
        if s is not None:
            return s
    others = [s for s in report.summaries if s.client != "plain"]
    return others[0] if others else None


def _by_name(baselines: Sequence[ClientSummary], name: str) -> ClientSummary:
    return next(b for b in baselines if b.client == name)


def _headline(report: Judged, g: ClientSummary, baselines: Sequence[ClientSummary], best: list[Change]) -> str:
    of = {c.metric: c for c in best}
    ref = report.baseline or baselines[0]
    overloaded = report.scenario == "overload" or (ref.success_ratio < 0.9 and report.scenario != "stragglers")
    if overloaded:
        parts = [of[m].describe() for m in ("goodput", "success", "timeouts", "429s") if m in of]
        goodput = of.get("goodput")
        if goodput is not None:
            gp = ratio(g.goodput_ratio, _by_name(baselines, goodput.against).goodput_ratio)
            parts[0] += f" ({gp:.2f}x)" if gp is not None else ""
        parts += [of[m].describe() for m in ("server requests per call", "attempts per call", "wasted work") if m in of]
        return ", ".join(parts)
    tail = of.get("TTFT p99")
    if tail is None:
        success = of["success"]
        return f"no successful requests to compare TTFT ({success.describe()})"
    b = _by_name(baselines, tail.against)
    gt, bt = g.ttft["p99"], b.ttft["p99"]
    assert gt is not None and bt is not None
    r = ratio(gt, bt)
    load = load_change(g, b)
    load_s = (
        f"{load.factor:.2f}x the {'server load' if load.metric.startswith('server') else 'attempts'}"
        if load is not None
        else "unknown server load"
    )
    head = f"TTFT p99 is {fmt_ratio(r or 0.0)} of {b.client}'s ({fmt_s(gt)} vs {fmt_s(bt)}) at {load_s}"
    goodput = of.get("goodput")
    return f"{head}; {goodput.describe()}" if goodput is not None else head


def deadline_trade(g: ClientSummary, baselines: Sequence[ClientSummary], tier: TierSpec) -> str | None:
    """Why ``g`` succeeds less often than the most successful baseline, when its deadlines are the reason:
    most of its failures hit a deadline, and that baseline's extra successes came later than the tier allows."""
    if is_baseline(g.client) or not baselines:
        return None
    b = max(baselines, key=lambda s: s.success_ratio)
    gap = b.success_ratio - g.success_ratio
    failed = g.n - g.ok
    if gap <= 0 or (1 - g.success_ratio + 0.01) / (1 - b.success_ratio + 0.01) <= NOISE or not failed:
        return None
    late = b.late_successes / b.n if b.n else 0.0
    if g.deadline_failures / failed < 0.5 or late < gap / 2:
        return None
    return (
        f"Success {fmt_pct(g.success_ratio)} is lower than {b.client}'s {fmt_pct(b.success_ratio)} because "
        "deadlines cut slow requests: "
        f"{g.deadline_failures / failed:.0%} of {g.client}'s failures hit a deadline, while {fmt_pct(late)} of "
        f"{b.client}'s requests succeeded later than the tier allows "
        f"(TTFT > {tier.ttft:g} s or total > {tier.total:g} s); a caller with that deadline would count those as "
        "failures."
    )


def interpret(report: Judged, client: str | None = None) -> str:
    """The verdict on ``client`` (default: `pick_challenger`); no verdict when the run is invalid."""
    if report.invalid is not None:
        return no_verdict(report.invalid)
    g = report.summary(client) if client is not None else pick_challenger(report)
    baselines = baselines_for(report, g) if g is not None else []
    if g is None or not baselines:
        return "(add the plain client to compare against a baseline)"
    found = against_best(g, baselines)
    best = min(found, key=lambda c: c.factor, default=None)
    worst = max(found, key=lambda c: c.factor, default=None)
    who = g.client if len(baselines) == 1 else f"{g.client} (each figure against the best baseline)"
    headline = f"{who} {_headline(report, g, baselines, found)}"
    trade = deadline_trade(g, baselines, report.tier)
    worst_s = worst.describe() if worst is not None and worst.factor > NOISE else "none"
    end = f" {trade}" if trade else ""
    if best is None or best.factor >= 1 / NOISE:
        return f"{headline}. Best gain: none. Worst regression: {worst_s}.{end}"
    if best.metric in headline:  # the headline already says it
        return f"{headline}. Worst regression: {worst_s}.{end}"
    return f"{headline}. Best gain: {best.describe()}. Worst regression: {worst_s}.{end}"
