"""Parse server-directed retry delays (``retry-after-ms`` / ``Retry-After``) into seconds."""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Mapping
from datetime import timezone

__all__ = ["RETRY_AFTER_CAP", "answer_time", "http_date", "parse_retry_after"]

RETRY_AFTER_CAP: float = 300.0
"""Largest delay, in seconds, :func:`parse_retry_after` will ever return.

A buggy or hostile server must not be able to park a replica (and the retry budget held for it)
for hours with ``Retry-After: 86400``. Larger values are clamped to this cap rather than rejected,
so the caller still backs off for a long time instead of retrying immediately. For comparison, the
openai SDK refuses to retry at all when the server asks for more than 120 s.
"""

# RFC 9110 delay-seconds is 1*DIGIT; like the openai SDK we also accept fractional and exponent
# forms. ASCII digits only: ``float()`` alone would accept "inf", "nan", "1_000" and non-ASCII digits.
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _get(headers: Mapping[str, str], name: str) -> str | None:
    """Return the first value whose header name equals ``name`` (lower-case) case-insensitively."""
    value = headers.get(name)  # fast path; exact for case-insensitive mappings such as httpx.Headers
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    return value if isinstance(value, str) else None


def _milliseconds(value: str) -> tuple[bool, float | None]:
    """``retry-after-ms`` as both SDKs read it, with Python's ``float`` ("1_000", "inf", "nan", "-5" too): whether it
    is a number, and the delay it gives in seconds (`_number`'s reading of a plain one), None for a number that is
    none (negative, not finite)."""
    numeric, seconds = _number(value, 1000.0)
    if numeric:
        return True, seconds
    try:
        number = float(value)
    except ValueError:
        return False, None
    return True, min(number / 1000.0, RETRY_AFTER_CAP) + 0.0 if math.isfinite(number) and number >= 0 else None


def _number(value: str, scale: float) -> tuple[bool, float | None]:
    """Parse a numeric delay. Returns ``(looked_numeric, seconds_or_None_if_ignored)``."""
    text = value.strip()
    if _NUMBER.fullmatch(text) is None:
        return False, None
    number = float(text)  # cannot raise after the regex; overflow such as "1e999" yields inf
    if number < 0:  # also catches "-1e999" -> -inf
        return True, None
    # +inf here can only come from numeric overflow (literal "inf" fails the regex): the server asked
    # for an excessive delay, which is clamped like any other huge value.
    return True, min(number / scale, RETRY_AFTER_CAP) + 0.0  # "+ 0.0" turns -0.0 into 0.0


def http_date(value: str) -> float | None:
    """The Unix time of an HTTP-date (``Retry-After``, ``Date``), or None if it is not one."""
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" or no zone: HTTP-dates are always GMT, never local time
        when = when.replace(tzinfo=timezone.utc)
    try:
        return when.timestamp()
    except (OverflowError, OSError, ValueError):
        return None


def answer_time(headers: Mapping[str, str]) -> float:
    """The answer's own time, its ``Date`` (the clock the server's dates are on, whatever this host's clock says),
    else the local wall clock."""
    date = _get(headers, "date")
    when = None if date is None else http_date(date)
    return time.time() if when is None else when


def _http_date(value: str, now: float) -> float | None:
    """Seconds from ``now`` until an HTTP-date (0.0 if past, capped), or None if not a date."""
    when = http_date(value)
    if when is None or math.isnan(delay := when - now):
        return None
    return min(max(delay, 0.0), RETRY_AFTER_CAP)


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Return how many seconds the server asked us to wait before retrying, or None.

    Header names are matched case-insensitively (also for plain dicts). Forms are tried in order:

    1. ``retry-after-ms``: milliseconds, fractional allowed (OpenAI/Azure extension). As in the openai
       and anthropic SDKs, a value that is a number ends the reading even when it is no delay
       (negative, ``nan``, ``inf``: None, where both SDKs use their own backoff); an empty or
       garbage one is ignored and the next form is tried;
    2. ``Retry-After`` as seconds, fractional allowed (negative, ``nan`` or ``inf``: None);
    3. ``Retry-After`` as an HTTP-date, relative to ``now`` (wall-clock epoch seconds; by default the
       answer's own ``Date``, so that a host whose clock is off by minutes waits what the server asked,
       else ``time.time()``: `answer_time`); a date in the past yields ``0.0``.

    Results are clamped to ``[0, RETRY_AFTER_CAP]`` (see :data:`RETRY_AFTER_CAP` for why). A number
    too large for a float (``"1e999"``) is read as an excessive delay and clamped, not ignored.
    ``None`` means "no usable hint: use your own backoff". Duplicated headers that a client joined
    with commas (``"5, 6"``) are not a valid form and are ignored.

    ``headers`` is a response's headers (``httpx.Headers``, a dict, any mapping with ``get`` and
    ``items``); anything else, a header's value or None included, is a ``TypeError``.
    """
    if not (callable(getattr(headers, "get", None)) and callable(getattr(headers, "items", None))):
        raise TypeError(
            "parse_retry_after takes a response's headers (httpx.Headers, a dict or another mapping of header "
            f"names to values, e.g. response.headers), got {type(headers).__name__}: {headers!r}"
        )
    if now is not None and not math.isfinite(now):
        raise ValueError(f"now must be finite wall-clock epoch seconds, got {now!r}")

    ms = _get(headers, "retry-after-ms")
    if ms is not None:
        numeric, seconds = _milliseconds(ms)
        if numeric:  # a number, a delay or not, ends the reading as it does in both SDKs
            return seconds

    value = _get(headers, "retry-after")
    if value is None:
        return None
    numeric, seconds = _number(value, 1.0)
    if numeric:  # a number, valid or not, is never an HTTP-date
        return seconds
    return _http_date(value, answer_time(headers) if now is None else now)
