"""Seed 000 reproduced in virtual time: the engine is stepped directly (no sleeping, no HTTP).

Nothing is scaled down: the engine runs at the seed's own sizes (10 ms steps, TBUD 400 per step, KV pool
90k tokens, prefill chunks of 512, prompt lognormal median 570 capped at 4000, output median 200 capped at
1200, requests asking for max_tokens=1200, token admission reserving prompt + min(max_tokens, 320) against
95 % of the pool) under the seed's spike (30 -> 140 -> 30 rps for 15 / 20 / 25 s). One 60 s run costs ~0.3 s
of CPU. The figures these tests pin (seed 0) are in the comments.
"""

from __future__ import annotations

import pytest

from llmguard_tools.bench.rates import SPIKE
from llmguard_tools.sim.engine import EngineConfig
from llmguard_tools.sim.virtual import (
    HONOUR_ONE_RETRY,
    HONOUR_WITH_BUDGET,
    NAIVE_RETRY,
    NO_RETRY,
    ClientModel,
    VirtualRun,
    run_open_loop,
)

SEED_ENGINE = EngineConfig()  # the defaults are the seed's sizes
TOKEN = EngineConfig(policy="token")


@pytest.fixture(scope="module")
def spike() -> dict[str, VirtualRun]:
    return {policy: run_open_loop(EngineConfig(policy=policy), SPIKE) for policy in ("none", "token")}


def test_queue_after_the_spike_stays_high_without_admission_and_empties_with_token(
    spike: dict[str, VirtualRun],
) -> None:
    none, token = spike["none"], spike["token"]
    # Before the spike both are unloaded.
    assert none.sample_at(15)[2] == token.sample_at(15)[2] == 0
    # none: ~460 waiting 5 s into the spike, ~1880 at its end, still ~1815 five seconds after and ~1570 at 60 s.
    assert none.sample_at(35)[2] > 1000
    assert none.sample_at(40)[2] > 1000
    assert none.sample_at(60)[2] > 1000
    assert none.sample_at(35)[3] > 0.85  # KV pool (nearly) full
    # token: the queue never builds (at most a request or two between two steps) and is empty after the spike.
    assert max(s[2] for s in token.samples) <= 2
    assert token.sample_at(40)[2] == 0
    assert all(s[2] <= 1 for s in token.samples if s[0] >= 40)  # at most one arrival not yet scheduled
    assert token.sample_at(40)[3] < 0.8
    # TTFT: p99 ~31 s without admission, ~0.14 s with token admission.
    assert none.ttft_quantile(0.99) > 10 * token.ttft_quantile(0.99)


def test_token_admission_never_preempts(spike: dict[str, VirtualRun]) -> None:
    none, token = spike["none"], spike["token"]
    # none: ~130 preemptions and ~63k recomputed tokens; token: none at all, at the price of ~1900 rejections.
    assert token.preemptions == 0 and token.recompute_tokens == 0
    assert none.preemptions >= 50 and none.recompute_tokens > 10_000
    assert none.rejected == 0 and token.rejected > 0


def amplification(client: ClientModel) -> float:
    return run_open_loop(TOKEN, SPIKE, client=client).amplification


def test_naive_retries_amplify_arrivals_and_honouring_retry_after_does_not() -> None:
    assert amplification(NO_RETRY) == 1.0
    # The seed's storm (80 % retry after 0.2 / 0.4 / 0.8 s, Retry-After ignored): arrivals x2.02.
    assert amplification(NAIVE_RETRY) > 1.8
    # Honour Retry-After and retry once, or give up when it exceeds the 1 s SLO: x1.01.
    assert amplification(HONOUR_ONE_RETRY) < 1.2
    # Honour Retry-After, retry once within a 10 % retry budget: x1.08.
    assert amplification(HONOUR_WITH_BUDGET) < 1.2
