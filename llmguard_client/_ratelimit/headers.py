"""Rate-limit headers of hosted APIs: how much room a replica says it has left, and until when.

Four forms are read, from any answer (a 200 or a 429), case-insensitively:

- OpenAI's (and the APIs that copy it: Azure OpenAI, Groq, ...)::

      x-ratelimit-remaining-requests: 59        x-ratelimit-reset-requests: 1s
      x-ratelimit-remaining-tokens: 0           x-ratelimit-reset-tokens: 6m0s

  a reset is a Go-style duration (``1h2m3.5s``, ``6m0s``, ``20ms``) or a plain number of seconds; the same with
  a window after the kind (Mistral's ``x-ratelimit-remaining-req-minute``, Cerebras'
  ``x-ratelimit-remaining-requests-day``): any ``x-ratelimit-remaining-<what>`` with its
  ``x-ratelimit-reset-<what>``, feeding the bucket when it counts requests or tokens per minute;
- Anthropic's: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{remaining,reset}``, a reset
  being an RFC 3339 timestamp (``2026-01-01T00:00:30Z``), read against the answer's ``Date`` (the server's
  clock; the local clock without one);
- the unsuffixed ``x-ratelimit-remaining`` (requests) with ``x-ratelimit-reset`` (Together, OpenRouter, ...):
  seconds, or a Unix time in seconds or milliseconds (a number past 10^9 or 10^11);
- the IETF draft's: ``RateLimit: "default";r=50;t=30`` (each item's remaining ``r`` and seconds to reset ``t``)
  and its earlier ``RateLimit-Remaining`` / ``RateLimit-Reset``, in units it does not name (judged, not fed to a
  bucket).

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
from collections.abc import Mapping
from dataclasses import dataclass

from llmguard_client._http.retry_after import answer_time

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
_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "ratelimit")
_REMAINING = "x-ratelimit-remaining"
_IETF_FIELD = "ratelimit"
_IETF_ITEM = re.compile(r'\s*(?:"[^"]*"|[A-Za-z*][\w*.:/%-]*)((?:\s*;\s*[a-z*][a-z0-9_.*-]*(?:=[^;,]*)?)*)\s*')
_IETF_PARAM = re.compile(r"\s*;\s*([a-z*][a-z0-9_.*-]*)(?:=([^;,]*))?")


@dataclass(frozen=True, slots=True)
class _Limit:
    """One limit an answer reports: the count left, its reset as sent (None: none sent), and what it counts."""

    counts: str  # "requests", "tokens" (the bucket's two dimensions, per minute) or "other" (judged only)
    left: int
    reset: str | None


_ANTHROPIC = (  # (what, counts): Anthropic's "tokens" is the most restrictive of its token limits in effect
    ("requests", "requests"),
    ("tokens", "tokens"),
    ("input-tokens", "other"),
    ("output-tokens", "other"),
)


def _kind(what: str) -> str:
    """What an ``x-ratelimit-remaining-<what>`` counts, for the bucket: requests or tokens per minute (OpenAI's
    unsuffixed windows are a minute's), else "other"."""
    if not what:
        return "requests"  # the unsuffixed form (Together, OpenRouter)
    kind, _, window = what.partition("-")
    if window not in ("", "minute"):
        return "other"
    return {"requests": "requests", "req": "requests", "tokens": "tokens"}.get(kind, "other")


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


def _ietf_items(text: str) -> list[tuple[str, str]]:
    """``(r, t)`` of each readable item of an IETF ``RateLimit`` field (a list of ``"name";r=..;t=..``)."""
    items: list[tuple[str, str]] = []
    for part in text.split(","):
        match = _IETF_ITEM.fullmatch(part)
        if match is None:
            continue
        params = {name: (value or "").strip() for name, value in _IETF_PARAM.findall(match.group(1))}
        if "r" in params:
            items.append((params["r"], params.get("t", "")))
    return items


def _limits(found: Mapping[str, str]) -> list[_Limit]:
    """Each limit the answer reports readably, with its count left."""
    raw: list[tuple[str, str, str | None]] = []  # (counts, remaining as sent, reset as sent)
    for key, value in found.items():
        if key == _REMAINING or key.startswith(_REMAINING + "-"):
            what = key[len(_REMAINING) + 1 :]
            raw.append((_kind(what), value, found.get("x-ratelimit-reset" + key[len(_REMAINING) :])))
    for what, counts in _ANTHROPIC:
        if (left := found.get(f"anthropic-ratelimit-{what}-remaining")) is not None:
            raw.append((counts, left, found.get(f"anthropic-ratelimit-{what}-reset")))
    if "ratelimit-remaining" in found:
        raw.append(("other", found["ratelimit-remaining"], found.get("ratelimit-reset")))
    raw.extend(("other", left, reset or None) for left, reset in _ietf_items(found.get(_IETF_FIELD, "")))
    limits: list[_Limit] = []
    for counts, remaining, reset in raw:
        count = _count(remaining)
        if count is not None:
            limits.append(_Limit(counts, count, reset))
    return limits


def remaining_room(headers: Mapping[str, str]) -> tuple[int | None, int | None]:
    """``(requests, tokens)`` left as the answer's rate-limit headers report them, the least where several
    report one (None: absent or unreadable)."""
    limits = _limits(_rate_limit_headers(headers))
    requests = [limit.left for limit in limits if limit.counts == "requests"]
    tokens = [limit.left for limit in limits if limit.counts == "tokens"]
    return min(requests, default=None), min(tokens, default=None)


def room_left(headers: Mapping[str, str]) -> bool | None:
    """True when the answer's rate-limit headers report room left in every limit they report (a 429 carrying
    them refused that request for its own size, not the endpoint for every caller); False when one reports
    none left; None when none is readable."""
    limits = _limits(_rate_limit_headers(headers))
    if not limits:
        return None
    return all(limit.left > 0 for limit in limits)


def parse_rate_limits(headers: Mapping[str, str]) -> RateLimitHint | None:
    """The room a response's headers report, or None when they carry no readable rate-limit header.

    When a limit is exhausted the hint's ``no_room_for`` is the longest of the matching resets (1 s when a
    reset is missing or unreadable), clamped to `MAX_RESET`.
    """
    found = _rate_limit_headers(headers)
    limits = _limits(found)
    if not limits:
        return None
    waits: list[float] = []
    now_wall: float | None = None
    for limit in limits:
        if limit.left > 0:
            continue
        if limit.reset is not None and now_wall is None:
            now_wall = answer_time(found)
        reset = None if limit.reset is None or now_wall is None else _reset(limit.reset, now_wall)
        waits.append(1.0 if reset is None else reset)
    return RateLimitHint(no_room_for=min(MAX_RESET, max(waits, default=0.0)))
