"""`BenchReport`: the runs of every client over one plan, their statistics, ratios and verdicts, as JSON.

What is computed lives in `llmguard_tools.bench.summary` (statistics) and `llmguard_tools.bench.verdict`
(the verdict lines); how it is shown in `llmguard_tools.bench.tables` (terminal), `llmguard_tools.bench.plot`
(``--plot``) and `llmguard_tools.bench.glossary` (``--explain``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from llmguard_tools.bench.measure import TierSpec
from llmguard_tools.bench.runner import COUNTERS_NOTE, ClientRun, CountersMode
from llmguard_tools.bench.summary import LATENCY_KEYS, SLO, ClientSummary, latency, ratio, summarize
from llmguard_tools.bench.traffic import TrafficPlan
from llmguard_tools.bench.validity import invalid_reason, left_out
from llmguard_tools.bench.verdict import interpret

__all__ = ["BenchReport"]


@dataclass
class BenchReport:
    title: str
    plan: TrafficPlan
    slo: SLO
    tier: TierSpec
    counters: CountersMode
    model: str
    runs: list[ClientRun]
    scenario: str | None = None
    target: list[str] = field(default_factory=list)
    hints_every: float | None = None
    """Seconds between the ``guarded-hints`` client's polls when the run set them (``--hints-every``)."""
    summaries: list[ClientSummary] = field(init=False)
    invalid: str | None = field(init=False)
    """Why the run is INVALID (its load generator fell behind plan), or None; an invalid run has no verdict."""
    left_out: dict[str, float] = field(init=False)
    """Baselines left out of the comparison (their load generator fell behind plan): name -> seconds behind."""

    def __post_init__(self) -> None:
        self.summaries = [summarize(r, self.slo, self.tier, self.plan.profile) for r in self.runs]
        self.invalid = invalid_reason(self.runs, self.tier)
        self.left_out = left_out(self.runs, self.tier)

    def summary(self, client: str) -> ClientSummary | None:
        return next((s for s in self.summaries if s.client == client), None)

    @property
    def baseline(self) -> ClientSummary | None:
        return self.summary("plain")

    def ratios(self) -> dict[str, dict[str, float | None]]:
        """``"<client>/plain"`` -> latency-percentile ratios, plus amplification and goodput ratios."""
        base = self.baseline
        if base is None:
            return {}
        out: dict[str, dict[str, float | None]] = {}
        for s in self.summaries:
            if s is base:
                continue
            r: dict[str, float | None] = {k: ratio(latency(s, k), latency(base, k)) for k in LATENCY_KEYS}
            r["amplification"] = ratio(s.amplification, base.amplification)
            r["goodput"] = ratio(s.goodput_ratio, base.goodput_ratio)
            out[f"{s.client}/{base.client}"] = r
        return out

    def interpretation(self, client: str | None = None) -> str:
        """The verdict on ``client`` (default: the guarded one); for an invalid run, why there is none."""
        return interpret(self, client)

    def verdicts(self) -> dict[str, str]:
        """client -> its verdict, for every client but plain; empty when the run is invalid or has no plain."""
        if self.baseline is None or self.invalid is not None:
            return {}
        return {
            s.client: self.interpretation(s.client)
            for s in self.summaries
            if s.client != "plain" and s.client not in self.left_out
        }

    def to_dict(self, *, samples: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "title": self.title,
            "scenario": self.scenario,
            "target": self.target,
            "model": self.model,
            "counters": self.counters,
            "counters_note": COUNTERS_NOTE[self.counters],
            "valid": self.invalid is None,
            "invalid_reason": self.invalid,
            "generator_behind_s": {r.name: r.behind for r in self.runs},
            "plan": self.plan.to_dict(),
            "slo": asdict(self.slo),
            "tier": asdict(self.tier),
            "hints_every": self.hints_every,
            "clients": {s.client: s.to_dict() for s in self.summaries},
            "ratios": self.ratios(),
            "interpretation": self.interpretation(),
            "verdicts": self.verdicts(),
        }
        d["server_replicas"] = {
            r.name: None if r.server is None else [_flat(x) for x in r.server.replicas] for r in self.runs
        }
        if samples:
            d["samples"] = {r.name: [s.to_dict() for s in r.samples] for r in self.runs}
        return d


def _flat(stats: dict[str, Any]) -> dict[str, Any]:
    """A replica's counters (numbers only, nested dicts such as fault counts kept as they are)."""
    return {k: v for k, v in stats.items() if isinstance(v, (int, float, dict))}
