"""The prefix-cache lines of a bench run: each replica's hit rate (from ``/sim/stats``), TTFT by turn, and the
load spread (the busiest replica's calls / the mean replica's).

Printed after the report when a replica has a prefix cache (the ``multiturn`` scenario); nothing otherwise.
Hit rates are in tokens, like vLLM's ``prefix_cache_hits_total / prefix_cache_queries_total``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmguard_tools.bench.conversations import turn_of
from llmguard_tools.bench.quantile import percentile
from llmguard_tools.bench.runner import ClientRun
from llmguard_tools.bench.traffic import TrafficPlan

__all__ = ["cache_lines", "hit_rates", "load_spread"]


def hit_rates(replicas: Sequence[dict[str, Any]]) -> tuple[list[float | None], float | None]:
    """Each replica's hit rate and the cluster's, in tokens; None where nothing was queried."""

    def rate(hits: float, queries: float) -> float | None:
        return hits / queries if queries else None

    per = [rate(r.get("prefix_cache_hits", 0) or 0, r.get("prefix_cache_queries", 0) or 0) for r in replicas]
    hits = sum(r.get("prefix_cache_hits", 0) or 0 for r in replicas)
    return per, rate(hits, sum(r.get("prefix_cache_queries", 0) or 0 for r in replicas))


def load_spread(replicas: Sequence[str | None], n: int) -> float | None:
    """The busiest replica's share of the calls over the mean share (1.0: perfectly even), over ``n`` replicas
    (a replica that answered none counts as 0); None when no call named its replica."""
    counts: dict[str, int] = {}
    for replica in replicas:
        if replica is not None:
            counts[replica] = counts.get(replica, 0) + 1
    total = sum(counts.values())
    if not total:
        return None
    return max(counts.values()) / (total / max(n, len(counts)))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.0f} ms"


def cache_lines(runs: Sequence[ClientRun], plan: TrafficPlan) -> list[str]:
    """A header, then one line per client: hit rate per replica and overall, TTFT p50 of first / later turns, and
    the busiest replica's calls over the mean."""
    if not any(r.server and any(s.get("prefix_cache_queries") for s in r.server.replicas) for r in runs):
        return []
    turns = turn_of(plan) if plan.mode == "conversations" else None
    width = max(len(r.name) for r in runs)
    replicas = max(len(r.server.replicas) for r in runs if r.server is not None)
    lines = [
        f"prefix cache hit rate (tokens) {' '.join(f'r{i}' for i in range(replicas))}, all"
        + ("; TTFT p50 first / later turns" if turns is not None else "")
        + "; busiest replica's calls / mean:"
    ]
    for run in runs:
        line = f"  {run.name:<{width}} "
        if run.server is not None:
            per, overall = hit_rates(run.server.replicas)
            line += "".join(f" {_pct(v):>4}" for v in per) + f"  all {_pct(overall):>4}"
        if turns is not None:
            first = [s.ttft for s in run.samples if s.ttft is not None and s.ok and turns[s.index] == 0]
            later = [s.ttft for s in run.samples if s.ttft is not None and s.ok and turns[s.index] > 0]
            line += f"  TTFT {_ms(percentile(first, 50))} / {_ms(percentile(later, 50))}"
        spread = load_spread([s.replica for s in run.samples], replicas)
        line += "  busiest -" if spread is None else f"  busiest {spread:.2f}x"
        lines.append(line)
    return lines
