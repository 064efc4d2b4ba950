"""Named cluster scenarios: replica count, engine sizes, admission policy and per-replica faults.

Scaled down from the reference so that three replicas and a load generator share 2 cores and a bench of 500-700
requests ends in seconds. The workload is the reference mix / 10 (what ``llmguard bench`` sends:
prompts of median 57 words capped at 400, ``max_tokens`` of median 20 capped at 120 with ``ignore_eos``);
outputs sampled by the replicas (without ``ignore_eos``) follow the same / 10 shape, and the output
reservation of token admission is 320 / 10 = 32. Engines are far smaller than the reference (TBUD 400 -> 128
per step, KV 90k -> 4096 or 1408 tokens): a healthy request's TTFT is 10-30 ms (one prefill step, one decode
step) and its stream ~0.25 s. ``overload`` uses 40 ms steps (TTFT ~80 ms, TPOT 40 ms, streams ~1 s, so ~17
requests share a replica) and a 1408-token KV pool, so that it is KV-bound under token admission at ~50 rps
for the cluster: the bench's spike (30 -> 140 -> 30 rps, time-compressed) peaks at ~2.8x capacity
and its base (~0.6x) sees a few % of rejections, as in the reference (30 and 140 vs ~50).
The reference is the simulation described in `llmguard_tools.sim`.

``capacity_rps`` is the throughput (completions/s) of the whole cluster fed that workload at 3x that rate,
measured in virtual time (checked by ``tests/sim/test_scenarios.py``); ``load`` is the load the scenario is
meant for.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from llmguard_client.config import RateLimit
from llmguard_tools.sim.engine import EngineConfig
from llmguard_tools.sim.faults import FaultConfig, NeighbourBursts
from llmguard_tools.sim.lengths import SEED_OUTPUT_LENGTHS, SEED_PROMPT_LENGTHS, LengthDist

__all__ = [
    "SCENARIOS",
    "SIM_MAX_TOKENS",
    "SIM_OUTPUT_LENGTHS",
    "SIM_PROMPT_WORDS",
    "MULTITURN_PROMPT_WORDS",
    "LoadHint",
    "ScenarioConfig",
    "get_scenario",
]

SIM_OUTPUT_LENGTHS: LengthDist = SEED_OUTPUT_LENGTHS.scaled(0.1)
"""Output tokens sampled by the replicas (unless ``ignore_eos``): lognormal median 20, cap 120."""
SIM_PROMPT_WORDS: LengthDist = SEED_PROMPT_LENGTHS.scaled(0.1)
"""Prompt sizes (words) the scenarios are sized for: lognormal median 57, cap 400."""
SIM_MAX_TOKENS: LengthDist = SEED_OUTPUT_LENGTHS.scaled(0.1)
"""``max_tokens`` (with ``ignore_eos``) the scenarios are sized for: lognormal median 20, cap 120."""


@dataclass(frozen=True, slots=True)
class LoadHint:
    """The load a scenario is meant for: steady ``base_rps``, a spike to ``peak_rps``."""

    base_rps: float
    peak_rps: float
    prompt_words: LengthDist = SIM_PROMPT_WORDS
    max_tokens: LengthDist = SIM_MAX_TOKENS


@dataclass(frozen=True, slots=True)
class ScenarioConfig:
    """One cluster: ``replicas`` engines of ``engine``, replica ``i`` with ``faults[i % len(faults)]``."""

    name: str
    description: str
    replicas: int
    engine: EngineConfig
    load: LoadHint
    capacity_rps: float
    faults: tuple[FaultConfig, ...] = ()
    model: str = "sim-model"
    summary: str = ""
    """What the scenario models, in one short line (``llmguard bench --help`` and the report's header)."""
    rate_limit: RateLimit | None = None
    """A hosted API's limit enforced over the whole cluster (`llmguard_tools.sim.provider_limit`)."""

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("a scenario needs at least one replica")

    def faults_for(self, index: int) -> FaultConfig:
        """The faults of replica ``index`` (the list is cycled; none when it is empty)."""
        return self.faults[index % len(self.faults)] if self.faults else FaultConfig()

    def with_replicas(self, replicas: int) -> ScenarioConfig:
        """The same scenario with another replica count (capacity scaled accordingly)."""
        capacity = self.capacity_rps * replicas / self.replicas
        return dataclasses.replace(self, replicas=replicas, capacity_rps=capacity)


_ROOMY = EngineConfig(tbud=128, kv_tokens=4096, policy="token", out_reserve=32, output_lengths=SIM_OUTPUT_LENGTHS)
"""~165 rps per replica at saturation: the bench's 30-40 rps never meets admission."""
_TIGHT = dataclasses.replace(_ROOMY, step_s=0.040, kv_tokens=1408)
"""~17 rps per replica: KV-bound under token admission, like the reference engine at 140 rps."""
_UNBOUNDED = dataclasses.replace(_TIGHT, policy="none", history_every_s=0.1, history_len=600)
"""`_TIGHT` without admission: every request joins the waiting queue (vLLM's default, no queue limit). Its
queue is sampled every 0.1 s (for 60 s), so that the bench can time how soon it is back after a spike."""

_QUEUEING = dataclasses.replace(_ROOMY, policy="none")
"""`_ROOMY` without admission: another tenant's burst waits in the engine's queue instead of being refused."""
_NEIGHBOUR = NeighbourBursts(every_s=6.0, requests=32, prompt_tokens=256, output_tokens=16)
"""32 x 256 prompt tokens fill the 4,096-token KV cache twice over: ~0.65 s of queue, a request that joins it at
once gets its first token ~0.7 s later (a healthy replica's: 10-30 ms)."""

_CACHING = EngineConfig(
    tbud=512,
    kv_tokens=32_768,
    policy="token",
    out_reserve=32,
    output_lengths=SIM_OUTPUT_LENGTHS,
    prefix_cache_tokens=16_384,
)
"""Long prompts, a prefix cache of 16k tokens (~10 conversations): a 1,300-token prompt prefills in 3 steps
(TTFT ~40 ms), its cached continuation in one (~20 ms), as measured on vLLM CPU engines (47 -> 19 ms).
~35 rps per replica with nothing cached."""
MULTITURN_PROMPT_WORDS = LengthDist(median=1_450.0, sigma=0.15, cap=4_700)
"""Prompt sizes of the multiturn conversations: a 1,000-1,500-word system prompt plus the turns so far."""

_DEGRADED = FaultConfig(slow_factor=5.0, first_token_delay_s=0.09)
"""A degraded replica: 5x slower steps (TTFT ~90 ms, 50 ms per token) plus a 90 ms prefill delay, so its TTFT
(~180 ms) is ~10x a healthy replica's (~18 ms) and its time per token 5x."""

SCENARIOS: dict[str, ScenarioConfig] = {
    "healthy": ScenarioConfig(
        name="healthy",
        summary="3 healthy replicas, no faults: what the guard costs",
        description="3 roomy replicas, token admission, no faults",
        replicas=3,
        engine=_ROOMY,
        load=LoadHint(base_rps=30.0, peak_rps=30.0),
        capacity_rps=490.0,
    ),
    "stragglers": ScenarioConfig(
        name="stragglers",
        summary="5 % of requests stall 2 s before their first token",
        description="3 roomy replicas, light load; 5 % of requests stall 2 s before their first token",
        replicas=3,
        engine=_ROOMY,
        load=LoadHint(base_rps=40.0, peak_rps=40.0),
        capacity_rps=490.0,
        faults=(FaultConfig(stall_first_p=0.05, stall_first_s=2.0),),
    ),
    "queueing": ScenarioConfig(
        name="queueing",
        summary="another tenant's bursts queue on one replica at a time",
        description=(
            "3 roomy replicas without admission; every 2 s one of them, in turn, gets a burst of 32 requests "
            "(256 + 16 tokens) from another tenant: ~0.65 s of queue there, visible in its /metrics, where a "
            "request's first token takes up to ~0.7 s"
        ),
        replicas=3,
        engine=_QUEUEING,
        load=LoadHint(base_rps=40.0, peak_rps=40.0),
        capacity_rps=490.0,
        faults=tuple(FaultConfig(neighbour=dataclasses.replace(_NEIGHBOUR, offset_s=1.0 + 2.0 * i)) for i in range(3)),
    ),
    "overload": ScenarioConfig(
        name="overload",
        summary="a 30 -> 140 -> 30 rps spike on ~50 rps of capacity",
        description="3 KV-tight replicas (40 ms steps), token admission: ~50 rps in all, so 30 -> 140 -> 30 is ~3x",
        replicas=3,
        engine=_TIGHT,
        load=LoadHint(base_rps=30.0, peak_rps=140.0),
        capacity_rps=50.0,
    ),
    "collapse": ScenarioConfig(
        name="collapse",
        summary="overload on engines queueing without limit (vLLM default)",
        description=(
            "overload's cluster and spike, but the engines admit everything into an unbounded waiting queue "
            "(admission none, vLLM's default): past capacity the queue only grows, and drains long after the spike"
        ),
        replicas=3,
        engine=_UNBOUNDED,
        load=LoadHint(base_rps=30.0, peak_rps=140.0),
        capacity_rps=50.0,
    ),
    "faults": ScenarioConfig(
        name="faults",
        summary="resets, HTML 500s, black holes, stalls, bad Retry-After",
        description=(
            "3 roomy replicas with a mix of faults: r0 resets and malformed events, r1 HTML 500s, black holes "
            "and mid-stream stalls, r2 three times slower with pre-token stalls and garbage Retry-After"
        ),
        replicas=3,
        engine=_ROOMY,
        load=LoadHint(base_rps=30.0, peak_rps=30.0),
        capacity_rps=385.0,
        faults=(
            FaultConfig(reset_p=0.05, malformed_p=0.05),
            FaultConfig(html_500_p=0.05, blackhole_p=0.02, stall_mid_p=0.05, stall_mid_s=1.0),
            FaultConfig(slow_factor=3.0, stall_first_p=0.05, stall_first_s=1.0, retry_after="garbage"),
        ),
    ),
    "overload-in-stream": ScenarioConfig(
        name="overload-in-stream",
        summary="overload, refused as HTTP 200 + an in-stream 503 event",
        description=(
            "overload's cluster and spike, but rejections signalled the vLLM 0.32 way: HTTP 200 + an in-stream "
            "error event (code 503) + [DONE] for streams, a plain 503 otherwise, never a Retry-After"
        ),
        replicas=3,
        engine=_TIGHT,
        load=LoadHint(base_rps=30.0, peak_rps=140.0),
        capacity_rps=50.0,
        faults=(FaultConfig(overload_signal="in_stream"),),
    ),
    "rate-limited": ScenarioConfig(
        name="rate-limited",
        summary="one replica answers 429 + Retry-After: 30 from 2 s to 8 s",
        description=(
            "3 roomy replicas, light load; r0 answers every request with a 429 and Retry-After: 30 from 2 s "
            "to 8 s after the start (a hosted API's quota running out for a while), then serves again"
        ),
        replicas=3,
        engine=_ROOMY,
        load=LoadHint(base_rps=30.0, peak_rps=30.0),
        capacity_rps=490.0,
        faults=(
            FaultConfig(rate_limited_between=(2.0, 8.0), rate_limited_retry_after_s=30.0),
            FaultConfig(),
            FaultConfig(),
        ),
    ),
    "degraded": ScenarioConfig(
        name="degraded",
        summary="one replica 10x slower to first token, 5x per token",
        description=(
            "3 roomy replicas, light load; r1 is degraded for the whole run: 10x slower to its first token "
            "(5x slower steps plus a 90 ms prefill delay) and 5x slower per token"
        ),
        replicas=3,
        engine=_ROOMY,
        load=LoadHint(base_rps=40.0, peak_rps=40.0),
        capacity_rps=363.0,
        faults=(FaultConfig(), _DEGRADED, FaultConfig()),
    ),
    "degrading": ScenarioConfig(
        name="degrading",
        summary="one replica degraded from 4 s to 9 s, healthy otherwise",
        description=(
            "as degraded, but r1 is degraded only from 4 s to 9 s after the cluster starts, healthy before and after"
        ),
        replicas=3,
        engine=_ROOMY,
        load=LoadHint(base_rps=40.0, peak_rps=40.0),
        capacity_rps=490.0,
        faults=(FaultConfig(), dataclasses.replace(_DEGRADED, slow_between=(4.0, 9.0)), FaultConfig()),
    ),
    "ratelimited": ScenarioConfig(
        name="ratelimited",
        summary="a hosted API's 1,200 RPM / 120k TPM limit over the cluster",
        description=(
            "3 roomy replicas behind one provider rate limit of 1,200 requests and 120,000 tokens per minute "
            "(1 s of burst): past it, 429 + Retry-After + x-ratelimit-*, as hosted APIs answer"
        ),
        replicas=3,
        engine=_ROOMY,
        load=LoadHint(base_rps=40.0, peak_rps=40.0),
        capacity_rps=490.0,
        rate_limit=RateLimit(requests_per_minute=1200, tokens_per_minute=120_000, burst=1.0),
    ),
    "multiturn": ScenarioConfig(
        name="multiturn",
        description="3 replicas with 16k-token prefix caches; conversations of 2-6 turns on 1,000-1,500-token prompts",
        replicas=3,
        engine=_CACHING,
        load=LoadHint(base_rps=30.0, peak_rps=30.0, prompt_words=MULTITURN_PROMPT_WORDS),
        capacity_rps=104.0,
        summary="conversations of 2-6 turns; replicas cache prompt prefixes",
    ),
}


def get_scenario(name: str, replicas: int | None = None) -> ScenarioConfig:
    """Look up a scenario by name, optionally with another replica count; KeyError lists the known names."""
    try:
        scenario = SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(sorted(SCENARIOS))}") from None
    return scenario if replicas is None else scenario.with_replicas(replicas)
