"""Configuration values: frozen, slotted, validated when built.

A bad value raises `GuardConfigError` naming the field, the value and what is
accepted, at construction time, never in the middle of a call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import httpx

from llmguard_client._errors import GuardConfigError

FailureMode = Literal["auto", "response", "raise"]
"""How a guard failure reaches the caller: ``response`` (a proxy-style HTTP error
response carrying ``x-should-retry: false``), ``raise`` (a typed httpx exception), or
``auto`` (``response`` when the request carries the openai SDK's ``x-stainless-*``
headers, ``raise`` otherwise)."""


def _positive(owner: str, name: str, value: float | None, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if (
        value is None
        or isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        accepted = "a positive finite number of seconds" + (" or None" if allow_none else "")
        raise GuardConfigError(f"{owner}.{name} must be {accepted}, got {value!r}")


@dataclass(frozen=True, slots=True)
class Tier:
    """Deadlines of one SLO tier, in seconds.

    ttft:  from the call's start to the first content token, across every attempt,
           backoff and hedge (for a non-streaming call: to the complete response).
    total: from the call's start to the last byte of the response.
    stall: the longest silence between two chunks after the first token (None: no limit
           besides ``total``).
    """

    ttft: float
    total: float
    stall: float | None = None

    def __post_init__(self) -> None:
        _positive("Tier", "ttft", self.ttft)
        _positive("Tier", "total", self.total)
        _positive("Tier", "stall", self.stall, allow_none=True)
        if self.ttft > self.total:
            raise GuardConfigError(
                f"Tier.ttft ({self.ttft}) must not exceed Tier.total ({self.total}): "
                "the first token has to arrive within the whole call's deadline"
            )


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica's base URL, and headers sent only to it (e.g. its own API key).

    Header values are never logged nor put in records or telemetry.
    """

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url:
            raise GuardConfigError(
                f"Replica.url must be a non-empty 'http(s)://host[:port][/prefix]' URL, got {self.url!r}"
            )
        try:
            parsed = httpx.URL(self.url)
        except Exception as exc:
            raise GuardConfigError(f"Replica.url {self.url!r} is not a valid URL: {exc}") from exc
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise GuardConfigError(
                f"Replica.url must be an absolute http:// or https:// URL with a host, got {self.url!r}"
            )
        if parsed.query or parsed.fragment:
            raise GuardConfigError(f"Replica.url must not carry a query or fragment, got {self.url!r}")
        object.__setattr__(self, "headers", dict(self.headers))

    @property
    def name(self) -> str:
        """The replica's URL without credentials: safe to log."""
        parsed = httpx.URL(self.url)
        return str(parsed.copy_with(username=None, password=None)).rstrip("/")


