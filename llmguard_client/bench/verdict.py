"""One verdict line per client against ``plain``, computed from the numbers: a headline, the best gain and
the worst regression.

The headline is the TTFT tail (p99) at a given server load, or goodput when the baseline is overloaded.
Gains and regressions are ranked on one scale, the factor between the two clients' figures: latency and
load as they are (a 1 ms floor on latency), shares of requests through what went wrong (1 - success,
timeouts, ...) with one percentage point added to both sides, so 0 % -> 2.8 % counts as 3.8x. Factors
within 5 % of 1 are noise and reported as neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmguard_client.bench.formatting import fmt_pct, fmt_ratio, fmt_s
from llmguard_client.bench.summary import ClientSummary, ratio

if TYPE_CHECKING:
    from llmguard_client.bench.report import BenchReport

__all__ = ["NOISE", "Change", "changes", "interpret", "pick_challenger"]

NOISE = 1.05
"""Factors in [1/NOISE, NOISE] are neither a gain nor a regression."""

_SHARE_FLOOR = 0.01
_SECONDS_FLOOR = 0.001


@dataclass(frozen=True)
class Change:
    """One metric of a client against the baseline; ``factor`` > 1 means worse, < 1 better."""

    metric: str
    value: str
    baseline: str
    factor: float
    """The ranking factor (with the floors described above)."""
    shown: str = ""
    """The plain ratio of the two figures, where it reads better than the figures alone."""

    def describe(self) -> str:
        text = f"{self.metric} {self.value} vs {self.baseline}"
        return f"{text} ({self.shown})" if self.shown else text


_Metric = Callable[[ClientSummary, ClientSummary], "Change | None"]


def _share(metric: str, bad: Callable[[ClientSummary], float], shown: Callable[[ClientSummary], float]) -> _Metric:
    def change(g: ClientSummary, b: ClientSummary) -> Change | None:
        bg, bb = bad(g), bad(b)
        return Change(metric, fmt_pct(shown(g)), fmt_pct(shown(b)), (bg + _SHARE_FLOOR) / (bb + _SHARE_FLOOR))

    return change


def _seconds(metric: str, field: str, p: str) -> _Metric:
    def change(g: ClientSummary, b: ClientSummary) -> Change | None:
        vg, vb = getattr(g, field)[p], getattr(b, field)[p]
        if vg is None or vb is None:
            return None
        factor = (vg + _SECONDS_FLOOR) / (vb + _SECONDS_FLOOR)
        return Change(metric, fmt_s(vg), fmt_s(vb), factor, fmt_ratio(vg / vb) if vb > 0 else "")

    return change


def _load(g: ClientSummary, b: ClientSummary) -> Change | None:
    if g.amplification is not None and b.amplification is not None:
        metric, vg, vb = "server requests per call", g.amplification, b.amplification
    elif g.client_amplification is not None and b.client_amplification is not None:
        metric, vg, vb = "attempts per call", g.client_amplification, b.client_amplification
    else:
        return None
    factor = ratio(vg, vb)
    return None if factor is None else Change(metric, f"{vg:.2f}", f"{vb:.2f}", factor)


def _wasted(g: ClientSummary, b: ClientSummary) -> Change | None:
    if g.wasted_pct is None or b.wasted_pct is None:
        return None
    factor = (g.wasted_pct / 100 + _SHARE_FLOOR) / (b.wasted_pct / 100 + _SHARE_FLOOR)
    return Change("wasted work", f"{g.wasted_pct:.1f}%", f"{b.wasted_pct:.1f}%", factor)


_METRICS: tuple[_Metric, ...] = (
    _share("success", lambda s: 1 - s.success_ratio, lambda s: s.success_ratio),
    _share("goodput", lambda s: 1 - s.goodput_ratio, lambda s: s.goodput_ratio),
    _share("timeouts", lambda s: s.timeout_ratio, lambda s: s.timeout_ratio),
    _share("429s", lambda s: s.ratio_429, lambda s: s.ratio_429),
    _share("other errors", lambda s: s.other_error_ratio, lambda s: s.other_error_ratio),
    *(_seconds(f"TTFT p{p}", "ttft", f"p{p}") for p in (50, 95, 99)),
    *(_seconds(f"e2e p{p}", "e2e", f"p{p}") for p in (50, 95, 99)),
    _seconds("TPOT p99", "tpot", "p99"),
    _load,
    _wasted,
)


def changes(g: ClientSummary, b: ClientSummary) -> list[Change]:
    """Every metric both clients have, in table order."""
    return [c for metric in _METRICS if (c := metric(g, b)) is not None]


def pick_challenger(report: BenchReport) -> ClientSummary | None:
    """The client the headline verdict is about: the guarded one if it ran, else the first non-plain."""
    for name in ("guarded", "guarded-nohedge", "guarded-noretry"):
        s = report.summary(name)
        if s is not None:
            return s
    others = [s for s in report.summaries if s.client != "plain"]
    return others[0] if others else None


def _headline(report: BenchReport, g: ClientSummary, b: ClientSummary) -> str:
    load = _load(g, b)
    load_s = (
        f"{load.factor:.2f}x the {'server load' if load.metric.startswith('server') else 'attempts'}"
        if load is not None
        else "unknown server load"
    )
    overloaded = report.scenario == "overload" or (b.success_ratio < 0.9 and report.scenario != "stragglers")
    if overloaded:
        amp = (
            f"amplification {g.amplification:.2f} vs {b.amplification:.2f}"
            if g.amplification is not None and b.amplification is not None
            else f"attempts {load_s}"
        )
        gp = ratio(g.goodput_ratio, b.goodput_ratio)
        gp_s = f" ({gp:.2f}x)" if gp is not None else ""
        wasted = (
            f", wasted work {g.wasted_pct:.1f}% vs {b.wasted_pct:.1f}%"
            if g.wasted_pct is not None and b.wasted_pct is not None
            else ""
        )
        return (
            f"{g.client} goodput {g.goodput_ratio:.1%} vs {b.client} {b.goodput_ratio:.1%}{gp_s}, "
            f"timeouts {g.timeout_ratio:.1%} vs {b.timeout_ratio:.1%}, "
            f"429s {g.ratio_429:.1%} vs {b.ratio_429:.1%}, {amp}{wasted}"
        )
    gt, bt = g.ttft["p99"], b.ttft["p99"]
    r = ratio(gt, bt)
    if r is None:
        return (
            f"{g.client} vs {b.client}: no successful requests to compare TTFT "
            f"(success {g.success_ratio:.0%} vs {b.success_ratio:.0%})"
        )
    head = f"{g.client} TTFT p99 is {fmt_ratio(r)} of {b.client}'s ({fmt_s(gt)} vs {fmt_s(bt)}) at {load_s}"
    return f"{head}; goodput {g.goodput_ratio:.1%} vs {b.goodput_ratio:.1%}"


def interpret(report: BenchReport, client: str | None = None) -> str:
    """The verdict on ``client`` (default: `pick_challenger`) against ``plain``."""
    b = report.baseline
    g = report.summary(client) if client is not None else pick_challenger(report)
    if b is None or g is None:
        return "(add the plain client to compare against a baseline)"
    found = changes(g, b)
    best = min(found, key=lambda c: c.factor, default=None)
    worst = max(found, key=lambda c: c.factor, default=None)
    headline = _headline(report, g, b)
    worst_s = worst.describe() if worst is not None and worst.factor > NOISE else "none"
    if best is None or best.factor >= 1 / NOISE:
        return f"{headline}. Best gain: none. Worst regression: {worst_s}."
    if best.metric in headline:  # the headline already says it
        return f"{headline}. Worst regression: {worst_s}."
    return f"{headline}. Best gain: {best.describe()}. Worst regression: {worst_s}."
