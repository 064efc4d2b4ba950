"""Rate-limit headers of hosted APIs: how much room a replica says it has left, and until when.

Three forms are read, from any answer (a 200 or a 429), case-insensitively:

- OpenAI's (and the APIs that copy it: Azure OpenAI, Groq, ...)::

      x-ratelimit-remaining-requests: 59        x-ratelimit-reset-requests: 1s
      x-ratelimit-remaining-tokens: 0           x-ratelimit-reset-tokens: 6m0s

  a reset is a Go-style duration (``1h2m3.5s``, ``6m0s``, ``20ms``) or a plain number of seconds;
- Anthropic's: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{remaining,reset}``, a reset
  being an RFC 3339 timestamp (``2026-01-01T00:00:30Z``), read against the answer's ``Date`` (the server's
  clock; the local clock without one);
- the unsuffixed ``x-ratelimit-remaining`` (requests) with ``x-ratelimit-reset`` (Together, OpenRouter, ...):
  seconds, or a Unix time in seconds or milliseconds (a number past 10^9 or 10^11).

A header sent twice (httpx joins the values: ``"5, 5"``) counts its least remaining and its latest reset.
A replica whose remaining requests or tokens reached 0 has no room until the matching reset: the router ranks it
after every replica with room (it is not refused outright: with every replica out of room the call still
goes somewhere, and the server's 429 and Retry-After take over). Headers that are absent or unreadable
tell nothing; they never raise.
"""

from __future__ import annotations

import calendar
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from llmguard_client._http.retry_after import http_date

__all__ = ["RateLimitHint", "parse_duration", "parse_rate_limits", "remaining_room", "room_left"]

_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)")
_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?(?:([Zz])|([+-])(\d{2}):(\d{2}))")
MAX_RESET = 3600.0
"""Longest reset believed (seconds): a longer one is clamped, so a bad header cannot shun a replica for days."""
_EPOCH_SECONDS = 1e9
"""A numeric reset past this is a Unix time in seconds (2001 on), not seconds to wait."""
_EPOCH_MILLISECONDS = 1e11
"""A numeric reset past this is a Unix time in milliseconds."""
_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")


@dataclass(frozen=True, slots=True)
class _Dimension:
    """One limit a provider reports: its remaining-count header, its reset header, and what it counts."""

    remaining: str
    reset: str
    counts: str  # "requests", "tokens" (the bucket's two dimensions) or "other" (judged, not fed to a bucket)


_DIMENSIONS = (
    _Dimension("x-ratelimit-remaining-requests", "x-ratelimit-reset-requests", "requests"),
    _Dimension("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens", "tokens"),
    _Dimension("anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset", "requests"),
    # Anthropic's "tokens" report the most restrictive of its token limits in effect: the bucket's tokens.
    _Dimension("anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset", "tokens"),
    _Dimension("anthropic-ratelimit-input-tokens-remaining", "anthropic-ratelimit-input-tokens-reset", "other"),
    _Dimension("anthropic-ratelimit-output-tokens-remaining", "anthropic-ratelimit-output-tokens-reset", "other"),
    _Dimension("x-ratelimit-remaining", "x-ratelimit-reset", "requests"),
)


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


def _rate_limit_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The answer's rate-limit headers (and its ``Date``), names lower-cased; one pass over the headers."""
    found: dict[str, str] = {}
    for name, value in headers.items():
        key = name.lower()
        if key.startswith(_PREFIXES) or key == "date":
            found[key] = f"{found[key]}, {value}" if key in found else value
    return found


def _count(text: str) -> int | None:
    """The least readable count in a (possibly repeated, comma-joined) remaining header; None if none is."""
    counts: list[int] = []
    for part in text.split(","):
        try:
            value = float(part.strip())
        except ValueError:
            continue
        if math.isfinite(value):
            counts.append(int(value))
    return min(counts, default=None)


def _timestamp(text: str) -> float | None:
    """The Unix time of an RFC 3339 timestamp, or None."""
    match = _RFC3339.fullmatch(text.strip())
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 60):
        return None
    base = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    fraction = float(match.group(7)) if match.group(7) else 0.0
    offset = 0.0
    if match.group(8) is None:
        offset = (int(match.group(10)) * 3600 + int(match.group(11)) * 60) * (1 if match.group(9) == "+" else -1)
    return base + fraction - offset


def _reset_part(text: str, now_wall: float) -> float | None:
    seconds = parse_duration(text)
    if seconds is not None:
        if seconds > _EPOCH_MILLISECONDS:
            return max(0.0, seconds / 1000.0 - now_wall)
        if seconds > _EPOCH_SECONDS:
            return max(0.0, seconds - now_wall)
        return seconds
    at = _timestamp(text)
    return None if at is None else max(0.0, at - now_wall)


def _reset(text: str, now_wall: float) -> float | None:
    """Seconds until a reset header's (latest) reset, or None when no part of it is readable."""
    waits = [wait for part in text.split(",") if (wait := _reset_part(part, now_wall)) is not None]
    return max(waits, default=None)


def _now_wall(found: Mapping[str, str]) -> float:
    """The answer's own time (its ``Date``: the clock its reset timestamps are on), else the local clock."""
    date = found.get("date")
    when = None if date is None else http_date(date)
    return time.time() if when is None else when


def _remaining(found: Mapping[str, str]) -> list[tuple[_Dimension, int]]:
    """Each dimension the answer reports readably, with its count left."""
    read: list[tuple[_Dimension, int]] = []
    for dimension in _DIMENSIONS:
        raw = found.get(dimension.remaining)
        count = None if raw is None else _count(raw)
        if count is not None:
            read.append((dimension, count))
    return read


def remaining_room(headers: Mapping[str, str]) -> tuple[int | None, int | None]:
    """``(requests, tokens)`` left as the answer's rate-limit headers report them, the least where several
    report one (None: absent or unreadable)."""
    read = _remaining(_rate_limit_headers(headers))
    requests = [count for dimension, count in read if dimension.counts == "requests"]
    tokens = [count for dimension, count in read if dimension.counts == "tokens"]
    return min(requests, default=None), min(tokens, default=None)


def room_left(headers: Mapping[str, str]) -> bool | None:
    """True when the answer's rate-limit headers report room left in every limit they report (a 429 carrying
    them refused that request for its own size, not the endpoint for every caller); False when one reports
    none left; None when none is readable."""
    read = _remaining(_rate_limit_headers(headers))
    if not read:
        return None
    return all(count > 0 for _, count in read)


def parse_rate_limits(headers: Mapping[str, str]) -> RateLimitHint | None:
    """The room a response's headers report, or None when they carry no readable rate-limit header.

    When a limit is exhausted the hint's ``no_room_for`` is the longest of the matching resets (1 s when a
    reset is missing or unreadable), clamped to `MAX_RESET`.
    """
    found = _rate_limit_headers(headers)
    read = _remaining(found)
    if not read:
        return None
    waits: list[float] = []
    now_wall: float | None = None
    for dimension, count in read:
        if count > 0:
            continue
        raw = found.get(dimension.reset)
        if raw is not None and now_wall is None:
            now_wall = _now_wall(found)
        reset = None if raw is None or now_wall is None else _reset(raw, now_wall)
        waits.append(1.0 if reset is None else reset)
    return RateLimitHint(no_room_for=min(MAX_RESET, max(waits, default=0.0)))