@dataclass(frozen=True, slots=True)
class HedgePolicy:
    """When and how often to send the same call to another replica.

    delay:         fixed seconds before a hedge, or None for adaptive: the ``quantile`` of
                   recent time-to-first-token of the call's tier, clamped to
                   [``min_delay``, ``max_delay``], ``warmup_delay`` until ``min_samples``.
    max_hedges:    extra attempts per call at most.
    on_failure:    a failed attempt before the first token sends the hedge at once.
    paths:         path suffixes hedged by default (idempotent-safe generation calls);
                   ``hedge_all_paths=True`` hedges every path.
    """

    delay: float | None = None
    quantile: float = 0.95
    min_delay: float = 0.05
    max_delay: float = 2.0
    warmup_delay: float = 0.5
    min_samples: int = 20
    max_hedges: int = 1
    on_failure: bool = True
    paths: tuple[str, ...] = ("/chat/completions", "/completions")
    hedge_all_paths: bool = False

    def __post_init__(self) -> None:
        _positive("HedgePolicy", "delay", self.delay, allow_none=True)
        _positive("HedgePolicy", "min_delay", self.min_delay)
        _positive("HedgePolicy", "max_delay", self.max_delay)
        _positive("HedgePolicy", "warmup_delay", self.warmup_delay)
        if self.min_delay > self.max_delay:
            raise GuardConfigError(
                f"HedgePolicy.min_delay ({self.min_delay}) must not exceed max_delay ({self.max_delay})"
            )
        if not 0 < self.quantile < 1:
            raise GuardConfigError(f"HedgePolicy.quantile must be in (0, 1), e.g. 0.95; got {self.quantile!r}")
        if not isinstance(self.min_samples, int) or self.min_samples < 1:
            raise GuardConfigError(f"HedgePolicy.min_samples must be an integer >= 1, got {self.min_samples!r}")
        if not isinstance(self.max_hedges, int) or not 1 <= self.max_hedges <= 4:
            raise GuardConfigError(f"HedgePolicy.max_hedges must be an integer from 1 to 4, got {self.max_hedges!r}")

    def applies_to(self, path: str) -> bool:
        return self.hedge_all_paths or path.rstrip("/").endswith(self.paths)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Which failures are retried, how often, and how long to back off.

    Backoff is exponential with full jitter (tenacity's ``wait_random_exponential``)
    from ``backoff_initial`` up to ``backoff_max``; a server's Retry-After replaces it
    for the replica that sent it. A retry happens only before the first token reached
    the caller, only if the shared budget allows, and only if it fits the tier deadline.
    """

    max_attempts: int = 3
    backoff_initial: float = 0.05
    backoff_max: float = 2.0
    retry_statuses: frozenset[int] = frozenset({408, 429, 500, 502, 503, 504})
    circuit_failures: int = 5
    circuit_cooldown: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or not 1 <= self.max_attempts <= 10:
            raise GuardConfigError(
                f"RetryPolicy.max_attempts must be an integer from 1 to 10, got {self.max_attempts!r}"
            )
        _positive("RetryPolicy", "backoff_initial", self.backoff_initial)
        _positive("RetryPolicy", "backoff_max", self.backoff_max)
        _positive("RetryPolicy", "circuit_cooldown", self.circuit_cooldown)
        if not isinstance(self.circuit_failures, int) or self.circuit_failures < 1:
            raise GuardConfigError(
                f"RetryPolicy.circuit_failures must be an integer >= 1, got {self.circuit_failures!r}"
            )
        bad = sorted(s for s in self.retry_statuses if not 400 <= s <= 599 or (s < 500 and s not in (408, 429)))
        if bad:
            raise GuardConfigError(
                f"RetryPolicy.retry_statuses may hold 408, 429 and 5xx only (other 4xx are the caller's "
                f"mistake and fail the same way again), got {bad}"
            )
        object.__setattr__(self, "retry_statuses", frozenset(self.retry_statuses))


@dataclass(frozen=True, slots=True)
class BudgetPolicy:
    """The shared budget of extra attempts (retries + hedges): at most ``ratio`` x the
    logical calls of the last ``window`` seconds, plus ``floor`` so a quiet client can
    still retry."""

    ratio: float = 0.1
    floor: int = 3
    window: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float)) or not 0 <= self.ratio <= 10:
            raise GuardConfigError(f"BudgetPolicy.ratio must be a number from 0 to 10, got {self.ratio!r}")
        if not isinstance(self.floor, int) or self.floor < 0:
            raise GuardConfigError(f"BudgetPolicy.floor must be an integer >= 0, got {self.floor!r}")
        _positive("BudgetPolicy", "window", self.window)


@dataclass(frozen=True, slots=True)
class Bulkhead:
    """Per-tier cap on calls in flight, with a bounded waiting line; past both the call
    fails at once (`BulkheadFull`) instead of queueing without bound."""

    max_in_flight: int
    max_waiting: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.max_in_flight, int) or self.max_in_flight < 1:
            raise GuardConfigError(f"Bulkhead.max_in_flight must be an integer >= 1, got {self.max_in_flight!r}")
        if not isinstance(self.max_waiting, int) or self.max_waiting < 0:
            raise GuardConfigError(f"Bulkhead.max_waiting must be an integer >= 0, got {self.max_waiting!r}")
