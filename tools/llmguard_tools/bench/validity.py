"""Whether a bench run can be judged at all: a load generator that fell behind its plan invalidates it.

The bench sends every request from the same event loop that times it. When that loop (or the machine) is
too busy to send on plan, it is also too busy to time first tokens or fire deadlines on time, so latencies,
timeouts and goodput describe the load generator, not the clients. The clients run one after another, each on
its own replay: when plain's or a guarded client's replay fell behind, the verdict has nothing sound to rest on
and the run is INVALID; when another baseline's fell behind (a retrying baseline can starve its own generator
under overload), that baseline is left out of the comparison and the run keeps its verdict.

The tolerance: the generator may fall behind the planned arrivals by at most half the guard tier's TTFT
deadline, and never more than 1 s (0.5 s with the default 1 s tier). Waits for a ``--concurrency`` slot are
part of the plan and do not count.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmguard_tools.bench.measure import TierSpec
from llmguard_tools.bench.runner import ClientRun

__all__ = ["MAX_BEHIND_S", "RULE", "invalid_reason", "is_baseline", "left_out", "no_verdict", "tolerance"]

MAX_BEHIND_S = 1.0
"""The tolerance never exceeds this many seconds, whatever the tier."""

RULE = (
    "A run whose load generator fell behind the planned arrivals by more than half the tier's TTFT deadline "
    "(at most 1 s; 0.5 s with the default tier) for plain or a guarded client is INVALID and gets no verdict; "
    "another baseline that fell behind is left out of the comparison."
)
"""The rule in words, for --help, --explain and the report."""

ADVICE = (
    "re-run with fewer calls/s (--rate), fewer or smaller requests, fewer clients (--clients), or on a quieter machine"
)


def tolerance(tier: TierSpec) -> float:
    """Seconds the load generator may fall behind plan before the run is invalid."""
    return min(MAX_BEHIND_S, tier.ttft / 2)


def is_baseline(client: str) -> bool:
    """plain, openai-default, naive-retry...: every client that is not the guard."""
    return not (client.startswith("guarded") or client == "rollout")


def _judged(client: str) -> bool:
    """A client the verdict rests on: plain, and every guarded one."""
    return client == "plain" or not is_baseline(client)


def left_out(runs: Sequence[ClientRun], tier: TierSpec) -> dict[str, float]:
    """Baselines other than plain whose load generator fell behind plan: name -> seconds behind."""
    limit = tolerance(tier)
    return {r.name: r.behind for r in runs if not _judged(r.name) and r.behind > limit}


def invalid_reason(runs: Sequence[ClientRun], tier: TierSpec) -> str | None:
    """Why the run is invalid (plain's or a guarded client's generator fell furthest behind, by how much), or
    None if it is valid."""
    worst = max((r for r in runs if _judged(r.name)), key=lambda r: r.behind, default=None)
    limit = tolerance(tier)
    if worst is None or worst.behind <= limit:
        return None
    return (
        f"the load generator fell behind plan by up to {worst.behind:.2f} s ({worst.name}), more than "
        f"the {limit:.2f} s tolerated (half the tier's {tier.ttft:g} s TTFT deadline, at most {MAX_BEHIND_S:g} s)"
    )


def no_verdict(reason: str) -> str:
    """The verdict line of an invalid run: why there is none, and what to do."""
    return (
        f"NO VERDICT: this run is INVALID: {reason}, so its latencies, timeouts and goodput measure a starved "
        f"load generator, not the clients. To get a verdict, {ADVICE}."
    )
