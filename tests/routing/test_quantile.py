from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmguard_client._routing.quantile import StreamingQuantile, lower_median, percentile

samples = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
q_open = st.floats(min_value=0, max_value=1, exclude_min=True, exclude_max=True)


def brute_force(window: list[float], q: float) -> float:
    """Type-7 (linear interpolation) quantile from numpy, independent of the implementation."""
    return float(np.quantile(window, q))


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 40), xs=st.lists(samples, max_size=150), qs=st.lists(q_open, min_size=1, max_size=5))
def test_matches_brute_force_over_last_size_samples(size: int, xs: list[float], qs: list[float]) -> None:
    est = StreamingQuantile(size)
    for i, x in enumerate(xs):
        est.add(x)
        window = xs[max(0, i + 1 - size) : i + 1]
        assert len(est) == est.count == len(window)
        assert len(est._ring) <= size and len(est._sorted) <= size  # bounded memory
        assert est._sorted == sorted(window)
        for q in qs:
            got = est.quantile(q)
            assert got is not None
            assert got == pytest.approx(brute_force(window, q), rel=1e-12, abs=1e-9)
            assert min(window) <= got <= max(window)


@given(xs=st.lists(samples, min_size=2, max_size=60), k=st.integers(1, 99))
def test_agrees_with_statistics_quantiles_inclusive(xs: list[float], k: int) -> None:
    est = StreamingQuantile(len(xs))
    for x in xs:
        est.add(x)
    expected = statistics.quantiles(xs, n=100, method="inclusive")[k - 1]
    assert est.quantile(k / 100) == pytest.approx(expected, rel=1e-9, abs=1e-9)


@given(xs=st.lists(samples, min_size=1, max_size=50), q1=q_open, q2=q_open)
def test_monotone_in_q(xs: list[float], q1: float, q2: float) -> None:
    est = StreamingQuantile(16)
    for x in xs:
        est.add(x)
    lo, hi = sorted((q1, q2))
    a, b = est.quantile(lo), est.quantile(hi)
    assert a is not None and b is not None and a <= b


def test_empty_is_none() -> None:
    est = StreamingQuantile()
    assert est.quantile(0.95) is None
    assert (len(est), est.count, est.size) == (0, 0, 256)


def test_single_sample() -> None:
    est = StreamingQuantile()
    est.add(0.25)
    assert est.quantile(0.01) == est.quantile(0.5) == est.quantile(0.99) == 0.25


def test_known_values() -> None:
    est = StreamingQuantile(100)
    for x in range(1, 101):
        est.add(float(x))
    assert est.quantile(0.5) == pytest.approx(50.5)
    assert est.quantile(0.95) == pytest.approx(95.05)
    assert est.quantile(0.99) == pytest.approx(99.01)


def test_old_samples_age_out() -> None:
    est = StreamingQuantile(size=10)
    for _ in range(10):
        est.add(5.0)  # a replica that was slow...
    assert est.quantile(0.95) == 5.0
    for _ in range(9):
        est.add(0.1)  # ...recovers: one slow sample is left
    assert est.quantile(0.5) == 0.1
    assert est.quantile(0.95) == pytest.approx(0.1 + 0.55 * 4.9)
    est.add(0.1)  # the last slow sample ages out
    assert est.quantile(0.95) == 0.1
    assert len(est) == 10


def test_memory_bounded() -> None:
    est = StreamingQuantile(size=64)
    for i in range(20_000):
        est.add(float(i % 997))
    assert len(est) == est.count == 64
    assert len(est._ring) == len(est._sorted) == 64
    assert est._sorted == sorted(float(i % 997) for i in range(20_000 - 64, 20_000))


def test_accepts_ints_and_zero_and_normalises_negative_zero() -> None:
    est = StreamingQuantile(2)
    est.add(0)
    est.add(-0.0)
    assert est.quantile(0.5) == 0.0
    assert all(math.copysign(1.0, x) == 1.0 for x in est._sorted)
    est.add(3)
    assert est.quantile(0.5) == 1.5


def test_duplicates_evicted_one_at_a_time() -> None:
    est = StreamingQuantile(3)
    for x in (1.0, 1.0, 2.0, 1.0, 3.0):
        est.add(x)
    assert est._sorted == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0, -1e-300, 10**400, "1.0", None, True])
def test_add_rejects(bad: object) -> None:
    est = StreamingQuantile()
    with pytest.raises(ValueError, match="sample must be a finite number >= 0"):
        est.add(bad)  # type: ignore[arg-type]
    assert len(est) == 0


@pytest.mark.parametrize("q", [0.0, 1.0, -0.5, 1.5, math.nan, math.inf, "0.5", True])
def test_quantile_rejects(q: object) -> None:
    est = StreamingQuantile()
    est.add(1.0)
    with pytest.raises(ValueError, match="q must be a number strictly between 0 and 1"):
        est.quantile(q)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [0, -1, 1.5, "256", True, None])
def test_size_rejects(size: object) -> None:
    with pytest.raises(ValueError, match="size must be an int >= 1"):
        StreamingQuantile(size)  # type: ignore[arg-type]


def test_repr() -> None:
    est = StreamingQuantile(8)
    est.add(1.0)
    assert repr(est) == "StreamingQuantile(size=8, count=1)"


# --- percentile: the same definition over a whole sample ---------------------------------------


def test_percentile_known_values() -> None:
    data = list(range(1, 11))  # 1..10
    assert percentile(data, 0) == 1
    assert percentile(data, 100) == 10
    assert percentile(data, 50) == pytest.approx(5.5)
    assert percentile(data, 90) == pytest.approx(9.1)
    assert percentile(data, 99) == pytest.approx(9.91)
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None
    assert percentile([5, 1, 3], 50) == 3  # unsorted input
    assert percentile(iter([2.0, 1.0]), 50) == 1.5  # any iterable


@pytest.mark.parametrize("p", [-1, 101, math.nan, "50", True, None])
def test_percentile_rejects(p: object) -> None:
    with pytest.raises(ValueError, match=r"percentile p must be a number in \[0, 100\], got"):
        percentile([1.0], p)  # type: ignore[arg-type]


def test_percentile_matches_numpy_linear() -> None:
    rng = random.Random(4)
    for n in (2, 7, 100, 1001):
        values = [rng.lognormvariate(0, 1) for _ in range(n)]
        for p in (1, 50, 95, 99, 99.9):
            assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)))


@given(xs=st.lists(samples, min_size=1, max_size=60), q=q_open)
def test_percentile_and_the_window_agree(xs: list[float], q: float) -> None:
    est = StreamingQuantile(len(xs))
    for x in xs:
        est.add(x)
    assert percentile(xs, q * 100) == pytest.approx(est.quantile(q), rel=1e-12, abs=1e-9)


def test_lower_median_is_the_lower_middle_value() -> None:
    assert lower_median([]) is None
    assert lower_median([0.3]) == 0.3
    assert lower_median([0.05, 0.001]) == 0.001  # of two, the faster one
    assert lower_median([0.4, 0.1, 0.2]) == 0.2
    assert lower_median([0.4, 0.1, 0.3, 0.2]) == 0.2
