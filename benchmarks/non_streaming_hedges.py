"""Hedging calls that ask for no stream: what it costs the servers and what it buys the stragglers.

Two loopback replicas answer each call whole after its own length (1 to 6 s, the same on either replica, as an
answer's length is); 5 % of the calls are stragglers whose first request waits 3 s more (a queue), the way a
hedge can help. The same calls, 12 at a time, go through a Guard with the default hedge policy (calls without a
stream are not hedged) and through one with ``HedgePolicy(non_streaming=True)``.

    python -m benchmarks.non_streaming_hedges [--calls 160] [--seed 2]

"Beyond its length" is a call's latency minus its answer's length: what the replicas' queues (and the guard)
added to it.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass

import anyio
import openai

from llmguard_client import Guard, HedgePolicy, Tier
from llmguard_client._routing.quantile import percentile
from tests.loopback import Script, loopback_cluster

LENGTHS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""Seconds each answer takes, drawn per call."""
STRAGGLER_SHARE = 0.05
STRAGGLER_WAIT = 3.0
AT_ONCE = 12


@dataclass(frozen=True)
class Calls:
    lengths: list[float]
    stragglers: list[bool]

    @classmethod
    def draw(cls, n: int, seed: int) -> Calls:
        rng = random.Random(seed)
        return cls([rng.choice(LENGTHS) for _ in range(n)], [rng.random() < STRAGGLER_SHARE for _ in range(n)])

    def script(self, index: int, attempt: int) -> Script | None:
        if index < 0:
            return None
        wait = STRAGGLER_WAIT if self.stragglers[index] and attempt == 1 else 0.0
        return Script(hang_before_headers=self.lengths[index] + wait)


async def run(calls: Calls, hedge: HedgePolicy) -> str:
    n = len(calls.lengths)
    beyond: dict[int, float] = {}
    with loopback_cluster(2) as cluster:
        cluster.set_scripter(calls.script)
        tiers = {"t": Tier(ttft=30.0, total=60.0)}
        async with Guard(replicas=cluster.urls, tiers=tiers, hedge=hedge, instrumentation=None) as guard:
            client = openai.AsyncOpenAI(
                base_url=cluster.urls[0] + "/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI)
            )
            slots = anyio.CapacityLimiter(AT_ONCE)

            async def one(index: int) -> None:
                async with slots:
                    started = time.monotonic()
                    messages: list[dict[str, str]] = [{"role": "user", "content": f"req{index} hi"}]
                    await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
                    beyond[index] = time.monotonic() - started - calls.lengths[index]

            with guard.capture() as records:
                async with anyio.create_task_group() as tasks:
                    for index in range(n):
                        tasks.start_soon(one, index)
        requests = sum(len(server.received) for server in cluster.servers)
    hedged = sum(len(record.attempts) > 1 for record in records)
    values = list(beyond.values())
    stragglers = [beyond[i] for i in range(n) if calls.stragglers[i]]
    name = "HedgePolicy(non_streaming=True)" if hedge.non_streaming else "HedgePolicy() (the default)"
    return (
        f"| {name} | {hedged} | {requests / n:.3f} | {percentile(values, 50):.2f} s | {percentile(values, 95):.2f} s "
        f"| {max(values):.2f} s | {statistics.mean(stragglers):.2f} s ({len(stragglers)}) |"
    )


async def main(n: int, seed: int) -> None:
    calls = Calls.draw(n, seed)
    print(f"{n} calls without a stream, answers of {LENGTHS[0]:g}-{LENGTHS[-1]:g} s, {AT_ONCE} at a time, seed {seed}")
    print("| policy | calls hedged | server requests / call | beyond its length p50 | p95 | max | stragglers, mean |")
    print("|---|---|---|---|---|---|---|")
    for hedge in (HedgePolicy(), HedgePolicy(non_streaming=True)):
        print(await run(calls, hedge))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=160)
    parser.add_argument("--seed", type=int, default=2)
    args = parser.parse_args()
    anyio.run(main, args.calls, args.seed)
