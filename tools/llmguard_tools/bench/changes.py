"""How two clients differ on each figure, ranked on one scale: the factor between their figures.

Latency and load as they are (a 1 ms floor on latency); shares of requests through what went wrong
(1 - success, timeouts, ...) with one percentage point added to both sides, so 0 % -> 2.8 % counts as 3.8x.
Factors within 5 % of 1 are noise and count as neither a gain nor a regression.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from llmguard_tools.bench.formatting import fmt_pct, fmt_ratio, fmt_s
from llmguard_tools.bench.summary import ClientSummary, ratio

__all__ = ["METRIC_NAMES", "NOISE", "Change", "changes", "load_change"]

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
    against: str = ""
    """The baseline client's name."""

    def describe(self) -> str:
        """``success 94.0% vs plain 95.5%``, with the plain ratio in brackets where it helps."""
        other = f"{self.against} {self.baseline}" if self.against else self.baseline
        text = f"{self.metric} {self.value} vs {other}"
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


def load_change(g: ClientSummary, b: ClientSummary) -> Change | None:
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
    load_change,
    _wasted,
)


def changes(g: ClientSummary, b: ClientSummary) -> list[Change]:
    """Every metric both clients have, in table order, each naming ``b`` as the baseline."""
    return [replace(c, against=b.client) for metric in _METRICS if (c := metric(g, b)) is not None]


METRIC_NAMES = ("success", "goodput", "timeouts", "429s", "other errors", "TTFT p99", "e2e p99")
"""The figures compared with the best baseline in a verdict, in report order."""
