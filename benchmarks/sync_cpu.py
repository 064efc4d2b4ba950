"""CPU per call of the sync edge vs the async one, plain vs guarded, on one loopback server.

    python -m benchmarks.sync_cpu [--calls 300] [--concurrency 16] [--tokens 20]

openai 3.x streamed calls (``--tokens`` content chunks each), ``--concurrency`` at a time: threads for the
sync clients, tasks for the async ones. Reported: process CPU milliseconds per call (the in-process server's
share is the same in every row) and wall seconds.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import httpx2
import openai

from llmguard_client import Guard, Tier
from tests.loopback import LoopbackServer, Script

MESSAGES: Any = [{"role": "user", "content": "hi"}]
TIERS = {"t": Tier(ttft=5.0, total=30.0, stall=5.0)}


def run_sync(url: str, http: httpx2.Client, calls: int, concurrency: int) -> tuple[float, float]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="k", http_client=http)

    def one(_: int) -> None:
        for _chunk in client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
            pass

    cpu, wall = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(calls)))
    return (time.process_time() - cpu) / calls * 1000, time.perf_counter() - wall


async def run_async(url: str, http: httpx2.AsyncClient, calls: int, concurrency: int) -> tuple[float, float]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", http_client=http)
    limiter = anyio.CapacityLimiter(concurrency)

    async def one() -> None:
        async with limiter:
            async for _chunk in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
                pass

    cpu, wall = time.process_time(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(calls):
            tg.start_soon(one)
    return (time.process_time() - cpu) / calls * 1000, time.perf_counter() - wall


async def guarded_async(url: str, calls: int, concurrency: int) -> tuple[float, float]:
    async with Guard([url], tiers=TIERS, instrumentation=None) as guard:
        return await run_async(url, guard.httpx2_client(), calls, concurrency)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=20)
    args = parser.parse_args()
    server = LoopbackServer("bench")
    server.start()
    server.script = Script(tokens=args.tokens)
    n, c = args.calls, args.concurrency
    try:
        rows = [("sync plain", run_sync(server.url, httpx2.Client(), n, c))]
        with Guard([server.url], tiers=TIERS, instrumentation=None) as guard:
            rows.append(("sync guarded", run_sync(server.url, guard.sync_httpx2_client(), n, c)))
        rows.append(("async plain", anyio.run(run_async, server.url, httpx2.AsyncClient(), n, c)))
        rows.append(("async guarded", anyio.run(guarded_async, server.url, n, c)))
    finally:
        server.stop()
    print(f"{n} streamed calls of {args.tokens} chunks, {c} at a time")
    print("| client | CPU per call | wall |")
    print("| --- | ---: | ---: |")
    for name, (cpu, wall) in rows:
        print(f"| {name} | {cpu:.1f} ms | {wall:.1f} s |")


if __name__ == "__main__":
    main()
