"""Open-loop load against one `Engine` in virtual time: no sleeping, no HTTP, fully deterministic.

Arrivals are Poisson with a piecewise-constant rate (the bench's `RateProfile`, e.g. its `SPIKE`); rejected
requests are handed to a `ClientModel` that decides whether and when to retry. Used by the engine tests that
reproduce the overload study's figures (tests/sim/test_engine_seed.py) and to size scenarios (`measure_capacity`).
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from dataclasses import dataclass, field
from typing import Literal

from llmguard_tools.bench.quantile import percentile
from llmguard_tools.bench.rates import RateProfile
from llmguard_tools.sim.engine import Engine, EngineConfig, EngineRequest, Rejected, Sequence
from llmguard_tools.sim.lengths import SEED_PROMPT_LENGTHS, LengthDist

__all__ = [
    "HONOUR_ONE_RETRY",
    "HONOUR_WITH_BUDGET",
    "NAIVE_RETRY",
    "NO_RETRY",
    "ClientModel",
    "VirtualRun",
    "measure_capacity",
    "run_open_loop",
]


@dataclass(frozen=True, slots=True)
class ClientModel:
    """How a client reacts to a 429.

    ``never`` gives up; ``fixed`` retries (with ``retry_probability``) after ``fixed_delays_s[n]`` whatever
    the Retry-After (the naive client); ``honour`` waits the server's Retry-After, gives up when it exceeds
    ``give_up_after_s``, and spends one token of a retry budget per retry when ``budget_ratio`` is set (the
    budget earns ``budget_ratio`` per first attempt, starts at ``budget_initial``, is capped at ``budget_cap``).
    """

    retry: Literal["never", "fixed", "honour"]
    max_retries: int = 0
    retry_probability: float = 1.0
    fixed_delays_s: tuple[float, ...] = (0.2,)
    give_up_after_s: float = float("inf")
    budget_ratio: float | None = None
    budget_initial: float = 5.0
    budget_cap: float = 20.0


NO_RETRY = ClientModel("never")
NAIVE_RETRY = ClientModel("fixed", max_retries=3, retry_probability=0.8, fixed_delays_s=(0.2, 0.4, 0.8))
"""A retry storm: 80 % of rejected requests retry after 0.2 / 0.4 / 0.8 s, ignoring Retry-After."""
HONOUR_ONE_RETRY = ClientModel("honour", max_retries=1, give_up_after_s=1.0)
"""Waits the Retry-After and retries once, or gives up when the server asks for more than 1 s (the SLO)."""
HONOUR_WITH_BUDGET = ClientModel("honour", max_retries=1, budget_ratio=0.1)
"""Waits the Retry-After, retries once, and only while a 10 % retry budget lasts."""


@dataclass(slots=True)
class VirtualRun:
    """What one run measured. ``samples`` are ``(t, running, waiting, kv_fraction)``."""

    originals: int = 0
    arrivals: int = 0
    retries: int = 0
    rejected: int = 0
    gave_up: int = 0
    completed: int = 0
    preemptions: int = 0
    work_tokens: int = 0
    recompute_tokens: int = 0
    samples: list[tuple[float, int, int, float]] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    retry_afters: list[float] = field(default_factory=list)

    @property
    def amplification(self) -> float:
        """Arrivals seen by the server (first attempts + retries) per first attempt."""
        return self.arrivals / max(1, self.originals)

    def sample_at(self, t: float) -> tuple[float, int, int, float]:
        """The sample closest to time ``t``."""
        return min(self.samples, key=lambda s: abs(s[0] - t))

    def ttft_quantile(self, q: float) -> float:
        """Quantile ``q`` (0..1) of the time to first token, measured from the first attempt (nan if none)."""
        value = percentile(self.ttfts, q * 100)
        return float("nan") if value is None else value


@dataclass(order=True, slots=True)
class _Attempt:
    at: float
    order: int
    first_at: float = field(compare=False)
    prompt: int = field(compare=False)
    max_tokens: int = field(compare=False)
    retries: int = field(compare=False, default=0)


class _Budget:
    __slots__ = ("cap", "ratio", "tokens")

    def __init__(self, model: ClientModel) -> None:
        self.ratio = model.budget_ratio
        self.tokens = model.budget_initial
        self.cap = model.budget_cap

    def earn(self) -> None:
        if self.ratio is not None:
            self.tokens = min(self.cap, self.tokens + self.ratio)

    def spend(self) -> bool:
        if self.ratio is None:
            return True
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


def _retry_delay(
    model: ClientModel, attempt: _Attempt, rejection: Rejected, budget: _Budget, rng: random.Random
) -> float | None:
    if model.retry == "never" or attempt.retries >= model.max_retries:
        return None
    if model.retry == "fixed":
        if rng.random() >= model.retry_probability:
            return None
        return model.fixed_delays_s[min(attempt.retries, len(model.fixed_delays_s) - 1)]
    if rejection.retry_after_s > model.give_up_after_s or not budget.spend():
        return None
    return rejection.retry_after_s


def run_open_loop(
    config: EngineConfig,
    profile: RateProfile,
    *,
    client: ClientModel = NO_RETRY,
    prompts: LengthDist = SEED_PROMPT_LENGTHS,
    max_tokens: int | None = None,
    fixed_outputs: LengthDist | None = None,
    seed: int = 0,
    sample_every_s: float = 5.0,
) -> VirtualRun:
    """Drive a fresh engine through ``profile`` step by step and report what happened.

    Each request asks for ``max_tokens`` (default: the engine's output cap) and gets a sampled output
    length; with ``fixed_outputs`` it asks for a sampled ``max_tokens`` and gets exactly that many tokens
    (like the bench's ``ignore_eos`` requests).
    """
    engine = Engine(config, random.Random(f"{seed}:engine"))
    arrivals_rng = random.Random(f"{seed}:arrivals")
    prompt_rng = random.Random(f"{seed}:prompts")
    client_rng = random.Random(f"{seed}:client")
    limit = max_tokens if max_tokens is not None else config.output_lengths.cap
    period = config.step_period
    queue: list[_Attempt] = []
    t, order = 0.0, 0
    while True:
        rate = profile.rate_at(t)
        t += arrivals_rng.expovariate(rate) if rate > 0 else period
        if t >= profile.duration:
            break
        if profile.rate_at(t) > 0:
            out = limit if fixed_outputs is None else fixed_outputs.sample(prompt_rng)
            prompt = max(1, min(prompts.sample(prompt_rng), config.model_len - out))
            queue.append(_Attempt(t, order, t, prompt, out))
            order += 1
    heapq.heapify(queue)
    run = VirtualRun(originals=len(queue))
    budget = _Budget(client)
    first_at: dict[int, float] = {}
    steps = round(profile.duration / period)
    next_sample = sample_every_s
    for k in range(steps + 1):
        now = k * period
        while queue and queue[0].at <= now:
            attempt = heapq.heappop(queue)
            run.arrivals += 1
            if attempt.retries == 0:
                budget.earn()
            else:
                run.retries += 1
            try:
                fixed = None if fixed_outputs is None else attempt.max_tokens
                seq = engine.submit(EngineRequest(attempt.prompt, attempt.max_tokens, fixed), now)
            except Rejected as rejection:
                run.rejected += 1
                run.retry_afters.append(rejection.retry_after_s)
                delay = _retry_delay(client, attempt, rejection, budget, client_rng)
                if delay is None:
                    run.gave_up += 1
                else:
                    order += 1
                    retry = dataclasses.replace(attempt, at=now + delay, order=order, retries=attempt.retries + 1)
                    heapq.heappush(queue, retry)
                continue
            first_at[seq.id] = attempt.first_at
        for seq in engine.step(now):
            _observe(seq, now, first_at, run)
        if now + 1e-9 >= next_sample:
            kv = engine.kv_used / config.kv_tokens
            run.samples.append((round(now, 3), engine.running, engine.waiting, kv))
            next_sample += sample_every_s
    run.preemptions = engine.stats.preemptions
    run.work_tokens = engine.stats.work_tokens
    run.recompute_tokens = engine.stats.recompute_tokens
    return run


def _observe(seq: Sequence, now: float, first_at: dict[int, float], run: VirtualRun) -> None:
    if seq.generated == 1 and seq.first_token_at == now:
        run.ttfts.append(now - first_at[seq.id])
    if seq.done:
        run.completed += 1
        del first_at[seq.id]


def measure_capacity(
    config: EngineConfig,
    *,
    prompts: LengthDist,
    max_tokens: int | None = None,
    fixed_outputs: LengthDist | None = None,
    seconds: float = 20.0,
    overload_rps: float = 500.0,
    seed: int = 0,
) -> float:
    """Completions per second of one engine fed ``overload_rps`` of open-loop arrivals for ``seconds``."""
    run = run_open_loop(
        config,
        RateProfile(((overload_rps, seconds),), "capacity"),
        prompts=prompts,
        max_tokens=max_tokens,
        fixed_outputs=fixed_outputs,
        seed=seed,
        sample_every_s=seconds,
    )
    return run.completed / seconds
