"""Synthetic runs and reports with known figures, for the report, verdict, table and plot tests."""

from __future__ import annotations

from llmguard_tools.bench.measure import Sample, TierSpec
from llmguard_tools.bench.report import BenchReport
from llmguard_tools.bench.runner import ClientRun, ServerStats
from llmguard_tools.bench.summary import SLO
from llmguard_tools.bench.traffic import make_plan

TTFTS = (0.1, 0.2, 0.3, 0.4, 0.5, 2.0, 3.0)
"""The seven successful requests of `mixed_run` (before scaling); three more fail."""


def sample(i: int, client: str = "plain", status: str = "ok", ttft: float | None = 0.1, e2e: float = 1.0,
           tokens: int = 10, http: int | None = 200, attempts: int | None = 1) -> Sample:  # fmt: skip
    return Sample(
        index=i,
        client=client,
        status=status,
        http_status=http,
        cause=None,
        scheduled=0.0,
        lag=0.0,
        ttft=ttft,
        e2e=e2e,
        completion_tokens=tokens,
        prompt_tokens=5,
        attempts=attempts,
    )


def mixed_run(name: str = "plain", ttft_scale: float = 1.0, server: ServerStats | None = None) -> ClientRun:
    """7 successes (TTFT `TTFTS` x ``ttft_scale``, e2e 0.9 s later), a timeout, a 429 and a 504."""
    ok = [sample(i, name, ttft=t * ttft_scale, e2e=t * ttft_scale + 0.9, tokens=10) for i, t in enumerate(TTFTS)]
    bad = [
        sample(7, name, status="timeout", ttft=None, e2e=10.0, http=None, attempts=1),
        sample(8, name, status="http_429", ttft=None, e2e=0.01, http=429, attempts=1),
        sample(9, name, status="http_504", ttft=None, e2e=10.0, http=504, attempts=1),
    ]
    return ClientRun(name, ok + bad, server, wall=5.0)


def server(received: int, work: int = 100, wasted: int = 0) -> ServerStats:
    return ServerStats([{"received": received, "work_tokens": work, "aborted_work_tokens": wasted}])


def make_report(scenario: str | None = "stragglers", runs: list[ClientRun] | None = None) -> BenchReport:
    """plain, and guarded 9x faster to first token at 1.1x the server load (unless ``runs`` is given)."""
    runs = runs or [mixed_run("plain", 1.0, server(10)), mixed_run("guarded", 1 / 9, server(11, 110, 5))]
    return BenchReport(
        title="t",
        plan=make_plan(10, seed=0, rate=10.0),
        slo=SLO(1.0, 0.1),
        tier=TierSpec(),
        counters="reset",
        model="m",
        runs=runs,
        scenario=scenario,
    )
