"""Per-chunk cost of the guard on a flowing stream: plain httpx vs guarded, same server, same run.

The server (a loopback test server in a thread) streams N SSE content chunks as fast as it can; the client
reads them all. Reported: client CPU seconds per chunk (time.process_time covers both threads, so the
server's share is the same in both rows and the difference is the guard's), and the ratio guarded/plain.

    python -m benchmarks.stream_overhead [--chunks 5000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio
import httpx

from llmguard_client import Guard, Tier
from tests.loopback import LoopbackServer, Script

BODY = {"model": "m", "messages": [], "stream": True}


async def read_all(client: httpx.AsyncClient, url: str) -> int:
    async with client.stream("POST", url + "/v1/chat/completions", json=BODY) as response:
        return sum([1 async for _ in response.aiter_raw()])


async def main(chunks: int, rounds: int) -> None:
    server = LoopbackServer("bench")
    server.start()
    server.script = Script(tokens=chunks)
    guard = Guard(replicas=[server.url], tiers={"t": Tier(ttft=10, total=600, stall=10)}, instrumentation=None)
    plain = httpx.AsyncClient(timeout=None)
    guarded = guard.http_client()
    samples: dict[str, list[float]] = {"plain": [], "guarded": []}
    for _ in range(rounds):
        for name, client in (("plain", plain), ("guarded", guarded)):
            cpu = time.process_time()
            await read_all(client, server.url)
            samples[name].append((time.process_time() - cpu) / chunks * 1e6)
    await plain.aclose()
    await guard.aclose()
    server.stop()
    p, g = statistics.median(samples["plain"]), statistics.median(samples["guarded"])
    print(f"chunks per stream: {chunks}, rounds: {rounds} (median of rounds)")
    print("| client | CPU µs per chunk (server + client) |")
    print("|---|---|")
    print(f"| plain httpx | {p:.1f} |")
    print(f"| guarded | {g:.1f} |")
    print(f"| guarded / plain | {g / p:.2f}x (guard adds {g - p:.1f} µs per chunk) |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    anyio.run(main, args.chunks, args.rounds)
