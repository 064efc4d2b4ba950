"""The one-line verdict: widen, hold or roll back, against thresholds the user can set.

Only scopes (a tier, or all tiers) where each cohort has at least ``min_calls`` calls count.

- **roll back** if, in any such scope, the guarded success rate is significantly lower than
  control's by more than ``success_drop`` (the whole interval below ``-success_drop``), or
  the guarded attempts per call exceed ``max_attempts``;
- **widen** if no such scope shows a significant regression (success lower; TTFT p99, e2e p99,
  timeout rate or 429 rate higher) and, over all calls, TTFT p99 is significantly lower or the
  success rate significantly higher;
- **hold** otherwise, including when there are not enough calls yet.

"Significantly" means the bootstrap interval of guarded - control excludes 0, read through
`Difference.significant`: a quantile counts as lower (a gain) only once each cohort has the values
its interval needs (`calls_for_quantile`: 1000 for a p99), and as higher (a regression) always.
Several metrics and tiers are tested at once, so an occasional false alarm is expected: it costs a
hold, never a widen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from llmguard_tools.compare.summary import ALL_TIERS, Difference, Group

Decision = Literal["widen", "hold", "roll back"]
_REGRESSIONS = (
    ("success", "below"),
    ("ttft_p99", "above"),
    ("e2e_p99", "above"),
    ("timeouts", "above"),
    ("http_429", "above"),
)
_GAINS = (("ttft_p99", "below"), ("success", "above"))


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When to roll back and how much data a decision needs (defaults in the module docstring)."""

    max_attempts: float = 1.2
    success_drop: float = 0.0
    min_calls: int = 30

    def __post_init__(self) -> None:
        if not (isinstance(self.max_attempts, (int, float)) and math.isfinite(self.max_attempts)) or (
            self.max_attempts < 1.0
        ):
            raise ValueError(f"max attempts per call must be a number >= 1.0 (e.g. 1.2), got {self.max_attempts!r}")
        if not (isinstance(self.success_drop, (int, float)) and 0.0 <= self.success_drop < 1.0):
            raise ValueError(f"success drop must be a fraction in [0, 1) (e.g. 0.01), got {self.success_drop!r}")
        if isinstance(self.min_calls, bool) or not isinstance(self.min_calls, int) or self.min_calls < 2:
            raise ValueError(f"min calls must be an integer >= 2, got {self.min_calls!r}")


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    reasons: list[str]

    def line(self) -> str:
        return f"verdict: {self.decision.upper()} - {'; '.join(self.reasons)}"


def describe(diff: Difference, overall: str = ALL_TIERS, *, needs: bool = False) -> str:
    """``TTFT p99 -1.912 s (CI -1.987..-1.801)``-style text; the tier is named unless it is ``overall``. With
    ``needs``, a quantile short of the values its interval needs for a gain says how many."""
    scale, unit, digits = (100.0, " pp", 2) if diff.unit == "ratio" else (1.0, " s" if diff.unit == "s" else "", 3)
    text = f"{diff.label} {_signed(diff.interval.estimate if diff.interval else None, scale, digits)}{unit}"
    if diff.interval is not None:
        text += f" (CI {_signed(diff.interval.low, scale, digits)}..{_signed(diff.interval.high, scale, digits)}"
        if needs and diff.needs is not None:
            guarded, control = diff.values
            text += (
                f"; not a gain until each cohort has {diff.needs} calls for it: guarded {guarded}, control {control}"
            )
        text += ")"
    if diff.scope != overall:
        text += f" in tier {diff.scope}"
    return text


def _signed(value: float | None, scale: float, digits: int) -> str:
    return "n/a" if value is None else f"{value * scale:+.{digits}f}"


def decide(groups: Sequence[Group], diffs: Sequence[Difference], thresholds: Thresholds) -> Verdict:
    sizes: dict[str, dict[str, int]] = {}
    for group in groups:
        sizes.setdefault(group.tier, {})[group.cohort] = group.calls
    tiers = [t for t in sizes if t != ALL_TIERS]
    overall = ALL_TIERS if ALL_TIERS in sizes else (tiers[0] if tiers else ALL_TIERS)
    counts = sizes.get(overall, {})
    n_guarded, n_control = counts.get("guarded", 0), counts.get("control", 0)
    if min(n_guarded, n_control) < thresholds.min_calls:
        return Verdict(
            "hold",
            [f"not enough calls: guarded {n_guarded}, control {n_control} (need {thresholds.min_calls} in each)"],
        )
    eligible = {s for s, c in sizes.items() if min(c.get("guarded", 0), c.get("control", 0)) >= thresholds.min_calls}
    found = {(d.scope, d.metric): d for d in diffs if d.scope in eligible}

    rollback = []
    for scope in eligible:
        success = found.get((scope, "success"))
        if success is not None and success.interval is not None and success.interval.high < -thresholds.success_drop:
            rollback.append(f"guarded success lower: {describe(success, overall)}")
        attempts = found.get((scope, "attempts"))
        if attempts is not None and attempts.guarded is not None and attempts.guarded > thresholds.max_attempts:
            where = "" if scope == overall else f" in tier {scope}"
            rollback.append(f"guarded attempts/call {attempts.guarded:.3f} > {thresholds.max_attempts:g}{where}")
    if rollback:
        return Verdict("roll back", sorted(rollback))

    regressions = [
        describe(d, overall)
        for (_, name), d in sorted(found.items())
        for metric, side in _REGRESSIONS
        if name == metric and _beyond(d, side)
    ]
    if regressions:
        return Verdict("hold", ["significant regression: " + ", ".join(regressions)])
    gains = [
        describe(d, overall) for metric, side in _GAINS if (d := found.get((overall, metric))) and _beyond(d, side)
    ]
    attempts = found.get((overall, "attempts"))
    spent = (
        []
        if attempts is None or attempts.guarded is None
        else [f"guarded attempts/call {attempts.guarded:.3f} <= {thresholds.max_attempts:g}"]
    )
    if gains:
        return Verdict("widen", [*gains, "no significant regression", *spent])
    watched = [describe(d, overall, needs=True) for metric, _ in _GAINS if (d := found.get((overall, metric)))]
    return Verdict("hold", ["no significant gain yet: " + ", ".join(watched)])


def _beyond(diff: Difference, side: str) -> bool:
    return diff.significant == ("lower" if side == "below" else "higher")
