"""How long an openai SDK call takes to fail after ``Guard.aclose()``, and how many attempts it makes.

The SDK (default ``max_retries=2``) retries a connection error with backoff; a closed Guard answers with a
non-retryable failure instead, so the call fails at once, after one attempt. One loopback server, a Guard per run:

    python -m benchmarks.after_close [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx2
import openai

from llmguard_client import Guard, guard_failure
from llmguard_client.edges.httpx2_async import Httpx2GuardTransport
from tests.loopback import LoopbackServer, stop_all

MESSAGES = [{"role": "user", "content": "hi"}]


class CountingTransport(httpx2.AsyncBaseTransport):
    """Counts the requests the SDK hands to the guard (each SDK attempt is one)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner, self.attempts = inner, 0

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.attempts += 1
        return await self.inner.handle_async_request(request)


async def main(runs: int = 5) -> None:
    server = LoopbackServer("s")
    server.start()
    try:
        for i in range(runs):
            guard = Guard([server.url], instrumentation=None)
            counting = CountingTransport(Httpx2GuardTransport(guard.transport))
            async with httpx2.AsyncClient(transport=counting) as http:
                client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", http_client=http)
                await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
                await guard.aclose()
                before, started = counting.attempts, time.perf_counter()
                try:
                    await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
                except openai.APIError as exc:
                    elapsed = time.perf_counter() - started
                    print(
                        f"run {i}: failed after {elapsed * 1000:.1f} ms, {counting.attempts - before} attempt(s), "
                        f"{type(exc).__name__}, guard_failure={guard_failure(exc)!r}"
                    )
    finally:
        stop_all([server])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="Guards closed, one call after each (default 5)")
    asyncio.run(main(parser.parse_args().runs))
