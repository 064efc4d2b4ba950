"""Sync vs async path under stragglers: does the guard cut TTFT p99 as much for openai.OpenAI as for AsyncOpenAI?

    python -m benchmarks.sync_stragglers [--requests 400] [--rate 40] [--seed 0]

Four runs, each against a fresh simulated cluster (``python -m llmguard_tools.sim --scenario stragglers``:
3 replicas, 5 % of requests stall 2 s before their first token), with the same Poisson arrivals and
prompts: plain and guarded ``AsyncOpenAI`` (tasks), plain and guarded ``OpenAI`` (a thread per in-flight
call, 64 threads). The plain clients spread calls round-robin over the replicas; the guarded ones use
one Guard (tier ttft 1 s, total 10 s, stall 2 s; hedging on). TTFT is measured by the caller: from the
call to the first content chunk of the stream. Reported: TTFT percentiles of the calls that succeeded,
the guarded/plain ratio of p99 for each path, and how far the sync ratio is from the async one.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import anyio
import openai

from llmguard_client import Guard, Tier
from llmguard_tools.sim.launch import spawn_cluster

TIER = {"interactive": Tier(ttft=1.0, total=10.0, stall=2.0)}
MODEL = "sim-model"


@dataclass(frozen=True)
class Planned:
    at: float
    prompt: str
    max_tokens: int


@dataclass
class Run:
    name: str
    ttfts: list[float] = field(default_factory=list)
    failures: int = 0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.ttfts)
        if not ordered:
            return float("nan")
        index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
        return ordered[index]


def plan(n: int, rate: float, seed: int) -> list[Planned]:
    rng = random.Random(seed)
    at, out = 0.0, []
    for _ in range(n):
        at += rng.expovariate(rate)
        words = min(400, max(5, int(rng.lognormvariate(4.0, 0.6))))
        out.append(Planned(at, "word " * words, min(120, max(4, int(rng.lognormvariate(3.0, 0.5))))))
    return out


def messages(p: Planned) -> Any:
    return [{"role": "user", "content": p.prompt}]


# --- async -------------------------------------------------------------------------------


async def run_async(name: str, urls: list[str], requests: list[Planned], guarded: bool) -> Run:
    run = Run(name)
    guard = Guard(urls, tiers=TIER) if guarded else None
    if guard is not None:
        clients = [openai.AsyncOpenAI(base_url=urls[0] + "/v1", api_key="sim", http_client=guard.httpx2_client())]
    else:
        clients = [openai.AsyncOpenAI(base_url=u + "/v1", api_key="sim") for u in urls]

    async def one(i: int, p: Planned) -> None:
        client = clients[i % len(clients)]
        start = time.perf_counter()
        try:
            stream = await client.chat.completions.create(
                model=MODEL, messages=messages(p), max_tokens=p.max_tokens, stream=True
            )
            first: float | None = None
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - start
            if first is None:
                raise RuntimeError("no content")
            run.ttfts.append(first)
        except Exception:
            run.failures += 1

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i, p in enumerate(requests):
            await anyio.sleep(max(0.0, p.at - (time.perf_counter() - t0)))
            tg.start_soon(one, i, p)
    for client in clients:
        await client.close()
    if guard is not None:
        await guard.aclose()
    return run


# --- sync --------------------------------------------------------------------------------


def run_sync(name: str, urls: list[str], requests: list[Planned], guarded: bool) -> Run:
    run = Run(name)
    lock = threading.Lock()
    guard = Guard(urls, tiers=TIER) if guarded else None
    if guard is not None:
        http = guard.sync_httpx2_client()
        clients = [openai.OpenAI(base_url=urls[0] + "/v1", api_key="sim", http_client=http)]
    else:
        clients = [openai.OpenAI(base_url=u + "/v1", api_key="sim") for u in urls]

    def one(i: int, p: Planned) -> None:
        client = clients[i % len(clients)]
        start = time.perf_counter()
        try:
            stream = client.chat.completions.create(
                model=MODEL, messages=messages(p), max_tokens=p.max_tokens, stream=True
            )
            first: float | None = None
            for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - start
            if first is None:
                raise RuntimeError("no content")
            with lock:
                run.ttfts.append(first)
        except Exception:
            with lock:
                run.failures += 1

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=64) as pool:
        for i, p in enumerate(requests):
            time.sleep(max(0.0, p.at - (time.perf_counter() - t0)))
            pool.submit(one, i, p)
    for client in clients:
        client.close()
    if guard is not None:
        guard.close()
    return run


def fresh_cluster(seed: int, body: Callable[[list[str]], Run]) -> Run:
    with spawn_cluster("stragglers", seed=seed) as urls:
        return body(urls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the four runs (the machine is shared)")
    args = parser.parse_args()
    requests = plan(args.requests, args.rate, args.seed)
    print(f"stragglers: {args.requests} streamed calls, Poisson {args.rate:g} rps, seed {args.seed}")
    print("| round | run | ok | failed | TTFT p50 | p95 | p99 |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    ratios: list[tuple[float, float]] = []
    for round_ in range(1, args.repeats + 1):
        runs = [
            fresh_cluster(args.seed, lambda u: anyio.run(run_async, "async plain", u, requests, False)),
            fresh_cluster(args.seed, lambda u: anyio.run(run_async, "async guarded", u, requests, True)),
            fresh_cluster(args.seed, lambda u: run_sync("sync plain", u, requests, False)),
            fresh_cluster(args.seed, lambda u: run_sync("sync guarded", u, requests, True)),
        ]
        for r in runs:
            p50, p95, p99 = (r.percentile(q) * 1000 for q in (0.50, 0.95, 0.99))
            print(
                f"| {round_} | {r.name} | {len(r.ttfts)} | {r.failures} | {p50:.0f} ms | {p95:.0f} ms | {p99:.0f} ms |"
            )
        ratios.append(
            (runs[1].percentile(0.99) / runs[0].percentile(0.99), runs[3].percentile(0.99) / runs[2].percentile(0.99))
        )
    for round_, (a, s) in enumerate(ratios, 1):
        print(
            f"round {round_}: TTFT p99 guarded/plain: async {a:.2f}x, sync {s:.2f}x; "
            f"sync/async reduction {(1 - s) / (1 - a):.2f}"
        )
    a, s = statistics.median(r[0] for r in ratios), statistics.median(r[1] for r in ratios)
    print(
        f"median: async {a:.2f}x, sync {s:.2f}x; "
        f"reduction (1 - ratio) sync/async {(1 - s) / (1 - a):.2f} (target 0.90-1.10)"
    )


if __name__ == "__main__":
    main()
