"""Throughput and CPU per call of short non-streamed sync calls from many threads, plain SDK vs guarded.

    python -m benchmarks.sync_threads [--threads 50] [--calls 20] [--delay 0.05] [--rounds 3]

``--threads`` threads, each with its own ``openai.OpenAI`` (as a thread-per-request server has), make ``--calls``
non-streamed chat calls each, one after another, all started together; a light replica
(`llmguard_tools.sim.light`) in another process answers each after ``--delay`` seconds, so the process CPU measured
(``time.process_time``) is the client's alone. The client is plain (the SDK's own default client) or guarded
(``guard.http_client_for(openai.OpenAI)``, one Guard with that one replica: every call goes through the Guard's
event-loop thread). Each round runs both, in alternating order (plain first in odd rounds); reported per round and
as medians over rounds: calls per second, CPU milliseconds per call, and their ratios guarded ÷ plain; the part of
the guarded CPU spent on the Guard's event-loop thread; the callers' latency p50; the context switches of the
process's threads per call.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import openai

from benchmarks._harness import context_switches, replica_processes
from llmguard_client import Guard

MESSAGES: Any = [{"role": "user", "content": "hi"}]
CLIENTS = ("plain", "guarded")
LOOP_THREAD = "llmguard-sync-"
"""How the name of a Guard's event-loop thread for sync calls begins."""

MakeClient = Callable[[], openai.OpenAI]


@dataclass(frozen=True)
class Run:
    """One run of every thread's calls through one kind of client."""

    calls_per_s: float
    cpu_ms: float
    """CPU of the process per call."""
    loop_cpu_ms: float
    """The part of ``cpu_ms`` spent on the Guard's event-loop thread (0 without a Guard)."""
    p50_ms: float
    """The caller's latency of a call, median."""
    switches: float
    """Context switches of all the process's threads per call."""


def run(make_client: MakeClient, threads: int, calls: int) -> Run:
    """``threads`` threads, each with a client of its own, make ``calls`` calls each, started together."""
    clients = [make_client() for _ in range(threads)]
    latencies: list[float] = []
    failures: list[BaseException] = []
    start = threading.Barrier(threads + 1)

    def caller(client: openai.OpenAI) -> None:
        start.wait()
        for _ in range(calls):
            began = time.perf_counter()
            try:
                client.chat.completions.create(model="m", messages=MESSAGES)
            except Exception as exc:
                failures.append(exc)
                continue
            latencies.append(time.perf_counter() - began)

    workers = [threading.Thread(target=caller, args=(client,)) for client in clients]
    for worker in workers:
        worker.start()
    gc.collect()
    cpu, loop_cpu, switches = time.process_time(), _loop_thread_cpu(), context_switches()
    start.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - began
    cpu, loop_cpu, switches = (
        time.process_time() - cpu,
        _loop_thread_cpu() - loop_cpu,
        context_switches() - switches,
    )
    for client in clients:
        client.close()
    if failures:
        raise RuntimeError(f"{len(failures)} call(s) failed, the first: {failures[0]!r}")
    total = threads * calls
    return Run(
        total / wall, cpu / total * 1000, loop_cpu / total * 1000, statistics.median(latencies) * 1000, switches / total
    )


def _loop_thread_cpu() -> float:
    """CPU seconds the (one) Guard's event-loop thread for sync calls has used; 0 if none runs."""
    for thread in threading.enumerate():
        if thread.name.startswith(LOOP_THREAD) and thread.ident is not None:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return 0.0


def measure(args: argparse.Namespace) -> dict[str, list[Run]]:
    """Every round's run of each client, in alternating order."""
    results: dict[str, list[Run]] = {name: [] for name in CLIENTS}
    replica = ["--first-token-delay", str(args.delay)]
    with replica_processes([replica]) as (url,), Guard([url]) as guard:
        base = url + "/v1"
        makers: dict[str, MakeClient] = {
            "plain": lambda: openai.OpenAI(base_url=base, api_key="k"),
            "guarded": lambda: openai.OpenAI(
                base_url=base, api_key="k", http_client=guard.http_client_for(openai.OpenAI)
            ),
        }
        for name in CLIENTS:  # warm up: imports, the Guard's thread, connections
            run(makers[name], args.threads, 2)
        for round_ in range(args.rounds):
            for name in CLIENTS if round_ % 2 == 0 else CLIENTS[::-1]:
                results[name].append(run(makers[name], args.threads, args.calls))
    return results


def rows(results: dict[str, list[Run]]) -> Iterator[str]:
    """Per round, then the medians: plain and guarded side by side, with the ratios guarded ÷ plain."""
    yield (
        "| round | calls/s, plain / guarded | guarded ÷ plain | CPU per call, plain / guarded | guarded ÷ plain "
        "| of it on the Guard's thread | p50, plain / guarded | switches per call, plain / guarded |"
    )
    yield "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    plain, guarded = results["plain"], results["guarded"]
    lines = [(str(i), p, g) for i, (p, g) in enumerate(zip(plain, guarded, strict=True), 1)]
    for label, p, g in [*lines, ("median", _median(plain), _median(guarded))]:
        yield (
            f"| {label} | {p.calls_per_s:.0f} / {g.calls_per_s:.0f} | {g.calls_per_s / p.calls_per_s:.2f}x "
            f"| {p.cpu_ms:.2f} / {g.cpu_ms:.2f} ms | {g.cpu_ms / p.cpu_ms:.2f}x | {g.loop_cpu_ms:.2f} ms "
            f"| {p.p50_ms:.0f} / {g.p50_ms:.0f} ms | {p.switches:.1f} / {g.switches:.1f} |"
        )


def _median(runs: list[Run]) -> Run:
    return Run(
        statistics.median(r.calls_per_s for r in runs),
        statistics.median(r.cpu_ms for r in runs),
        statistics.median(r.loop_cpu_ms for r in runs),
        statistics.median(r.p50_ms for r in runs),
        statistics.median(r.switches for r in runs),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=50, help="caller threads, each with its own client")
    parser.add_argument("--calls", type=int, default=20, help="calls per thread and run, one after another")
    parser.add_argument("--delay", type=float, default=0.05, help="seconds the replica takes to answer")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    results = measure(args)
    print(
        f"{args.threads} threads x {args.calls} non-streamed calls answered after {args.delay * 1000:g} ms, "
        f"plain and guarded in alternating order, {args.rounds} rounds"
    )
    for line in rows(results):
        print(line)


if __name__ == "__main__":
    main()
