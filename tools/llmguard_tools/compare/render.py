"""The comparison as a plain-text report or a JSON document.

The text fits the terminal's width (``COLUMNS`` when set, 80 when the output is not a terminal): a table too
wide for it continues in another table that repeats its first columns, and prose wraps. Plain text, not rich:
the report needs nothing the runtime does not have. The table layout is `llmguard_tools.bench.tables`'s.
"""

from __future__ import annotations

import shutil
import textwrap
from dataclasses import dataclass
from typing import Any

from llmguard_tools.compare.stats import TAIL_CALLS
from llmguard_tools.compare.strata import Stratum
from llmguard_tools.compare.summary import UNITS, Difference, Group
from llmguard_tools.compare.verdict import Thresholds, Verdict
from llmguard_tools.tables import text_tables


@dataclass(frozen=True, slots=True)
class Report:
    source: str
    records: int
    skipped: int
    compared: Stratum
    """The calls of the one rollout fraction compared."""
    not_compared: list[Stratum]
    groups: list[Group]
    diffs: list[Difference]
    verdict: Verdict
    thresholds: Thresholds
    resamples: int
    confidence: float
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "records": self.records,
            "skipped_lines": self.skipped,
            "rollout_fraction": self.compared.fraction,
            "not_compared": [{"rollout_fraction": s.fraction, "calls": len(s.calls)} for s in self.not_compared],
            "bootstrap": {"resamples": self.resamples, "confidence": self.confidence, "seed": self.seed},
            "thresholds": {
                "max_attempts": self.thresholds.max_attempts,
                "success_drop": self.thresholds.success_drop,
                "min_calls": self.thresholds.min_calls,
            },
            "groups": [
                {
                    "tier": g.tier,
                    "cohort": g.cohort,
                    "calls": g.calls,
                    "ok": g.ok,
                    "timeout_calls": g.timeouts,
                    "http_429_calls": g.http_429,
                    "rollout_fractions": g.fractions,
                    **g.figures,  # by metric name, as in the differences: "timeouts" and "http_429" are rates
                }
                for g in self.groups
            ],
            "differences": [
                {
                    "scope": d.scope,
                    "metric": d.metric,
                    "guarded": d.guarded,
                    "control": d.control,
                    "difference": None if d.interval is None else d.interval.estimate,
                    "ci_low": None if d.interval is None else d.interval.low,
                    "ci_high": None if d.interval is None else d.interval.high,
                    "significant": d.significant is not None,
                    "needs_calls": d.needs,
                }
                for d in self.diffs
            ],
            "verdict": {"decision": self.verdict.decision, "reasons": self.verdict.reasons},
        }


def _value(unit: str, value: float | None) -> str:
    if value is None:
        return "-"
    if unit == "ratio":
        return f"{value * 100:.2f}%"
    return f"{value:.3f} s" if unit == "s" else f"{value:.3f}"


def _delta(unit: str, value: float | None) -> str:
    if value is None:
        return "-"
    if unit == "ratio":
        return f"{value * 100:+.2f} pp"
    return f"{value:+.3f} s" if unit == "s" else f"{value:+.3f}"


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False) or [""]


def render_text(report: Report, width: int | None = None) -> str:
    """The report as text no wider than ``width`` (default: the terminal's, see the module docstring)."""
    width = max(40, width or shutil.get_terminal_size((80, 24)).columns)
    compared = report.compared.name() + (" (records without one)" if report.compared.fraction is None else "")
    if report.not_compared:
        others = ", ".join(f"{s.name()} with {len(s.calls)} calls" for s in report.not_compared)
        compared += f" (not compared: {others})"
    lines = [
        *_wrap(
            f"llmguard compare {report.source}: {report.records} records ({report.skipped} other lines "
            f"skipped); rollout fraction compared: {compared}",
            width,
        ),
        "",
    ]
    columns = [
        ("success", "success"),
        ("timeouts", ""),
        ("429s", ""),
        ("TTFT\np50", "ttft_p50"),
        ("TTFT\np95", "ttft_p95"),
        ("TTFT\np99", "ttft_p99"),
        ("e2e\np99", "e2e_p99"),
        ("attempts\n/call", "attempts"),
        ("server load\n/call", "server_load"),
    ]
    if any("goodput" in g.figures for g in report.groups):
        columns.insert(1, ("goodput", "goodput"))
    titles = [title.split("\n") for title, _ in columns]  # headers of one or two lines
    rows = [
        ["", "", "", *(t[0] if len(t) > 1 else "" for t in titles)],
        ["tier", "cohort", "calls", *(t[-1] for t in titles)],
    ]
    for g in report.groups:
        cells = [g.tier, g.cohort, str(g.calls)]
        for title, name in columns:
            if title == "timeouts":
                cells.append(str(g.timeouts))
            elif title == "429s":
                cells.append(str(g.http_429))
            else:
                cells.append(_value(UNITS.get(name, "ratio"), g.figures.get(name)))
        rows.append(cells)
    lines += text_tables(rows, 2, width)
    lines += [
        "",
        *_wrap(
            f"guarded - control, {report.confidence:.0%} bootstrap CI ({report.resamples} resamples, "
            f"seed {report.seed}):",
            width,
        ),
    ]
    rows = [["scope", "metric", "guarded", "control", "difference", "CI", "significant"]]
    for d in report.diffs:
        ci = "-" if d.interval is None else f"[{_delta(d.unit, d.interval.low)}, {_delta(d.unit, d.interval.high)}]"
        significant = d.significant or (f"needs {d.needs}" if d.needs is not None else "")
        estimate = None if d.interval is None else d.interval.estimate
        row = [d.scope, d.label, _value(d.unit, d.guarded), _value(d.unit, d.control), _delta(d.unit, estimate)]
        rows.append([*row, ci, significant])
    if len(rows) == 1:
        rows.append(["-", "(needs calls in both cohorts)", "", "", "", "", ""])
    lines += text_tables(rows, 2, width)
    if any(d.needs is not None and d.significant is None for d in report.diffs):
        lines += _wrap(
            f"needs N: a quantile's interval shows a gain only once each cohort has N calls for it "
            f"({TAIL_CALLS} beyond the quantile); until then it counts only when higher.",
            width,
        )
    lines += ["", *_wrap(report.verdict.line(), width)]
    return "\n".join(lines) + "\n"


__all__ = ["Report", "render_text"]
