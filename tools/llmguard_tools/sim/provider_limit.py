"""A hosted API's rate limit over a whole simulated cluster: requests and tokens per minute, one bucket for
every replica (one API key), as OpenAI-style providers enforce it.

A request is charged its prompt tokens plus ``max_tokens`` when it arrives and refunded what it did not
generate when it ends. One that does not fit is refused at once: 429 ``rate_limit_exceeded`` with
``Retry-After`` / ``retry-after-ms`` (when it would fit) and the ``x-ratelimit-*`` headers, which every
admitted answer carries too. The bucket refills continuously on the wall clock, each dimension up to
``burst`` seconds of its rate (``time.monotonic``, or the clock given).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from llmguard_client import RateLimit

__all__ = ["ProviderLimit"]


@dataclass
class LimitCounters:
    """What the provider saw: requests admitted and refused (429)."""

    admitted: int = 0
    limited: int = 0


class _Dimension:
    """Requests or tokens: the refill rate per second, the capacity and the level (an unlimited one: rate 0)."""

    def __init__(self, per_minute: float | None, burst: float) -> None:
        self.rate = per_minute / 60.0 if per_minute is not None else 0.0
        self.capacity = self.level = self.rate * burst

    def wait_for(self, cost: float) -> float:
        """Seconds until ``cost`` fits (0: now)."""
        return 0.0 if self.rate == 0.0 else max(0.0, (min(cost, self.capacity) - self.level) / self.rate)


class _Bucket:
    """The provider's bucket: one request and its tokens charged at once, or refused charging nothing."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float]) -> None:
        self.requests = _Dimension(limit.requests_per_minute, limit.burst)
        self.tokens = _Dimension(limit.tokens_per_minute, limit.burst)
        self._clock = clock
        self._last = clock()

    def take(self, tokens: float) -> float | None:
        """None when admitted; else the seconds until it would fit."""
        self._refill()
        wait = max(self.requests.wait_for(1.0), self.tokens.wait_for(tokens))
        if wait > 0.0:
            return wait
        self.requests.level -= 1.0
        self.tokens.level -= tokens
        return None

    def refund(self, tokens: float) -> None:
        self._refill()
        self.tokens.level = min(self.tokens.capacity, self.tokens.level + tokens)

    def levels(self) -> tuple[float, float]:
        self._refill()
        return self.requests.level, self.tokens.level

    def _refill(self) -> None:
        now = self._clock()
        elapsed, self._last = max(0.0, now - self._last), now
        for dim in (self.requests, self.tokens):
            dim.level = min(dim.capacity, dim.level + elapsed * dim.rate)


class ProviderLimit:
    """The cluster's shared bucket for ``limit``, refilled on ``clock``."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.counters = LimitCounters()
        self._clock = clock
        self._bucket = _Bucket(limit, clock)

    def reset(self) -> None:
        """A full bucket and zeroed counters (between two clients of a bench)."""
        self.counters = LimitCounters()
        self._bucket = _Bucket(self.limit, self._clock)

    def admit(self, tokens: int) -> tuple[bool, list[tuple[str, str]]]:
        """Charge one request of ``tokens``: (admitted, the headers to answer with)."""
        wait = self._bucket.take(tokens)
        if wait is None:
            self.counters.admitted += 1
            return True, self.headers()
        self.counters.limited += 1
        return False, [
            ("retry-after", str(max(1, math.ceil(wait)))),
            ("retry-after-ms", str(max(1, math.ceil(wait * 1000)))),
            *self.headers(),
        ]

    def refund(self, tokens: int) -> None:
        """Give back tokens charged but not generated."""
        self._bucket.refund(float(tokens))

    def headers(self) -> list[tuple[str, str]]:
        """The ``x-ratelimit-*`` headers: the limits, what is left, and how long until the bucket is full."""
        requests, tokens = self._bucket.levels()
        out: list[tuple[str, str]] = []
        for name, per_minute, level in (
            ("requests", self.limit.requests_per_minute, requests),
            ("tokens", self.limit.tokens_per_minute, tokens),
        ):
            if per_minute is None:
                continue
            capacity = per_minute * self.limit.burst / 60.0
            reset_ms = max(0, math.ceil((capacity - level) / (per_minute / 60.0) * 1000))
            out += [
                (f"x-ratelimit-limit-{name}", str(int(per_minute))),
                (f"x-ratelimit-remaining-{name}", str(max(0, math.floor(level)))),
                (f"x-ratelimit-reset-{name}", f"{reset_ms}ms"),
            ]
        return out
