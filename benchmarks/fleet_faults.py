"""Redis killed, paused and restarted under a Guard with ``fleet=``: the latency it adds to calls, and how soon
the fleet resyncs, against a fleet-less Guard making the same calls interleaved in the same run.

One loopback replica pair in separate processes, a private ``redis-server``; the two Guards alternate calls
(streamed, 16 tokens) through phases: steady, Redis killed (SIGKILL), restarted, paused (SIGSTOP), resumed.
For each phase: calls, failures, p50 / p99 / max latency per Guard. For each return: seconds from the server
being back to ``snapshot().fleet.connected``.

    python -m benchmarks.fleet_faults [--phase 3.0]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import anyio
import httpx

from benchmarks.cpu_per_call import start_server
from llmguard_client import Guard, Tier
from tests.redis_server import RedisServer

BODY = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 16}


async def timed(client: httpx.AsyncClient, url: str) -> tuple[float, bool]:
    start = time.monotonic()
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=BODY) as response:
            await response.aread()
            ok = response.status_code == 200
    except httpx.HTTPError:
        ok = False
    return time.monotonic() - start, ok


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(phase: float) -> None:
    (p1, url1), (p2, url2) = start_server(16), start_server(16)
    store = RedisServer()
    store.start()
    tiers = {"i": Tier(ttft=10, total=60, stall=10)}
    fleet = Guard([url1, url2], tiers=tiers, fleet=store.url, name="bench")
    local = Guard([url1, url2], tiers=tiers)
    rows: list[str] = []
    resyncs: list[str] = []
    try:
        async with fleet, local, fleet.http_client() as fc, local.http_client() as lc:
            for _ in range(50):
                await timed(fc, url1)
                await timed(lc, url1)

            def state() -> str:
                snap = fleet.snapshot().fleet
                assert snap is not None
                return snap.state

            async def run(name: str) -> None:
                results: dict[str, list[tuple[float, bool]]] = {"local": [], "fleet": []}
                end = time.monotonic() + phase
                while time.monotonic() < end:
                    results["fleet"].append(await timed(fc, url1))
                    results["local"].append(await timed(lc, url1))
                for who, got in results.items():
                    lat = [t * 1000 for t, _ in got]
                    failed = sum(1 for _, ok in got if not ok)
                    rows.append(
                        f"| {name} | {who} | {len(got)} | {failed} | {statistics.median(lat):.1f} | "
                        f"{quantile(lat, 0.99):.1f} | {max(lat):.1f} |"
                    )

            async def back(name: str, repair: Callable[[], None]) -> None:
                repair()
                start = time.monotonic()
                while state() != "connected":  # noqa: ASYNC110 (polled state has no event)
                    await anyio.sleep(0.005)
                resyncs.append(f"{name}: connected and resynced {time.monotonic() - start:.2f} s after Redis returned")

            assert state() == "connected"
            await run("steady")
            store.stop()
            await run("killed")
            await back("restart", store.start)
            await run("restarted")
            store.pause()
            await run("paused")
            await back("resume", store.resume)
            await run("resumed")
            snap = fleet.snapshot().fleet
    finally:
        store.stop()
        p1.terminate()
        p2.terminate()
    print("| phase | guard | calls | failed | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n".join(resyncs))
    print(f"fleet snapshot at the end: {snap}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", type=float, default=3.0, help="seconds per phase")
    anyio.run(main, parser.parse_args().phase)
