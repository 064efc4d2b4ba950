"""Client CPU per streamed call with ``Guard(fleet=...)`` against the same Guard without it, interleaved.

Two loopback replicas in separate processes and a local ``redis-server``; four clients in one process, in
random order each round: ``guarded`` (no fleet), ``guarded-fleet`` (fleet on: its background PING, flag reads
and listener included), ``guarded-fleet-budget`` (fleet on and ``BudgetPolicy(scope="fleet")``: its budget
synced every 0.2 s) and ``guarded-again`` (a second fleet-less Guard: this run's noise floor). Also counts
the Redis commands the fleet Guards' calls caused (INFO commandstats before/after, the background's included).

    python -m benchmarks.fleet_cpu [--calls 20] [--rounds 40] [--tokens 64]
"""

from __future__ import annotations

import argparse
import random
import time

import anyio
import openai
import redis.asyncio as redis

from benchmarks.cpu_per_call import one_call, ratio_interval, start_server
from llmguard_client import BudgetPolicy, Guard, Tier
from tests.redis_server import RedisServer


async def commands(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


async def main(calls: int, rounds: int, tokens: int) -> None:
    (p1, url1), (p2, url2) = start_server(tokens), start_server(tokens)
    store = RedisServer()
    store.start()
    tiers = {"i": Tier(ttft=10, total=60, stall=10)}
    guards = {
        "guarded": Guard([url1, url2], tiers=tiers),
        "guarded-fleet": Guard([url1, url2], tiers=tiers, fleet=store.url, name="bench"),
        "guarded-fleet-budget": Guard(
            [url1, url2], tiers=tiers, fleet=store.url, name="bench-budget", budget=BudgetPolicy(scope="fleet")
        ),
        "guarded-again": Guard([url1, url2], tiers=tiers),
    }
    clients = {
        name: openai.AsyncOpenAI(base_url=url1 + "/v1", api_key="x", http_client=g.http_client())
        for name, g in guards.items()
    }
    try:
        for client in clients.values():
            for _ in range(20):
                await one_call(client)
        for name in ("guarded-fleet", "guarded-fleet-budget"):
            fleet = guards[name].snapshot().fleet
            assert fleet is not None and fleet.connected, fleet
        per_round: dict[str, list[float]] = {name: [] for name in clients}
        rng = random.Random(1)
        before, started = await commands(store.url), time.monotonic()
        for _ in range(rounds):
            order = list(clients)
            rng.shuffle(order)
            for name in order:
                start = time.process_time()
                for _ in range(calls):
                    await one_call(clients[name])
                per_round[name].append(time.process_time() - start)
        elapsed, after = time.monotonic() - started, await commands(store.url)
    finally:
        for client in clients.values():
            await client.close()
        for g in guards.values():
            await g.aclose()
        store.stop()
        p1.terminate()
        p2.terminate()
    total = calls * rounds
    print(f"{total} streamed calls of {tokens} tokens per client, {rounds} interleaved rounds of {calls}")
    print("| client | client CPU per call (µs) | / guarded | 95 % interval (rounds resampled) |")
    print("|---|---|---|---|")
    for name, seconds in per_round.items():
        ratio, low, high = ratio_interval(seconds, per_round["guarded"], rng)
        print(f"| {name} | {sum(seconds) / total * 1e6:.0f} | {ratio:.3f}x | {low:.3f}-{high:.3f} |")
    fleet, budget = per_round["guarded-fleet"], per_round["guarded-fleet-budget"]
    ratio, low, high = ratio_interval(budget, fleet, rng)
    print(f"guarded-fleet-budget / guarded-fleet: {ratio:.3f}x ({low:.3f}-{high:.3f})")
    print("(guarded-again is a second fleet-less Guard: its ratio is this run's noise floor)")
    print(
        f"Redis commands during the run: {after - before} for {2 * total} calls of the two fleet Guards over "
        f"{elapsed:.1f} s ({(after - before) / elapsed:.1f} per second, whatever the call rate: a PING every 0.5 s "
        f"each, the flag read every 5 s, the budget's sync every 0.2 s)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20, help="calls per client per round")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    anyio.run(main, args.calls, args.rounds, args.tokens)
