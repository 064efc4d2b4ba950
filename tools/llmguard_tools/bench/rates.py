"""Piecewise-constant arrival rates: the one `RateProfile` of the bench and the virtual-time sim.

A profile is ``(rate_rps, duration_s)`` segments, in the order ``llmguard bench --profile RATE:SECONDS,...``
takes them. `SPIKE` is the overload shape the demo uses: 30 rps for 15 s, 140 rps for 20 s, 30 rps for 25 s
(about 3x a cluster sized for 47 rps at the peak, 0.64x at the base).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["PROFILES", "SPIKE", "RateProfile", "parse_profile"]


@dataclass(frozen=True, slots=True)
class RateProfile:
    """Piecewise-constant arrival rate: ``segments`` of ``(rate_rps, duration_s)``, each > 0."""

    segments: tuple[tuple[float, float], ...]
    name: str = "custom"

    def __post_init__(self) -> None:
        if not self.segments:
            raise ValueError("a rate profile needs at least one RATE:SECONDS segment")
        for rate, duration in self.segments:
            if not (math.isfinite(rate) and rate > 0):
                raise ValueError(f"profile rates must be > 0 requests/s, got {rate!r}")
            if not (math.isfinite(duration) and duration > 0):
                raise ValueError(f"profile durations must be > 0 seconds, got {duration!r}")

    @property
    def duration(self) -> float:
        """Total length in seconds."""
        return sum(d for _, d in self.segments)

    @property
    def expected_requests(self) -> float:
        """Arrivals expected over the whole profile."""
        return sum(r * d for r, d in self.segments)

    @property
    def peak_rate(self) -> float:
        return max(r for r, _ in self.segments)

    def rate_at(self, t: float) -> float:
        """The arrival rate at ``t`` seconds from the start (0 after the end)."""
        for rate, duration in self.segments:
            if t < duration:
                return rate
            t -= duration
        return 0.0

    def scaled(self, *, rate: float = 1.0, time: float = 1.0) -> RateProfile:
        """Every rate multiplied by ``rate`` and every duration by ``time``."""
        return RateProfile(tuple((r * rate, d * time) for r, d in self.segments), self.name)

    def fitted(self, n: int, base_rate: float | None = None) -> RateProfile:
        """Rates scaled so the first segment runs at ``base_rate`` (default: unchanged), then the
        time axis compressed or stretched so the expected number of arrivals is ``n``."""
        rated = self if base_rate is None else self.scaled(rate=base_rate / self.segments[0][0])
        return rated.scaled(time=n / rated.expected_requests)

    def describe(self) -> str:
        parts = " -> ".join(f"{r:g} rps x {d:.3g} s" for r, d in self.segments)
        return f"{self.name} ({parts})"


SPIKE = RateProfile(((30.0, 15.0), (140.0, 20.0), (30.0, 25.0)), "spike")
"""30 rps for 15 s, 140 rps for 20 s, 30 rps for 25 s."""

PROFILES: dict[str, RateProfile] = {"spike": SPIKE}


def parse_profile(spec: str) -> RateProfile:
    """``spike`` or a custom ``RATE:SECONDS,RATE:SECONDS,...`` list."""
    spec = spec.strip()
    if spec in PROFILES:
        return PROFILES[spec]
    segments: list[tuple[float, float]] = []
    try:
        for part in spec.split(","):
            rate_s, duration_s = part.split(":")
            segments.append((float(rate_s), float(duration_s)))
    except ValueError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown profile {spec!r}: use one of {known} or RATE:SECONDS[,RATE:SECONDS...]") from None
    return RateProfile(tuple(segments))
