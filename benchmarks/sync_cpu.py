"""CPU per streamed call, plain SDK vs guarded, on the sync path and the async one, chunks at once and paced.

    python -m benchmarks.sync_cpu [--calls 120] [--concurrency 4] [--tokens 20] [--gaps 0,0.005] [--rounds 3]

openai's ``OpenAI`` (threads) and ``AsyncOpenAI`` (tasks), each plain and through a Guard
(``guard.http_client_for``), make streamed calls of ``--tokens`` content chunks, ``--concurrency`` at a time. Each
gap of ``--gaps`` has its own light replica (`llmguard_tools.sim.light`) in another process, sending the chunks
that many seconds apart (0: all at once; 0.005: paced as a model decoding 200 tokens a second), so the process CPU
measured (``time.process_time``) is the client's alone. Every round runs ``--calls`` calls through each of the four
clients, in a shuffled order; reported per gap and path: the median over rounds of CPU milliseconds per call, plain
and guarded, their difference and their ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import anyio
import anyio.from_thread
import openai

from benchmarks._harness import replica_processes
from llmguard_client import Guard, Tier

MESSAGES: Any = [{"role": "user", "content": "hi"}]
TIERS = {"t": Tier(ttft=5.0, total=30.0, stall=5.0)}
CLIENTS = ("sync plain", "sync guarded", "async plain", "async guarded")


def run_sync(client: openai.OpenAI, calls: int, pool: ThreadPoolExecutor) -> float:
    """CPU milliseconds per call of ``calls`` streamed calls, as many at a time as ``pool`` has threads."""

    def one(_: int) -> None:
        for _chunk in client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
            pass

    cpu = time.process_time()
    list(pool.map(one, range(calls)))
    return (time.process_time() - cpu) / calls * 1000


async def run_async(client: openai.AsyncOpenAI, calls: int, concurrency: int) -> float:
    """CPU milliseconds per call of ``calls`` streamed calls, ``concurrency`` tasks at a time."""
    limiter = anyio.CapacityLimiter(concurrency)

    async def one() -> None:
        async with limiter:
            async for _chunk in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
                pass

    cpu = time.process_time()
    async with anyio.create_task_group() as tg:
        for _ in range(calls):
            tg.start_soon(one)
    return (time.process_time() - cpu) / calls * 1000


def gap_label(gap: float) -> str:
    return "at once" if gap == 0 else f"{gap * 1000:g} ms apart"


def clients(
    url: str, stack: ExitStack, portal: anyio.from_thread.BlockingPortal, concurrency: int
) -> dict[str, Callable[[int, ThreadPoolExecutor], float]]:
    """The four clients of one replica, each as a run of N calls -> CPU ms per call. They and their Guards close
    with ``stack`` (the async ones on ``portal``'s loop, where their calls run)."""
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

    def on_portal(client: openai.AsyncOpenAI) -> Callable[[int, ThreadPoolExecutor], float]:
        return lambda calls, _pool: portal.call(run_async, client, calls, concurrency)

    return {
        "sync plain": lambda calls, pool: run_sync(sync_plain, calls, pool),
        "sync guarded": lambda calls, pool: run_sync(sync_guarded, calls, pool),
        "async plain": on_portal(async_plain),
        "async guarded": on_portal(async_guarded),
    }


def measure(args: argparse.Namespace, gaps: list[float]) -> dict[float, dict[str, list[float]]]:
    """CPU ms per call for every gap and client, one figure per round."""
    replicas = [["--tokens", str(args.tokens), "--gap", str(gap), "--first-token-delay", "0"] for gap in gaps]
    results: dict[float, dict[str, list[float]]] = {gap: {name: [] for name in CLIENTS} for gap in gaps}
    rng = random.Random(1)
    with (
        replica_processes(replicas) as urls,
        anyio.from_thread.start_blocking_portal() as portal,
        ThreadPoolExecutor(args.concurrency) as pool,
        ExitStack() as stack,
    ):
        runs = {gap: clients(url, stack, portal, args.concurrency) for gap, url in zip(gaps, urls, strict=True)}
        for gap in gaps:  # warm up: imports, pools, connections
            for run in runs[gap].values():
                run(args.concurrency * 2, pool)
        for _ in range(args.rounds):
            for gap in gaps:
                order = list(CLIENTS)
                rng.shuffle(order)
                for name in order:
                    results[gap][name].append(runs[gap][name](args.calls, pool))
    return results


def rows(results: dict[float, dict[str, list[float]]]) -> Iterator[str]:
    """The table's lines: per gap and path, median CPU per call plain and guarded, difference, ratio."""
    yield "| chunks | path | plain | guarded | guarded - plain | guarded ÷ plain |"
    yield "| --- | --- | ---: | ---: | ---: | ---: |"
    for gap, by_client in results.items():
        for path in ("sync", "async"):
            plain = statistics.median(by_client[f"{path} plain"])
            guarded = statistics.median(by_client[f"{path} guarded"])
            yield (
                f"| {gap_label(gap)} | {path} | {plain:.2f} ms | {guarded:.2f} ms | {guarded - plain:+.2f} ms "
                f"| {guarded / plain:.2f}x |"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=120, help="calls per client and round")
    parser.add_argument("--concurrency", type=int, default=4, help="calls at a time (threads, or tasks)")
    parser.add_argument("--tokens", type=int, default=20, help="content chunks per streamed answer")
    parser.add_argument("--gaps", default="0,0.005", help="seconds between chunks, one run per value (0: at once)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    gaps = [float(gap) for gap in args.gaps.split(",")]
    results = measure(args, gaps)
    print(
        f"{args.calls} streamed calls of {args.tokens} chunks per client and round, {args.concurrency} at a time, "
        f"median of {args.rounds} rounds (CPU per call)"
    )
    for line in rows(results):
        print(line)


if __name__ == "__main__":
    main()
