"""CPU per streamed call, plain SDK vs guarded, on the sync path and the async one, chunks at once and paced.

    python -m benchmarks.sync_cpu [--calls 120] [--concurrency 4] [--tokens 20] [--gaps 0,0.005] [--rounds 3]

openai's ``OpenAI`` (threads) and ``AsyncOpenAI`` (tasks), each plain and through a Guard
(``guard.http_client_for``), make streamed calls of ``--tokens`` content chunks, ``--concurrency`` at a time. Each
gap of ``--gaps`` has its own light replica (`llmguard_tools.sim.light`) in another process, sending the chunks
that many seconds apart (0: all at once; 0.005: paced as a model decoding 200 tokens a second), so the process CPU
measured (``time.process_time``) is the client's alone. Every round runs ``--calls`` calls through each of the four
clients, in a shuffled order; reported per gap and path, as medians over rounds: CPU milliseconds per call, plain
and guarded, their difference and their ratio, and the context switches of the process's threads per call.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.from_thread
import openai

from benchmarks._harness import context_switches, replica_processes
from llmguard_client import Guard, Tier

MESSAGES: Any = [{"role": "user", "content": "hi"}]
TIERS = {"t": Tier(ttft=5.0, total=30.0, stall=5.0)}
CLIENTS = ("sync plain", "sync guarded", "async plain", "async guarded")

Run = Callable[[int], None]
"""Makes that many streamed calls through one client."""


@dataclass(frozen=True)
class Cost:
    """What one run cost the process, per call."""

    cpu_ms: float
    switches: float
    """Context switches, voluntary (a thread waiting) and not (preempted), of all the process's threads."""


def run_sync(client: openai.OpenAI, pool: ThreadPoolExecutor) -> Run:
    """Calls through ``client``, as many at a time as ``pool`` has threads."""

    def one(_: int) -> None:
        for _chunk in client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
            pass

    def run(calls: int) -> None:
        list(pool.map(one, range(calls)))

    return run


def run_async(client: openai.AsyncOpenAI, portal: anyio.from_thread.BlockingPortal, concurrency: int) -> Run:
    """Calls through ``client`` on ``portal``'s event loop, ``concurrency`` tasks at a time."""

    async def one(limiter: anyio.CapacityLimiter) -> None:
        async with limiter:
            async for _chunk in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
                pass

    async def run(calls: int) -> None:
        limiter = anyio.CapacityLimiter(concurrency)
        async with anyio.create_task_group() as tg:
            for _ in range(calls):
                tg.start_soon(one, limiter)

    return lambda calls: portal.call(run, calls)


def cost(run: Run, calls: int) -> Cost:
    """``calls`` calls of ``run``, measured."""
    cpu, switches = time.process_time(), context_switches()
    run(calls)
    return Cost((time.process_time() - cpu) / calls * 1000, (context_switches() - switches) / calls)


def clients(
    url: str, stack: ExitStack, portal: anyio.from_thread.BlockingPortal, pool: ThreadPoolExecutor, concurrency: int
) -> dict[str, Run]:
    """The four clients of one replica. They and their Guards close with ``stack`` (the async ones on ``portal``'s
    loop, where their calls run)."""
    base = url + "/v1"
    sync_guard = stack.enter_context(Guard([url], tiers=TIERS, default_tier="t"))
    async_guard = stack.enter_context(portal.wrap_async_context_manager(Guard([url], tiers=TIERS, default_tier="t")))
    sync_plain = openai.OpenAI(base_url=base, api_key="k")
    sync_guarded = openai.OpenAI(base_url=base, api_key="k", http_client=sync_guard.http_client_for(openai.OpenAI))
    async_plain = openai.AsyncOpenAI(base_url=base, api_key="k")
    async_guarded = openai.AsyncOpenAI(
        base_url=base, api_key="k", http_client=async_guard.http_client_for(openai.AsyncOpenAI)
    )
    for sync_client in (sync_plain, sync_guarded):
        stack.callback(sync_client.close)
    for async_client in (async_plain, async_guarded):
        stack.callback(portal.call, async_client.close)
    return {
        "sync plain": run_sync(sync_plain, pool),
        "sync guarded": run_sync(sync_guarded, pool),
        "async plain": run_async(async_plain, portal, concurrency),
        "async guarded": run_async(async_guarded, portal, concurrency),
    }


def measure(args: argparse.Namespace, gaps: list[float]) -> dict[float, dict[str, list[Cost]]]:
    """The cost per call of every client at every gap, one per round."""
    replicas = [["--tokens", str(args.tokens), "--gap", str(gap), "--first-token-delay", "0"] for gap in gaps]
    results: dict[float, dict[str, list[Cost]]] = {gap: {name: [] for name in CLIENTS} for gap in gaps}
    rng = random.Random(1)
    with (
        replica_processes(replicas) as urls,
        anyio.from_thread.start_blocking_portal() as portal,
        ThreadPoolExecutor(args.concurrency) as pool,
        ExitStack() as stack,
    ):
        runs = {gap: clients(url, stack, portal, pool, args.concurrency) for gap, url in zip(gaps, urls, strict=True)}
        for by_client in runs.values():  # warm up: imports, pools, connections
            for run in by_client.values():
                run(args.concurrency * 2)
        for _ in range(args.rounds):
            for gap in gaps:
                order = list(CLIENTS)
                rng.shuffle(order)
                for name in order:
                    results[gap][name].append(cost(runs[gap][name], args.calls))
    return results


def gap_label(gap: float) -> str:
    return "at once" if gap == 0 else f"{gap * 1000:g} ms apart"


def rows(results: dict[float, dict[str, list[Cost]]]) -> Iterator[str]:
    """The table: per gap and path, the medians of CPU per call plain and guarded, their difference and ratio, and
    of the context switches per call."""
    yield "| chunks | path | plain | guarded | guarded - plain | guarded ÷ plain | switches per call, plain / guarded |"
    yield "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
    for gap, by_client in results.items():
        for path in ("sync", "async"):
            plain, guarded = by_client[f"{path} plain"], by_client[f"{path} guarded"]
            plain_ms = statistics.median(c.cpu_ms for c in plain)
            guarded_ms = statistics.median(c.cpu_ms for c in guarded)
            plain_switches = statistics.median(c.switches for c in plain)
            guarded_switches = statistics.median(c.switches for c in guarded)
            yield (
                f"| {gap_label(gap)} | {path} | {plain_ms:.2f} ms | {guarded_ms:.2f} ms "
                f"| {guarded_ms - plain_ms:+.2f} ms | {guarded_ms / plain_ms:.2f}x "
                f"| {plain_switches:.0f} / {guarded_switches:.0f} |"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=120, help="calls per client and round")
    parser.add_argument("--concurrency", type=int, default=4, help="calls at a time (threads, or tasks)")
    parser.add_argument("--tokens", type=int, default=20, help="content chunks per streamed answer (more than 2)")
    parser.add_argument("--gaps", default="0,0.005", help="seconds between chunks, one replica per value (0: at once)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    gaps = [float(gap) for gap in args.gaps.split(",")]
    results = measure(args, gaps)
    print(
        f"{args.calls} streamed calls of {args.tokens} chunks per client and round, {args.concurrency} at a time, "
        f"medians of {args.rounds} rounds"
    )
    for line in rows(results):
        print(line)


if __name__ == "__main__":
    main()
