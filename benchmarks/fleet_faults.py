"""Redis killed, paused and restarted under a Guard with ``fleet=``: the latency it adds to calls, and how soon
the fleet resyncs, against a fleet-less Guard making the same calls interleaved in the same run.

One loopback replica pair in separate processes, a private ``redis-server``; the two Guards alternate calls
(streamed, 16 tokens) through phases: steady, Redis killed (SIGKILL), restarted, paused (SIGSTOP), resumed.
For each phase: calls, failures, p50 / p99 / max latency per Guard. For each return: seconds from the server
being back to ``snapshot().fleet.connected``.

With ``--rate-limit`` both Guards get a `RateLimit` far above what the run sends (it never binds), so each fleet
call asks Redis (one script call per attempt) and the local Guard's asks its own bucket. A second table gives,
per phase, the extra wait Redis can cause: each fleet admission's own duration (its longest, how many took at
least the store's 50 ms operation timeout) and the fleet call's latency minus its paired local call's, checked
against the bound of the operation timeout + 5 ms, beside the longest stall of the event loop itself in the
phase (a loaded machine delays every await, the timeout's own wake-up included), and the longest admission
less the event-loop stalls within it: the part Redis can be blamed for, which the verdict checks.

    python -m benchmarks.fleet_faults [--phase 3.0] [--rate-limit]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import anyio
import httpx

from benchmarks.cpu_per_call import start_server
from llmguard_client import Guard, RateLimit, Tier
from llmguard_client._ratelimit.buckets import Grant
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


OP_TIMEOUT_MS = 50.0
"""The fleet store's operation timeout (`FleetStore.op_timeout`); the bound is this + 5 ms."""
NEVER_BINDS = RateLimit(requests_per_minute=6_000_000, tokens_per_minute=6_000_000_000)


def timed_admissions(guard: Guard) -> list[tuple[float, float]]:
    """Record when each of ``guard``'s rate-limit admissions started and ended (monotonic seconds), in order."""
    durations: list[tuple[float, float]] = []
    limiter = guard.rate_limiter
    if limiter is None:
        return durations
    admit = limiter.admit

    async def timed(replica: str, tokens: float, max_wait: float) -> Grant:
        start = time.monotonic()
        try:
            return await admit(replica, tokens, max_wait)
        finally:
            durations.append((start, time.monotonic()))

    limiter.admit = timed  # type: ignore[method-assign]
    return durations


async def loop_stalls(stalls: list[tuple[float, float]]) -> None:
    """Record (when, how late) each 5 ms sleep of this event loop woke: the machine's own stalls, which delay
    every await (a Redis timeout included) whatever Redis does."""
    while True:
        start = time.monotonic()
        await anyio.sleep(0.005)
        now = time.monotonic()
        stalls.append((now, now - start - 0.005))


def redis_share(start: float, end: float, stalls: list[tuple[float, float]]) -> float:
    """Seconds of the admission ``[start, end]`` not spent in a stall of the event loop (a probe that woke at
    ``when``, ``late`` seconds late, saw the loop stalled over ``[when - late, when]``): what Redis can own."""
    stalled = sum(max(0.0, min(end, when) - max(start, when - late)) for when, late in stalls if late > 0.001)
    return max(0.0, end - start - stalled)


async def main(phase: float, rate_limited: bool) -> None:
    (p1, url1), (p2, url2) = start_server(16), start_server(16)
    store = RedisServer()
    store.start()
    tiers = {"i": Tier(ttft=10, total=60, stall=10)}
    limit = NEVER_BINDS if rate_limited else None
    fleet = Guard([url1, url2], tiers=tiers, fleet=store.url, name="bench", rate_limit=limit)
    local = Guard([url1, url2], tiers=tiers, rate_limit=limit)
    admissions = timed_admissions(fleet)
    rows: list[str] = []
    extra: list[str] = []
    resyncs: list[str] = []
    try:
        stalls: list[tuple[float, float]] = []
        async with (
            anyio.create_task_group() as probe,
            fleet,
            local,
            fleet.http_client() as fc,
            local.http_client() as lc,
        ):
            probe.start_soon(loop_stalls, stalls)
            for _ in range(50):
                await timed(fc, url1)
                await timed(lc, url1)

            def state() -> str:
                snap = fleet.snapshot().fleet
                assert snap is not None
                return snap.state

            async def run(name: str) -> None:
                results: dict[str, list[tuple[float, bool]]] = {"local": [], "fleet": []}
                first = len(admissions)
                began = time.monotonic()
                end = began + phase
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
                if rate_limited:
                    spans = admissions[first:]
                    own = [(end - start) * 1000 for start, end in spans]
                    redis_part = [redis_share(start, end, stalls) * 1000 for start, end in spans]
                    paired = zip(results["fleet"], results["local"], strict=True)
                    pairs = [(f - lo) * 1000 for (f, _), (lo, _) in paired]
                    worst = max(own)
                    slow = sum(1 for t in own if t >= OP_TIMEOUT_MS)
                    blamed = max(redis_part)
                    verdict = "yes" if blamed <= OP_TIMEOUT_MS + 5 else "no"
                    stall = max((late * 1000 for when, late in stalls if when >= began), default=0.0)
                    extra.append(
                        f"| {name} | {len(own)} | {quantile(own, 0.5):.2f} | {worst:.1f} | {slow} | "
                        f"{quantile(pairs, 0.99):.1f} | {max(pairs):.1f} | {stall:.1f} | {blamed:.1f} | {verdict} |"
                    )

            async def back(name: str, repair: Callable[[], None]) -> None:
                repair()
                start = time.monotonic()
                while state() != "connected":  # noqa: ASYNC110 (polled state has no event)
                    await anyio.sleep(0.005)
                resyncs.append(f"{name}: connected and resynced {time.monotonic() - start:.2f} s after Redis returned")

            with anyio.fail_after(30):  # a busy machine may have stalled a warm-up call past the op timeout
                while state() != "connected":  # noqa: ASYNC110 (polled state has no event)
                    await anyio.sleep(0.005)
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
            probe.cancel_scope.cancel()
    finally:
        store.stop()
        p1.terminate()
        p2.terminate()
    print("| phase | guard | calls | failed | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if rate_limited:
        print()
        print(
            f"| phase | fleet admissions | admission p50 ms | admission max ms "
            f"| admissions >= {OP_TIMEOUT_MS:.0f} ms | fleet - local p99 ms | fleet - local max ms "
            f"| longest event-loop stall ms | admission less stalls, max ms | within {OP_TIMEOUT_MS + 5:.0f} ms |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        print("\n".join(extra))
    print("\n".join(resyncs))
    print(f"fleet snapshot at the end: {snap}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", type=float, default=3.0, help="seconds per phase")
    parser.add_argument(
        "--rate-limit",
        action="store_true",
        help="give both Guards a rate limit that never binds: every fleet attempt asks Redis",
    )
    args = parser.parse_args()
    anyio.run(main, args.phase, args.rate_limit)
