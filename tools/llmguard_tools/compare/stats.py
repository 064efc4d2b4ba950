"""Bootstrap confidence intervals for guarded - control, in pure Python and fast.

Each cohort is resampled with replacement, independently, ``resamples`` times; the
statistic is computed on each resample and the interval is the percentile interval of
the ``guarded - control`` differences. Rather than drawing n indices per resample (O(n)),
each resample's statistic is drawn directly from its exact bootstrap distribution:

- a mean of few distinct values (a success flag, attempts per call): the resample's value
  counts are multinomial, drawn as successive binomials (O(distinct values x log n));
- a quantile: the k-th smallest of n uniform index draws is Beta(k, n + 1 - k) distributed,
  so the resample's order statistics are drawn with one Beta variate and one uniform (O(1)).

Both produce the same distribution as resampling and recomputing, so a run over a million
records costs the same few milliseconds per statistic as one over a hundred.

The percentile bootstrap of a quantile is only as good as the values beyond it: with few of them a
p99 is the bootstrap of a sample maximum, known to be invalid (its interval is narrow and lopsided,
and excludes 0 between two samples of one distribution far more often than promised).
`calls_for_quantile` is the one rule for when a quantile's interval may be trusted.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llmguard_tools.bench.quantile import percentile

__all__ = [
    "TAIL_CALLS",
    "Interval",
    "binomial",
    "bootstrap_difference",
    "calls_for_quantile",
    "mean_sampler",
    "quantile_sampler",
]

Sampler = Callable[[random.Random], float]
"""Draws one bootstrap resample's statistic."""

TAIL_CALLS = 10
"""Values beyond a quantile that each sample needs before that quantile's interval is trusted."""


def calls_for_quantile(q: float) -> int:
    """The fewest values with `TAIL_CALLS` beyond the ``q``-quantile: 10 / (1 - q), e.g. 1000 for a p99."""
    return math.ceil(round(TAIL_CALLS / (1.0 - q), 6))  # rounded first: 10 / (1 - 0.99) is 1000.0000000000009


def binomial(n: int, p: float, rng: random.Random) -> int:
    """One Binomial(n, p) draw in O(log n): split at the median order statistic (Knuth, TAOCP 3.4.1)."""
    if p <= 0.0 or n <= 0:
        return 0
    if p >= 1.0:
        return n
    count = 0
    while n > 40:
        i = 1 + n // 2
        x = rng.betavariate(i, n + 1 - i)  # the i-th smallest of n uniforms
        if x <= p:  # those i are all below p; the n - i above x are uniform on (x, 1)
            count += i
            n -= i
            p = (p - x) / (1.0 - x)
        else:  # the i - 1 below x are uniform on (0, x)
            n = i - 1
            p = p / x
    return count + sum(rng.random() < p for _ in range(n))


def mean_sampler(values: Sequence[float]) -> Sampler | None:
    """Draws the mean of a bootstrap resample of ``values`` (few distinct values expected)."""
    n = len(values)
    if n == 0:
        return None
    counts = sorted(Counter(values).items())

    def draw(rng: random.Random) -> float:
        left, mass, total = n, 1.0, 0.0
        for value, count in counts[:-1]:
            share = count / n
            taken = binomial(left, min(1.0, share / mass), rng) if left else 0
            total += value * taken
            left -= taken
            mass -= share
        return (total + counts[-1][0] * left) / n

    return draw


def quantile_sampler(values: Sequence[float], q: float) -> Sampler | None:
    """Draws the type-7 ``q``-quantile (`llmguard_tools.bench.quantile.percentile`'s) of a bootstrap resample."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return None
    position = q * (n - 1)
    low = math.floor(position)
    weight = position - low

    def draw(rng: random.Random) -> float:
        u = rng.betavariate(low + 1, n - low)  # the (low + 1)-th smallest of n uniforms
        below = ordered[min(int(n * u), n - 1)]
        if weight == 0.0 or low + 1 >= n:
            return below
        v = u + (1.0 - u) * (1.0 - rng.random() ** (1.0 / (n - low - 1)))  # the next one up
        return below + weight * (ordered[min(int(n * v), n - 1)] - below)

    return draw


@dataclass(frozen=True, slots=True)
class Interval:
    """guarded - control: the point estimate and its bootstrap percentile interval."""

    estimate: float
    low: float
    high: float

    @property
    def above_zero(self) -> bool:
        return self.low > 0.0

    @property
    def below_zero(self) -> bool:
        return self.high < 0.0


def bootstrap_difference(
    guarded: Sampler,
    control: Sampler,
    estimate: float,
    *,
    resamples: int,
    confidence: float,
    rng: random.Random,
) -> Interval:
    """The percentile interval of ``guarded() - control()`` over ``resamples`` draws."""
    diffs = [guarded(rng) - control(rng) for _ in range(resamples)]
    tail = (1.0 - confidence) / 2.0
    low, high = percentile(diffs, 100.0 * tail), percentile(diffs, 100.0 * (1.0 - tail))
    assert low is not None and high is not None
    return Interval(estimate, low, high)
