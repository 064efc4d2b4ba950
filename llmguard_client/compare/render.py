"""The comparison as a plain-text report or a JSON document."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmguard_client.compare.summary import UNITS, Difference, Group
from llmguard_client.compare.verdict import Thresholds, Verdict


@dataclass(frozen=True, slots=True)
class Report:
    source: str
    records: int
    skipped: int
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
                    "timeouts": g.timeouts,
                    "http_429": g.http_429,
                    "rollout_fractions": g.fractions,
                    **g.figures,
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
                    "significant": d.interval is not None and (d.interval.low > 0 or d.interval.high < 0),
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


def _table(rows: Sequence[Sequence[str]], right: int) -> list[str]:
    """Columns padded to their widest cell; the first ``right`` columns left-aligned, the rest right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(w) if i < right else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def render_text(report: Report) -> str:
    fractions = sorted({f for g in report.groups for f in g.fractions})
    seen = ", ".join(f"{f:g}" for f in fractions) if fractions else "not recorded"
    lines = [
        f"llmguard compare {report.source}: {report.records} records ({report.skipped} other lines skipped); "
        f"rollout fraction(s) seen: {seen}",
        "",
    ]
    columns = [
        ("success", "success"),
        ("timeouts", ""),
        ("429s", ""),
        ("TTFT p50", "ttft_p50"),
        ("TTFT p95", "ttft_p95"),
        ("TTFT p99", "ttft_p99"),
        ("e2e p99", "e2e_p99"),
        ("attempts/call", "attempts"),
        ("server load/call", "server_load"),
    ]
    if any("goodput" in g.figures for g in report.groups):
        columns.insert(1, ("goodput", "goodput"))
    rows = [["tier", "cohort", "calls", *(title for title, _ in columns)]]
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
    lines += _table(rows, right=2)
    lines += [
        "",
        f"guarded - control, {report.confidence:.0%} bootstrap CI ({report.resamples} resamples, seed {report.seed}):",
    ]
    rows = [["scope", "metric", "guarded", "control", "difference", "CI", "significant"]]
    for d in report.diffs:
        ci = "-" if d.interval is None else f"[{_delta(d.unit, d.interval.low)}, {_delta(d.unit, d.interval.high)}]"
        significant = ""
        if d.interval is not None and (d.interval.low > 0 or d.interval.high < 0):
            significant = "higher" if d.interval.low > 0 else "lower"
        estimate = None if d.interval is None else d.interval.estimate
        row = [d.scope, d.label, _value(d.unit, d.guarded), _value(d.unit, d.control), _delta(d.unit, estimate)]
        rows.append([*row, ci, significant])
    if len(rows) == 1:
        rows.append(["-", "(needs calls in both cohorts)", "", "", "", "", ""])
    lines += _table(rows, right=2)
    lines += ["", report.verdict.line()]
    return "\n".join(lines) + "\n"


__all__ = ["Report", "render_text"]
