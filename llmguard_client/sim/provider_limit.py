"""A hosted API's rate limit over a whole simulated cluster: requests and tokens per minute, one bucket for
every replica (one API key), as OpenAI-style providers enforce it.

A request is charged its prompt tokens plus ``max_tokens`` when it arrives and refunded what it did not
generate when it ends. One that does not fit is refused at once: 429 ``rate_limit_exceeded`` with
``Retry-After`` / ``retry-after-ms`` (when it would fit) and the ``x-ratelimit-*`` headers, which every
admitted answer carries too. The bucket is the guard's own `LocalBucket` on the wall clock.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from llmguard_client._ratelimit.buckets import LocalBucket
from llmguard_client.config import RateLimit

__all__ = ["ProviderLimit"]


@dataclass
class LimitCounters:
    """What the provider saw: requests admitted and refused (429)."""

    admitted: int = 0
    limited: int = 0


class ProviderLimit:
    """The cluster's shared bucket for ``limit``."""

    def __init__(self, limit: RateLimit) -> None:
        self.limit = limit
        self.counters = LimitCounters()
        self._bucket = LocalBucket(limit, time.monotonic)

    def reset(self) -> None:
        """A full bucket and zeroed counters (between two clients of a bench)."""
        self.counters = LimitCounters()
        self._bucket = LocalBucket(self.limit, time.monotonic)

    def admit(self, tokens: int) -> tuple[bool, list[tuple[str, str]]]:
        """Charge one request of ``tokens``: (admitted, the headers to answer with)."""
        grant = self._bucket.take(tokens, max_wait=0.0)
        if grant.retry_after is None:
            self.counters.admitted += 1
            return True, self.headers()
        self.counters.limited += 1
        wait = grant.retry_after
        return False, [
            ("retry-after", str(max(1, math.ceil(wait)))),
            ("retry-after-ms", str(max(1, math.ceil(wait * 1000)))),
            *self.headers(),
        ]

    def refund(self, tokens: int) -> None:
        """Give back tokens charged but not generated."""
        self._bucket.adjust(0.0, float(tokens))

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
