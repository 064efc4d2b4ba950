"""A scripted engine for admission tests: its time to first token grows with the requests it holds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import httpx

from tests.virtual import _sse


@dataclass
class QueueingReplica(httpx.AsyncBaseTransport):
    """Serves ``slots`` requests at a time; each one past them waits ``per_queued`` s more for its first token
    (a waiting queue, as an engine without admission builds). ``overloaded`` answers 429 instead."""

    name: str
    slots: int = 8
    base_ttft: float = 0.05
    per_queued: float = 0.1
    tokens: int = 5
    gap: float = 0.05
    overloaded: bool = False
    held: int = 0
    arrivals: list[str] = field(default_factory=list)
    """The tier header of each request, in the order they arrived."""
    slo_ttft_ms: list[str] = field(default_factory=list)
    """The ``x-slo-ttft-ms`` header of each request ("" when absent)."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.arrivals.append(request.headers.get("x-test-tier", ""))
        self.slo_ttft_ms.append(request.headers.get("x-slo-ttft-ms", ""))
        if self.overloaded:
            return httpx.Response(429, json={"error": {"message": "overloaded"}})
        ttft = self.base_ttft + self.per_queued * max(0, self.held - self.slots)
        self.held += 1
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Stream(self, ttft))


class _Stream(httpx.AsyncByteStream):
    def __init__(self, replica: QueueingReplica, ttft: float) -> None:
        self.replica, self.ttft, self.done = replica, ttft, False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        base = {"id": "c", "model": "m"}
        await anyio.sleep(self.ttft)
        for i in range(self.replica.tokens):
            if i:
                await anyio.sleep(self.replica.gap)
            yield _sse({**base, "choices": [{"index": 0, "delta": {"content": f"t{i} "}}]})
        yield _sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        yield b"data: [DONE]\n\n"

    async def aclose(self) -> None:
        if not self.done:
            self.done = True
            self.replica.held -= 1
