"""Per-client statistics over the same planned traffic: the numbers every table and verdict is built from.

Definitions (each metric is explained for users by ``llmguard bench --explain``, `llmguard_tools.bench.glossary`):

* success ratio   requests that streamed to ``[DONE]`` with HTTP 200 / logical requests.
* goodput         successful requests with TTFT <= ``slo.ttft`` and TPOT <= ``slo.tpot`` / logical requests
                  (good completions over arrivals).
* timeout ratio   client-side timeouts (harness deadline, httpx/SDK/guard timeouts) plus 408/504 answers.
* 429 ratio       requests whose final answer was HTTP 429.
* latency         TTFT / e2e / TPOT percentiles over *successful* requests (the plot shows all requests:
                  failures never arrive, so the curve levels off at the failure share).
* percentiles     `llmguard_tools.bench.quantile.percentile` (linear interpolation, numpy's default), p in [0, 100].
* amplification   sum of the replicas' ``received`` / logical requests (server-side), plus the
                  client-side attempts / logical requests where the client can count them.
* metrics polls   the replicas' ``GET /metrics`` answered during the client's run / logical requests (server
                  hints; not in the amplification).
* deadline failures  requests that ended in a client-side timeout (status ``timeout``).
* late successes  successful requests later than the guard tier allows: TTFT > tier ttft or e2e > tier total.
* queue back      seconds from a spike's end until the replicas' summed waiting queues are back to their
                  pre-spike depth (`llmguard_tools.bench.queue_recovery`).
* wasted tokens   ``aborted_work_tokens`` (work done for requests whose client went away: hedge losers,
                  timeouts), also as a % of ``work_tokens``; loser aborts = ``aborted_by_disconnect``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from llmguard_tools.bench.measure import Sample, TierSpec
from llmguard_tools.bench.quantile import percentile
from llmguard_tools.bench.queue_recovery import QueueRecovery, queue_recovery
from llmguard_tools.bench.rates import RateProfile
from llmguard_tools.bench.runner import ClientRun
from llmguard_tools.bench.tiermix import TierFigures, tier_figures

__all__ = ["LATENCY_KEYS", "PCTS", "SLO", "ClientSummary", "latency", "ratio", "summarize"]


@dataclass(frozen=True)
class SLO:
    """Goodput thresholds in seconds: TTFT <= ttft and TPOT <= tpot."""

    ttft: float = 1.0
    tpot: float = 0.08


def ratio(num: float | None, den: float | None) -> float | None:
    """``num / den``, or None when either is unknown or ``den`` is 0."""
    if num is None or den is None or den == 0:
        return None
    return num / den


PCTS = (50, 95, 99)


@dataclass
class ClientSummary:
    client: str
    n: int
    ok: int
    success_ratio: float
    goodput: int
    goodput_ratio: float
    goodput_rps: float
    timeout_ratio: float
    ratio_429: float
    other_error_ratio: float
    ttft: dict[str, float | None]
    e2e: dict[str, float | None]
    tpot: dict[str, float | None]
    failure_latency: dict[str, float | None]
    """Time to a failed answer minus the waits the client chose to honour (guarded: Retry-After/backoff)."""
    failure_own_time: dict[str, float | None]
    """guarded: time to a failed answer minus honoured waits minus time with an attempt in flight."""
    refusal_latency: dict[str, float | None]
    """Calls the guard's admission refused (``Overloaded``, never sent): from the call's start to the caller
    learning it."""
    completion_tokens: int
    wall_s: float
    client_attempts: int | None
    client_amplification: float | None
    server_received: float | None = None
    amplification: float | None = None
    metrics_polls: float | None = None
    """``GET /metrics`` the servers answered during the run, per logical request (server hints)."""
    server_rejected: float | None = None
    work_tokens: float | None = None
    wasted_tokens: float | None = None
    wasted_pct: float | None = None
    loser_aborts: float | None = None
    preemptions: float | None = None
    server_drained: bool | None = None
    queue_recovery: QueueRecovery | None = None
    """How long the servers' waiting queues took to come back to their pre-spike depth (a spike profile)."""
    deadline_failures: int = 0
    """Failed requests that ended in a client-side timeout (a deadline)."""
    late_successes: int = 0
    """Successful requests later than the tier allows (TTFT > tier ttft or e2e > tier total)."""
    status_counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tiers: dict[str, TierFigures] = field(default_factory=dict)
    """With ``--tier-mix``: each tier's calls, completed and good shares."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(
    run: ClientRun, slo: SLO, tier: TierSpec | None = None, profile: RateProfile | None = None
) -> ClientSummary:
    """The statistics of one client's run; server-side figures only when the run has server counters;
    late successes only when ``tier`` is given; the queue's recovery only for a spike ``profile``."""
    samples = run.samples
    n = len(samples)
    ok = [s for s in samples if s.ok]
    good = [
        s
        for s in ok
        if s.ttft is not None and s.ttft <= slo.ttft and (s.tpot if s.tpot is not None else math.inf) <= slo.tpot
    ]
    timeouts = sum(1 for s in samples if s.status == "timeout" or s.http_status in (408, 504))
    r429 = sum(1 for s in samples if s.http_status == 429)
    counts: dict[str, int] = {}
    for s in samples:
        counts[s.status] = counts.get(s.status, 0) + 1
    ttfts = [s.ttft for s in ok if s.ttft is not None]
    e2es = [s.e2e for s in ok]
    tpots = [t for s in ok if (t := s.tpot) is not None]
    failed = [s.e2e - (s.waited or 0.0) for s in samples if not s.ok]
    refused = [s.e2e for s in samples if s.http_status == 429 and s.cause == "overloaded"]
    own = [s.e2e - (s.waited or 0.0) - s.in_attempts for s in samples if not s.ok and s.in_attempts is not None]
    known_attempts = [s.attempts for s in samples if s.attempts is not None]
    client_attempts = sum(known_attempts) if len(known_attempts) == n and n else None
    summary = ClientSummary(
        client=run.name,
        n=n,
        ok=len(ok),
        success_ratio=len(ok) / n if n else 0.0,
        goodput=len(good),
        goodput_ratio=len(good) / n if n else 0.0,
        goodput_rps=len(good) / run.wall if run.wall > 0 else 0.0,
        timeout_ratio=timeouts / n if n else 0.0,
        ratio_429=r429 / n if n else 0.0,
        other_error_ratio=(n - len(ok) - timeouts - r429) / n if n else 0.0,
        ttft={f"p{p}": percentile(ttfts, p) for p in PCTS},
        e2e={f"p{p}": percentile(e2es, p) for p in PCTS},
        tpot={f"p{p}": percentile(tpots, p) for p in PCTS},
        failure_latency={f"p{p}": percentile(failed, p) for p in (*PCTS, 100)},
        failure_own_time={f"p{p}": percentile(own, p) for p in (*PCTS, 100)},
        refusal_latency={f"p{p}": percentile(refused, p) for p in (*PCTS, 100)},
        completion_tokens=sum(s.completion_tokens for s in ok),
        wall_s=run.wall,
        client_attempts=client_attempts,
        client_amplification=ratio(client_attempts, n) if client_attempts is not None else None,
        deadline_failures=sum(1 for s in samples if s.status == "timeout"),
        late_successes=0 if tier is None else sum(1 for s in ok if _late(s, tier)),
        status_counts=dict(sorted(counts.items())),
        notes=list(run.notes),
        tiers=tier_figures(samples, good) if any(s.tier for s in samples) else {},
    )
    if run.server is not None:
        srv = run.server
        summary.server_received = srv.total("received")
        summary.amplification = ratio(summary.server_received, n)
        summary.metrics_polls = ratio(srv.total("metrics_requests"), n)
        summary.server_rejected = srv.total("rejected")
        summary.work_tokens = srv.total("work_tokens")
        summary.wasted_tokens = srv.total("aborted_work_tokens")
        summary.wasted_pct = ratio(summary.wasted_tokens * 100.0, summary.work_tokens) if summary.work_tokens else 0.0
        summary.loser_aborts = srv.total("aborted_by_disconnect")
        summary.preemptions = srv.total("preemptions")
        summary.server_drained = srv.drained
        summary.queue_recovery = queue_recovery(srv.replicas, profile)
    return summary


def _late(s: Sample, tier: TierSpec) -> bool:
    return (s.ttft is not None and s.ttft > tier.ttft) or s.e2e > tier.total


LATENCY_KEYS = tuple(f"{m}_p{p}" for m in ("ttft", "e2e") for p in PCTS)
"""``ttft_p50`` ... ``e2e_p99``: the latency percentiles compared between clients."""


def latency(s: ClientSummary, key: str) -> float | None:
    """The latency percentile ``key`` (one of `LATENCY_KEYS`) of ``s``."""
    metric, p = key.split("_")
    value: float | None = getattr(s, metric)[p]
    return value
