"""Per-cohort, per-tier figures and the guarded - control differences with bootstrap intervals.

Definitions (over the calls of one cohort in one tier, or in all tiers):

- success rate: calls whose record status is ``ok`` (answered, body read to its end) / calls;
- timeout rate: status ``timeout`` (a guard deadline, or the caller's own httpx timeout) / calls;
- 429 rate: calls whose final answer to the caller was HTTP 429 / calls;
- TTFT p50/p95/p99: over the calls that got a first token (failures are counted in the rates);
- e2e p99: start to end of the successful calls;
- attempts/call: requests the guard started per call (1 for control);
- server load/call: attempts that reached a server per call (a hedge sent counts; a connect error does not);
- goodput (only with a TTFT SLO, `goodput`): calls that succeeded with TTFT <= the SLO / calls. Success alone
  counts a control call answered after 3 s as a success while a guarded call cut at a 1 s ttft deadline is a
  timeout; goodput scores both against the same SLO.

A quantile's difference is significantly lower (a gain: every quantile here is a latency) only when each cohort
has `calls_for_quantile` values for it; significantly higher (a regression) counts with any number.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from llmguard_tools.bench.quantile import percentile
from llmguard_tools.compare.load import Call
from llmguard_tools.compare.stats import (
    Interval,
    bootstrap_difference,
    calls_for_quantile,
    mean_sampler,
    quantile_sampler,
)

ALL_TIERS = "(all tiers)"


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    label: str
    unit: Literal["ratio", "s", "count"]
    values: Callable[[Sequence[Call]], list[float]]
    q: float | None = None
    """A quantile of the values; None: their mean."""

    def point(self, values: Sequence[float]) -> float | None:
        if not values:
            return None
        if self.q is None:
            return sum(values) / len(values)
        return percentile(values, 100.0 * self.q)


def _ttft(calls: Sequence[Call]) -> list[float]:
    return [c.ttft for c in calls if c.ttft is not None]


METRICS: tuple[Metric, ...] = (
    Metric("success", "success rate", "ratio", lambda cs: [float(c.ok) for c in cs]),
    Metric("timeouts", "timeout rate", "ratio", lambda cs: [float(c.status == "timeout") for c in cs]),
    Metric("http_429", "429 rate", "ratio", lambda cs: [float(c.http_status == 429) for c in cs]),
    Metric("ttft_p50", "TTFT p50", "s", _ttft, 0.50),
    Metric("ttft_p95", "TTFT p95", "s", _ttft, 0.95),
    Metric("ttft_p99", "TTFT p99", "s", _ttft, 0.99),
    Metric("e2e_p99", "e2e p99", "s", lambda cs: [c.e2e for c in cs if c.ok and c.e2e is not None], 0.99),
    Metric("attempts", "attempts/call", "count", lambda cs: [float(c.attempts) for c in cs]),
    Metric("server_load", "server load/call", "count", lambda cs: [float(c.sent) for c in cs]),
)
UNITS = {m.name: m.unit for m in METRICS}


def goodput(slo: float) -> Metric:
    """Succeeded with a first token within ``slo`` seconds, per call (informational: not in the verdict)."""
    return Metric(
        "goodput",
        f"goodput (TTFT<={slo:g}s)",
        "ratio",
        lambda cs: [float(c.ok and c.ttft is not None and c.ttft <= slo) for c in cs],
    )


@dataclass(frozen=True, slots=True)
class Group:
    """One cohort in one tier (or in all tiers)."""

    cohort: str
    tier: str
    calls: int
    ok: int
    timeouts: int
    http_429: int
    figures: dict[str, float | None]
    fractions: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Difference:
    """guarded - control for one metric in one scope (a tier, or all tiers)."""

    scope: str
    metric: str
    label: str
    unit: Literal["ratio", "s", "count"]
    guarded: float | None
    control: float | None
    interval: Interval | None
    """None when a cohort has fewer than 2 values for it."""
    q: float | None = None
    """The metric's quantile; None: a mean."""
    values: tuple[int, int] = (0, 0)
    """How many values the guarded and the control figure were taken of."""

    @property
    def needs(self) -> int | None:
        """The values each cohort needs before this quantile's interval may show a gain; None once each has
        them, and for a mean."""
        if self.q is None:
            return None
        need = calls_for_quantile(self.q)
        return need if min(self.values) < need else None

    @property
    def significant(self) -> Literal["higher", "lower"] | None:
        """The side of 0 the interval lies on, if it excludes 0 and may be read that way: a quantile that
        `needs` more values is never lower (a gain), only higher (a regression, the side that costs a hold)."""
        if self.interval is None:
            return None
        if self.interval.above_zero:
            return "higher"
        if self.interval.below_zero and self.needs is None:
            return "lower"
        return None


def scopes(calls: Sequence[Call]) -> list[str]:
    """The tiers, in first-seen order, then `ALL_TIERS` when there are several."""
    tiers = list(dict.fromkeys(c.tier for c in calls))
    return [*tiers, ALL_TIERS] if len(tiers) > 1 else tiers


def in_scope(calls: Sequence[Call], scope: str, cohort: str) -> list[Call]:
    return [c for c in calls if c.cohort == cohort and (scope == ALL_TIERS or c.tier == scope)]


def summarize(calls: Sequence[Call], metrics: Sequence[Metric] = METRICS) -> list[Group]:
    groups = []
    for scope in scopes(calls):
        for cohort in ("guarded", "control"):
            chosen = in_scope(calls, scope, cohort)
            if not chosen:
                continue
            groups.append(
                Group(
                    cohort=cohort,
                    tier=scope,
                    calls=len(chosen),
                    ok=sum(c.ok for c in chosen),
                    timeouts=sum(c.status == "timeout" for c in chosen),
                    http_429=sum(c.http_status == 429 for c in chosen),
                    figures={m.name: m.point(m.values(chosen)) for m in metrics},
                    fractions=sorted({c.fraction for c in chosen if c.fraction is not None}),
                )
            )
    return groups


def differences(
    calls: Sequence[Call],
    metrics: Sequence[Metric] = METRICS,
    *,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> list[Difference]:
    """Every metric's guarded - control in every scope where both cohorts have calls (seeded, reproducible)."""
    out = []
    for scope in scopes(calls):
        guarded, control = in_scope(calls, scope, "guarded"), in_scope(calls, scope, "control")
        if not guarded or not control:
            continue
        for metric in metrics:
            g_values, c_values = metric.values(guarded), metric.values(control)
            g_point, c_point = metric.point(g_values), metric.point(c_values)
            interval = None
            if len(g_values) >= 2 and len(c_values) >= 2 and g_point is not None and c_point is not None:
                if metric.q is None:
                    g_draw, c_draw = mean_sampler(g_values), mean_sampler(c_values)
                else:
                    g_draw, c_draw = quantile_sampler(g_values, metric.q), quantile_sampler(c_values, metric.q)
                assert g_draw is not None and c_draw is not None
                rng = random.Random(f"{seed}/{scope}/{metric.name}")  # per metric: adding one changes no other
                interval = bootstrap_difference(
                    g_draw, c_draw, g_point - c_point, resamples=resamples, confidence=confidence, rng=rng
                )
            out.append(
                Difference(
                    scope,
                    metric.name,
                    metric.label,
                    metric.unit,
                    g_point,
                    c_point,
                    interval,
                    metric.q,
                    (len(g_values), len(c_values)),
                )
            )
    return out
