"""What the caller's SDK asked of a call, read from its request: the most attempts, the read timeout, and
the retry count each attempt reports back.

- ``x-llmguard-max-attempts: N`` (else the tier's ``max_attempts``, else the retry policy's): the most
  requests the call sends.
- The SDK's ``timeout=`` reaches the transport as ``request.extensions["timeout"]``, and each attempt's request
  carries it to the replica's pool: its read timeout bounds each read, as without a guard (a keep-alive event
  before the first token restarts it; a wait for a server's Retry-After between attempts is no read). One that
  ends a read before the first token is the SDK's to retry (the guard does not). After the first token the
  tier's ``stall`` is capped by it, never raised (`within_read_timeout`). Its pool timeout (how long a request
  may wait for a free connection) bounds each wait of the guard's own before an attempt is sent (`pool_timeout`).
- ``x-stainless-retry-count`` (sent by the openai and anthropic SDKs, read by servers and proxies):
  the guard's n-th attempt of a call reports the SDK's count plus n (`with_retry_count`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import httpx

from llmguard_client._core.headers import MAX_ATTEMPTS_HEADER
from llmguard_client.config import MAX_ATTEMPTS, Tier
from llmguard_client.errors import GuardRequestError

RETRY_COUNT_HEADER = b"x-stainless-retry-count"


def max_attempts(header: str | None, tier: Tier, request: httpx.Request) -> int | None:
    """The most attempts of this call: its header's, else its tier's, else None (the retry policy's)."""
    if header is None:
        return tier.max_attempts
    try:
        value = int(header.strip())
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_ATTEMPTS:
        raise GuardRequestError(
            f"{MAX_ATTEMPTS_HEADER} must be an integer from 1 to {MAX_ATTEMPTS}, got {header!r}", request=request
        )
    return value


def check_timeouts(request: httpx.Request) -> None:
    """Refuse, before anything is sent, a ``timeout=`` that no request could meet or that means nothing: a
    negative or NaN value, or 0 for a connect, read or write (a ``pool`` of 0 means "no waiting for a
    connection", which httpx honours)."""
    timeout = request.extensions.get("timeout")
    if not isinstance(timeout, Mapping):
        return
    for name in ("connect", "read", "write", "pool"):
        value = timeout.get(name)
        if value is None:
            continue
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if not number or math.isnan(value) or value < 0 or (value == 0 and name != "pool"):
            raise GuardRequestError(
                f"the request's {name} timeout must be a number of seconds above 0 (or None: no limit), got "
                f"{value!r}; nothing was sent",
                request=request,
            )


def read_timeout(extensions: Mapping[str, Any]) -> float | None:
    """The SDK's read timeout for this call (``timeout=``, per client or per call), None if it set none."""
    timeout = extensions.get("timeout")
    read = timeout.get("read") if isinstance(timeout, Mapping) else None
    if isinstance(read, bool) or not isinstance(read, (int, float)) or not 0 < read < math.inf:
        return None
    return float(read)


def pool_timeout(extensions: Mapping[str, Any]) -> float:
    """The SDK's pool timeout for this call (how long it lets a request wait for a free connection): the longest
    the guard holds an attempt before sending it (`Call.pool_wait`); inf if it set none."""
    timeout = extensions.get("timeout")
    pool = timeout.get("pool") if isinstance(timeout, Mapping) else None
    if isinstance(pool, bool) or not isinstance(pool, (int, float)) or not 0 <= pool < math.inf:
        return math.inf
    return float(pool)


def with_retry_count(headers: list[tuple[bytes, bytes]], index: int) -> list[tuple[bytes, bytes]]:
    """``headers`` with the SDK's ``x-stainless-retry-count`` raised by ``index`` (the attempt's number in
    the call); unchanged when the caller sent none (an SDK told to omit it, or a plain HTTP client)."""
    out = []
    for key, value in headers:
        if key.lower() == RETRY_COUNT_HEADER:
            with contextlib.suppress(ValueError):
                value = str(int(value) + index).encode()
        out.append((key, value))
    return out


def within_read_timeout(tier: Tier, extensions: Mapping[str, Any]) -> Tier:
    """``tier`` with its ``stall`` capped by the SDK's read timeout for this call, if it set one (its ``ttft`` is
    the tier's: before the first token the read timeout bounds each read, in the replica's pool)."""
    read = read_timeout(extensions)
    if read is None:
        return tier
    return _capped(tier, read)


@functools.lru_cache(maxsize=256)
def _capped(tier: Tier, read: float) -> Tier:
    stall = min(read, tier.total) if tier.stall is None else min(tier.stall, read)  # a Tier's stall <= total
    if stall == tier.stall:
        return tier
    return dataclasses.replace(tier, stall=stall)
