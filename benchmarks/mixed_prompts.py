"""Long and short prompts in one tier: are the long ones hedged for their prefill, and their replicas drained?

    python -m benchmarks.mixed_prompts [--long 0.1] [--long-words 1500] [--calls 600] [--rate 30] [--runs 1] [--seed 0]

The simulated ``healthy`` cluster (3 replicas, its engines prefilling 128 tokens a step, so a 1,500-word prompt
waits ~0.12 s for its first token where a 40-word one waits ~0.015 s), a fresh cluster per client. The same
seeded open-loop traffic (Poisson, ``--rate`` per second, ``--calls`` streamed calls of 8 tokens, a share
``--long`` of them with ``--long-words`` words, the rest with 40) goes through the plain openai SDK and through
the SDK with a Guard (tier: 5 s to a first token), one after the other. Per client: TTFT p50/p99 of the short and
of the long calls, the long calls hedged, the short calls hedged and how many of those hedges won, the replicas
the guard drained (its log), the engines' prefill tokens and errors per client, the prompts of the guard's lost
hedges as a share of its engines' prefill (work for nothing), and whether the load generator kept to its plan (a
run where it fell 50 ms behind is marked INVALID). Plain's errors are the engines' 429s (token admission: a few
long prompts at once fill a replica's KV cache), which the plain client, with ``max_retries=0``, does not retry.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a file: measure this checkout, not whatever is installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio
import httpx
import openai

from llmguard_client import Guard, PhaseRecord, Tier
from llmguard_tools.sim.launch import spawn_cluster

SHORT_WORDS = 40
MAX_BEHIND = 0.05
"""Seconds the load generator may fall behind its plan before the run is invalid."""


@dataclass
class Result:
    """One client's run."""

    ttfts: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})
    records: list[PhaseRecord] = field(default_factory=list)
    drains: int = 0
    prefill_tokens: int = 0
    behind: float = 0.0
    errors: list[str] = field(default_factory=list)


def plan(calls: int, rate: float, long_share: float, seed: int) -> list[tuple[float, bool]]:
    """When each call is sent (seconds from the start) and whether its prompt is long."""
    rng, at, out = random.Random(seed), 0.0, []
    for _ in range(calls):
        out.append((at, rng.random() < long_share))
        at += rng.expovariate(rate)
    return out


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class _DrainCounter(logging.Handler):
    def __init__(self, result: Result) -> None:
        super().__init__(logging.WARNING)
        self.result = result

    def emit(self, record: logging.LogRecord) -> None:
        if "is degraded" in record.getMessage():
            self.result.drains += 1


async def drive(urls: list[str], schedule: list[tuple[float, bool]], long_words: int, guarded: bool) -> Result:
    """Send the schedule through one client; read every stream to its end."""
    result = Result()
    guard = Guard(urls, {"t": Tier(ttft=5.0, total=30.0)}, "t", instrumentation=None, on_record=result.records.append)
    handler = _DrainCounter(result)
    logging.getLogger("llmguard_client").addHandler(handler)
    try:
        async with guard:
            http = guard.http_client_for(openai.AsyncOpenAI) if guarded else None
            client = openai.AsyncOpenAI(base_url=urls[0] + "/v1", api_key="sim", max_retries=0, http_client=http)

            async def one(long: bool) -> None:
                words = long_words if long else SHORT_WORDS
                started = time.perf_counter()
                try:
                    stream = await client.chat.completions.create(
                        model="sim-model",
                        messages=[{"role": "user", "content": " ".join(["word"] * words)}],
                        max_tokens=9 if long else 8,  # tells the calls apart in the guard's records
                        stream=True,
                    )
                    first: float | None = None
                    async for chunk in stream:
                        if first is None and chunk.choices and chunk.choices[0].delta.content:
                            first = time.perf_counter() - started
                    if first is not None:
                        result.ttfts[long].append(first)
                except openai.APIError as exc:
                    result.errors.append(type(exc).__name__)

            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for at, long in schedule:
                    delay = start + at - time.perf_counter()
                    if delay > 0:
                        await anyio.sleep(delay)
                    result.behind = max(result.behind, -delay)
                    tg.start_soon(one, long)
            await client.close()
        async with httpx.AsyncClient() as http_stats:
            for url in urls:
                result.prefill_tokens += (await http_stats.get(url + "/sim/stats")).json()["prefill_tokens"]
    finally:
        logging.getLogger("llmguard_client").removeHandler(handler)
    return result


def run_once(args: argparse.Namespace, seed: int) -> dict[str, Result]:
    schedule = plan(args.calls, args.rate, args.long, seed)
    results = {}
    for name in ("plain", "guarded"):
        with spawn_cluster("healthy", seed=seed) as urls:
            results[name] = anyio.run(drive, urls, schedule, args.long_words, name == "guarded")
    return results


def report(results: dict[str, Result], long_words: int) -> list[str]:
    guarded = results["guarded"]
    valid = all(r.behind <= MAX_BEHIND for r in results.values())
    lines = [f"{'client':8} {'short p50/p99':>16} {'long p50/p99':>16} {'prefilled':>9} errors"]
    for name, r in results.items():
        cells = [f"{quantile(r.ttfts[k], 0.5) * 1e3:5.0f}/{quantile(r.ttfts[k], 0.99) * 1e3:4.0f} ms" for k in (0, 1)]
        errors = ", ".join(f"{n} {k}" for k, n in sorted(Counter(r.errors).items())) or "none"
        lines.append(f"{name:8} {cells[0]:>16} {cells[1]:>16} {r.prefill_tokens:>9,} {errors}")
    long_calls = [r for r in guarded.records if r.max_tokens == 9]
    short_calls = [r for r in guarded.records if r.max_tokens == 8]
    long_hedged = sum(1 for r in long_calls if r.hedged)
    short_hedged = [r for r in short_calls if r.hedged]
    won = sum(1 for r in short_hedged if r.attempts[-1].outcome == "won")
    lost = {
        k: sum(a.kind == "hedge" and a.outcome == "lost" for r in calls for a in r.attempts)
        for k, calls in ((True, long_calls), (False, short_calls))
    }
    wasted = (lost[True] * long_words + lost[False] * SHORT_WORDS) / max(1, guarded.prefill_tokens)
    lines.append(
        f"guarded: long calls hedged {long_hedged}/{len(long_calls)}; short calls hedged {len(short_hedged)}, "
        f"their hedge won {won}; replicas drained {guarded.drains}; lost hedges' prompts {wasted:.1%} of the "
        "engines' prefill"
    )
    behind = ", ".join(f"{name} {r.behind * 1e3:.0f} ms" for name, r in results.items())
    lines.append(f"load generator behind plan at most: {behind}" + ("" if valid else " -> INVALID"))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--long", type=float, default=0.1, help="share of the calls with a long prompt")
    parser.add_argument("--long-words", type=int, default=1500)
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--rate", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=1, help="runs, seeds --seed, --seed + 1, ...")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for seed in range(args.seed, args.seed + args.runs):
        print(f"seed {seed}: {args.calls} calls at {args.rate:g}/s, {args.long:.0%} long")
        for line in report(run_once(args, seed), args.long_words):
            print("  " + line)


if __name__ == "__main__":
    main()
