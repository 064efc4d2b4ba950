"""The tools' percentile: type 7, the definition the guard's own statistics use."""

from __future__ import annotations

import random
import statistics

import pytest

from llmguard_client._routing.quantile import percentile as runtime_percentile
from llmguard_tools.bench.quantile import percentile


def test_it_is_statistics_inclusive_quantiles_and_the_runtimes() -> None:
    rng = random.Random(7)
    for size in (2, 3, 10, 101):
        values = [rng.expovariate(1.0) for _ in range(size)]
        cuts = statistics.quantiles(values, n=100, method="inclusive")
        for p in range(1, 100):
            assert percentile(values, p) == pytest.approx(cuts[p - 1])
            assert percentile(values, p) == runtime_percentile(values, p)


def test_the_ends_one_value_and_none() -> None:
    assert percentile([3.0, 1.0, 2.0], 0) == 1.0
    assert percentile([3.0, 1.0, 2.0], 100) == 3.0
    assert percentile([5.0], 50) == 5.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match="percentile p"):
        percentile([1.0], 101)
