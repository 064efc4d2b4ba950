"""A minimal fleet store over ``redis.asyncio`` for ``llmguard bench --processes N --fleet URL``: it satisfies
`llmguard_client._state.rate_limit.FleetOps` (keys under ``llmguard:{name}:``, every operation bounded by a
timeout, the default on any failure)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


class BenchFleetOps:
    def __init__(self, url: str, name: str = "bench", timeout: float = 0.25) -> None:
        import redis.asyncio as redis

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
