"""A minimal fleet store over ``redis.asyncio`` satisfying `llmguard_client._ratelimit.buckets.FleetOps`: what the
rate limiter is tested against until the real store (``llmguard_client._fleet``) is wired in."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import redis.asyncio as redis

T = TypeVar("T")


class RedisFleetOps:
    """Keys under ``llmguard:{name}:``; every operation bounded by ``timeout``, failing open to its default."""

    def __init__(self, url: str, name: str = "test", timeout: float = 0.2) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self.name = name
        self.timeout = timeout
        self.failures = 0

    def key(self, *parts: str) -> str:
        return f"llmguard:{self.name}:" + ":".join(parts)

    @property
    def available(self) -> bool:
        return True

    async def run(self, op: Callable[[Any], Awaitable[T]], default: T) -> T:
        try:
            with anyio.fail_after(self.timeout):
                return await op(self.client)
        except Exception:
            self.failures += 1
            return default

    async def aclose(self) -> None:
        await self.client.aclose()
