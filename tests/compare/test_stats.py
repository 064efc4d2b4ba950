"""The bootstrap shortcuts draw from the same distributions as resampling and recomputing."""

from __future__ import annotations

import random
import statistics

import pytest

from llmguard_client._routing.quantile import percentile
from llmguard_tools.compare.stats import (
    TAIL_CALLS,
    binomial,
    bootstrap_difference,
    calls_for_quantile,
    mean_sampler,
    quantile_sampler,
)


@pytest.mark.parametrize(("n", "p"), [(10, 0.3), (1000, 0.03), (100_000, 0.97), (7, 0.0), (7, 1.0)])
def test_binomial_has_the_binomial_mean_and_spread(n: int, p: float) -> None:
    rng = random.Random(5)
    draws = [binomial(n, p, rng) for _ in range(5_000)]
    assert all(0 <= d <= n for d in draws)
    sd = (n * p * (1 - p)) ** 0.5
    assert statistics.fmean(draws) == pytest.approx(n * p, abs=4 * sd / 5_000**0.5 + 1e-9)
    assert statistics.pstdev(draws) == pytest.approx(sd, rel=0.06, abs=1e-9)


def naive(values: list[float], stat: str, rng: random.Random, q: float = 0.5) -> float:
    sample = rng.choices(values, k=len(values))
    if stat == "mean":
        return statistics.fmean(sample)
    result = percentile(sample, 100 * q)
    assert result is not None
    return result


@pytest.mark.parametrize("q", [0.5, 0.95, 0.99])
def test_quantile_sampler_matches_naive_resampling(q: float) -> None:
    rng = random.Random(11)
    values = [rng.lognormvariate(0, 1) for _ in range(300)]
    sampler = quantile_sampler(values, q)
    assert sampler is not None
    fast = [sampler(rng) for _ in range(10_000)]
    slow = [naive(values, "q", rng, q) for _ in range(3_000)]
    assert statistics.fmean(fast) == pytest.approx(statistics.fmean(slow), rel=0.04)
    assert statistics.pstdev(fast) == pytest.approx(statistics.pstdev(slow), rel=0.1)
    for tail in (0.025, 0.975):
        assert percentile(fast, 100 * tail) == pytest.approx(percentile(slow, 100 * tail), rel=0.08)


def test_mean_sampler_matches_naive_resampling() -> None:
    rng = random.Random(12)
    values = [1.0] * 264 + [2.0] * 30 + [3.0] * 6
    sampler = mean_sampler(values)
    assert sampler is not None
    fast = [sampler(rng) for _ in range(10_000)]
    slow = [naive(values, "mean", rng) for _ in range(3_000)]
    assert statistics.fmean(fast) == pytest.approx(statistics.fmean(values), abs=0.003)
    assert statistics.pstdev(fast) == pytest.approx(statistics.pstdev(slow), rel=0.08)


def test_samplers_of_nothing_and_of_one_value() -> None:
    assert mean_sampler([]) is None and quantile_sampler([], 0.5) is None
    one = quantile_sampler([4.0], 0.99)
    assert one is not None and one(random.Random(0)) == 4.0


def test_bootstrap_difference_is_seeded_and_ordered() -> None:
    g = mean_sampler([1.0] * 95 + [0.0] * 5)
    c = mean_sampler([1.0] * 80 + [0.0] * 20)
    assert g is not None and c is not None
    first = bootstrap_difference(g, c, 0.15, resamples=2000, confidence=0.95, rng=random.Random(1))
    again = bootstrap_difference(g, c, 0.15, resamples=2000, confidence=0.95, rng=random.Random(1))
    assert first == again and first.low < 0.15 < first.high and first.above_zero and not first.below_zero


@pytest.mark.parametrize(("q", "calls"), [(0.5, 20), (0.95, 200), (0.99, 1000), (0.999, 10000)])
def test_a_quantile_needs_ten_calls_beyond_it(q: float, calls: int) -> None:
    assert TAIL_CALLS == 10 and calls_for_quantile(q) == calls
