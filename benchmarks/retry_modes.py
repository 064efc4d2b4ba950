"""Default vs cooperative retries, through the openai SDK: which should be the default?

    python -m benchmarks.retry_modes [--scenarios stragglers,faults] [--repeats 2] [--seed 0]

For each scenario, against a fresh simulated cluster per run (``python -m llmguard_tools.sim``, 3 replicas) and
the same seeded Poisson arrivals (the bench presets' rates and sizes: stragglers 500 calls at 40 rps, faults 400
at 30 rps): ``AsyncOpenAI`` (its default ``max_retries=2``) through a Guard with the default
``RetryPolicy()`` and through one with ``RetryPolicy(mode="cooperative")``, tier ttft 1 s, total 10 s, stall 2 s,
hedging on. Reported per run: calls that succeeded and failed, the caller's TTFT p50/p95/p99 (from the call
to the first content chunk, successful calls) and end-to-end p99, and the requests the servers received per
call (``/sim/stats``). The two modes alternate within each round, so a busy machine weighs on both alike.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import anyio
import httpx
import openai

from benchmarks.sync_stragglers import Planned, plan
from llmguard_client import Guard, RetryPolicy, Tier
from llmguard_tools.sim.launch import spawn_cluster

TIER = {"interactive": Tier(ttft=1.0, total=10.0, stall=2.0)}
MODEL = "sim-model"
PRESETS = {"stragglers": (500, 40.0), "faults": (400, 30.0)}
MODES = {"default": RetryPolicy(), "cooperative": RetryPolicy(mode="cooperative")}


@dataclass
class Run:
    name: str
    ttfts: list[float] = field(default_factory=list)
    e2es: list[float] = field(default_factory=list)
    failures: int = 0
    received: int = 0

    def percentile(self, values: list[float], q: float) -> float:
        ordered = sorted(values)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def received(urls: list[str]) -> int:
    total = 0
    async with httpx.AsyncClient(timeout=5.0) as http:
        for u in urls:
            total += int((await http.get(u + "/sim/stats")).json().get("received", 0))
    return total


async def run(name: str, urls: list[str], requests: list[Planned], policy: RetryPolicy) -> Run:
    result = Run(name)
    before = await received(urls)
    async with Guard(urls, tiers=TIER, retry=policy) as guard:
        client = openai.AsyncOpenAI(base_url=urls[0] + "/v1", api_key="sim", http_client=guard.httpx2_client())

        async def one(p: Planned) -> None:
            start = time.perf_counter()
            try:
                stream = await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": p.prompt}], max_tokens=p.max_tokens, stream=True
                )
                first: float | None = None
                async for chunk in stream:
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = time.perf_counter() - start
                if first is None:
                    raise RuntimeError("no content")
                result.ttfts.append(first)
                result.e2es.append(time.perf_counter() - start)
            except Exception:
                result.failures += 1

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for p in requests:
                await anyio.sleep(max(0.0, p.at - (time.perf_counter() - t0)))
                tg.start_soon(one, p)
        await client.close()
    await anyio.sleep(0.5)  # the servers count a request when its handler starts
    result.received = await received(urls) - before
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="stragglers,faults")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("| scenario | round | mode | ok | failed | TTFT p50 | p95 | p99 | e2e p99 | server requests / call |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for scenario in args.scenarios.split(","):
        n, rate = PRESETS[scenario]
        requests = plan(n, rate, args.seed)
        for round_ in range(1, args.repeats + 1):
            order = list(MODES) if round_ % 2 else list(reversed(MODES))
            for mode in order:
                with spawn_cluster(scenario, seed=args.seed) as urls:
                    r = anyio.run(run, mode, urls, requests, MODES[mode])
                p = [r.percentile(r.ttfts, q) * 1000 for q in (0.5, 0.95, 0.99)]
                e2e = r.percentile(r.e2es, 0.99) * 1000
                print(
                    f"| {scenario} | {round_} | {mode} | {len(r.ttfts)} | {r.failures} | {p[0]:.0f} ms | {p[1]:.0f} ms "
                    f"| {p[2]:.0f} ms | {e2e:.0f} ms | {r.received / n:.3f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
