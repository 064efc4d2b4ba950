"""Rate-limit headers of hosted APIs: how much room a replica says it has left, and until when.

OpenAI (and the APIs that copy it: Azure OpenAI, Groq, Together, ...) send on every answer::

    x-ratelimit-remaining-requests: 59        x-ratelimit-reset-requests: 1s
    x-ratelimit-remaining-tokens: 0           x-ratelimit-reset-tokens: 6m0s

A reset is a Go-style duration (``1h2m3.5s``, ``6m0s``, ``20ms``) or a plain number of seconds. A replica
whose remaining requests or tokens reached 0 has no room until the matching reset: the router ranks it
after every replica with room (it is not refused outright: with every replica out of room the call still
goes somewhere, and the server's 429 and Retry-After take over). Headers that are absent or unreadable
tell nothing; they never raise.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["RateLimitHint", "parse_duration", "parse_rate_limits", "remaining_room"]

_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)")
MAX_RESET = 3600.0
"""Longest reset believed (seconds): a longer one is clamped, so a bad header cannot shun a replica for days."""


@dataclass(frozen=True, slots=True)
class RateLimitHint:
    """What one answer said: seconds until the replica has room again (0: it has room now)."""

    no_room_for: float


def parse_duration(text: str) -> float | None:
    """Seconds in ``"1h2m3.5s"``, ``"6m0s"``, ``"20ms"`` or ``"1.5"``; None if it is not one of those."""
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        return value if math.isfinite(value) and value >= 0 else None
    total, position = 0.0, 0
    for match in _PART.finditer(text):
        if match.start() != position:
            return None
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    return total if position == len(text) else None


def _remaining(headers: Mapping[str, str], name: str) -> int | None:
    key = f"x-ratelimit-remaining-{name}"
    if key not in headers:  # usually absent: httpx's `in` scans the headers, its `get` raises inside as well
        return None
    raw = headers[key]
    try:
        return int(float(raw.strip()))
    except (ValueError, OverflowError):
        return None


def remaining_room(headers: Mapping[str, str]) -> tuple[int | None, int | None]:
    """``(requests, tokens)`` a response's ``x-ratelimit-remaining-*`` headers report (None: absent or unreadable)."""
    return _remaining(headers, "requests"), _remaining(headers, "tokens")


def parse_rate_limits(headers: Mapping[str, str]) -> RateLimitHint | None:
    """The room a response's headers report, or None when they carry no readable rate-limit header.

    ``headers`` must be case-insensitive (``httpx.Headers`` is). When requests or tokens are exhausted
    the hint's ``no_room_for`` is the longest of the matching resets (1 s when a reset is missing or
    unreadable), clamped to `MAX_RESET`.
    """
    waits: list[float] = []
    seen = False
    for name in ("requests", "tokens"):
        remaining = _remaining(headers, name)
        if remaining is None:
            continue
        seen = True
        if remaining <= 0:
            reset = parse_duration(headers.get(f"x-ratelimit-reset-{name}", ""))
            waits.append(1.0 if reset is None else reset)
    if not seen:
        return None
    return RateLimitHint(no_room_for=min(MAX_RESET, max(waits, default=0.0)))
