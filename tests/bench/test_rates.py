"""`RateProfile`: the one piecewise-constant arrival rate of the bench and the virtual-time sim."""

from __future__ import annotations

import math

import pytest

from llmguard_tools.bench.rates import SPIKE, RateProfile, parse_profile


def test_segments_are_rate_then_duration_as_on_the_command_line() -> None:
    assert SPIKE.segments == ((30.0, 15.0), (140.0, 20.0), (30.0, 25.0))
    assert parse_profile("10:5, 50:2") == RateProfile(((10.0, 5.0), (50.0, 2.0)))
    assert SPIKE.duration == 60.0
    assert SPIKE.expected_requests == 30 * 15 + 140 * 20 + 30 * 25
    assert SPIKE.peak_rate == 140.0


def test_rate_at_walks_the_segments_and_is_zero_after_the_end() -> None:
    assert [SPIKE.rate_at(t) for t in (0.0, 14.99, 15.0, 34.99, 35.0, 59.99, 60.0, 1e9)] == [
        30.0, 30.0, 140.0, 140.0, 30.0, 30.0, 0.0, 0.0,
    ]  # fmt: skip


def test_scaled_and_fitted_keep_the_shape() -> None:
    double = SPIKE.scaled(rate=2.0, time=0.5)
    assert double.segments == ((60.0, 7.5), (280.0, 10.0), (60.0, 12.5)) and double.name == "spike"
    fitted = SPIKE.fitted(700, base_rate=30.0)
    assert fitted.expected_requests == pytest.approx(700)
    assert [r for r, _ in fitted.segments] == [30.0, 140.0, 30.0]
    assert "spike (30 rps x" in fitted.describe()


def test_parse_profile_names_and_errors() -> None:
    assert parse_profile(" spike ") is SPIKE
    assert parse_profile("10:5").name == "custom"
    for bad in ("nope", "10:5:1", "10", ""):
        with pytest.raises(ValueError, match=r"unknown profile .*: use one of spike or RATE:SECONDS"):
            parse_profile(bad)


@pytest.mark.parametrize(
    ("segments", "message"),
    [
        ((), "at least one RATE:SECONDS segment"),
        (((0.0, 5.0),), "rates must be > 0 requests/s, got 0.0"),
        (((-1.0, 5.0),), "rates must be > 0 requests/s, got -1.0"),
        (((math.inf, 5.0),), "rates must be > 0"),
        (((10.0, 0.0),), "durations must be > 0 seconds, got 0.0"),
        (((10.0, math.nan),), "durations must be > 0 seconds, got nan"),
    ],
)
def test_bad_profiles_name_what_is_wrong(segments: tuple[tuple[float, float], ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RateProfile(segments)
    if segments:  # the same message from the command line's RATE:SECONDS form
        with pytest.raises(ValueError, match=message.split(",")[0]):
            parse_profile(",".join(f"{r}:{d}" for r, d in segments))
