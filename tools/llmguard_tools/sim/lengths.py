"""Capped lognormal length distributions (prompt and output tokens) of the reference simulation."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["SEED_OUTPUT_LENGTHS", "SEED_PROMPT_LENGTHS", "LengthDist"]


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A lognormal length with a given median and log-space sigma, clipped to ``[1, cap]``."""

    median: float
    sigma: float
    cap: int

    def __post_init__(self) -> None:
        if self.median <= 0 or self.sigma < 0 or self.cap < 1:
            raise ValueError(f"invalid length distribution: {self}")

    def sample(self, rng: random.Random) -> int:
        """Draw one length."""
        value = rng.lognormvariate(math.log(self.median), self.sigma)
        return max(1, min(self.cap, round(value)))

    def scaled(self, factor: float) -> LengthDist:
        """The same shape with median and cap multiplied by ``factor``."""
        return LengthDist(self.median * factor, self.sigma, max(1, round(self.cap * factor)))


# Fitted to the reference's quantiles: prompt p50 572 / p90 1157 / p99 2059, output p50 199 / p90 433 / p99 808.
SEED_PROMPT_LENGTHS = LengthDist(median=570.0, sigma=0.55, cap=4000)
SEED_OUTPUT_LENGTHS = LengthDist(median=200.0, sigma=0.60, cap=1200)
