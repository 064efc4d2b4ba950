"""Soak: many guarded calls through faulty replicas; afterwards nothing may be left behind.

    python -m benchmarks.soak [--calls 50000] [--workers 50] [--seed 0] [--quick] [--tracemalloc]

Three replicas (`llmguard_tools.sim.light`, each in its own process on 127.0.0.1, so this process's
CPU and memory are the client's alone) inject faults into ``--fault-rate`` (5 %) of requests: TCP
resets mid-stream (or before the answer), 500s, stalls past the tier's stall limit (or before a
non-streamed answer), and error events inside a 200 stream. ``--workers`` concurrent workers make
``--calls`` calls through one `Guard`, mixing callers: the real ``openai.AsyncOpenAI`` on
``guard.http_client()`` and plain ``httpx`` on ``guard.http_client()``, each streamed and not; two
tiers (one behind a bulkhead); some streams closed early by the caller, some dropped unclosed (the
garbage collector's path).

The run pauses at checkpoints (after the warm-up, then every ``--every`` calls) with no call in
flight, and samples: RSS, open sockets of this process vs connections in the Guard's pools, asyncio
tasks, `guard.snapshot().idle`. At the end it closes everything and checks sockets and tasks are
back to their start. ``--tracemalloc`` traces allocations from the warm-up checkpoint on and prints
the sites that grew most by the end (it slows the run and inflates RSS; use it to find a leak).
Exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import math
import random
import sys
import time
import traceback
import tracemalloc
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: measure this checkout, not whatever is installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio
import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

import llmguard_client
from benchmarks import _harness as h
from llmguard_client import DEFAULT_POOL_LIMITS, Bulkhead, Guard, PhaseRecord, Tier
from llmguard_client._routing.quantile import percentile

TIERS = {
    "interactive": Tier(ttft=2.0, total=20.0, stall=0.5),
    "batch": Tier(ttft=5.0, total=60.0, stall=0.5),
}
BULKHEADS = {"interactive": Bulkhead(max_in_flight=32, max_waiting=32)}
STALL = 1.5
"""Seconds an injected stall lasts: past both tiers' stall limit (0.5 s) and the interactive ttft."""
HANG = 60.0
"""A call still running after this long is counted as hung (and cancelled)."""
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something short."}]
BODY = {"model": "m", "messages": MESSAGES}

# One call's shape, drawn up front from --seed: bit 0 openai (else httpx), bit 1 streamed,
# bit 2 batch tier (else interactive), bits 3-4 how a stream is read.
OPENAI, STREAM, BATCH = 1, 2, 4
READ_ALL, CLOSE_EARLY, ABANDON = 0, 1, 2
CALLERS = ("httpx-plain", "openai-plain", "httpx-stream", "openai-stream")


def draw_shapes(calls: int, seed: int) -> bytearray:
    rng = random.Random(seed)
    shapes = bytearray(calls)
    for i in range(calls):
        shape = (OPENAI if rng.random() < 0.5 else 0) | (STREAM if rng.random() < 0.5 else 0)
        shape |= BATCH if rng.random() < 0.25 else 0
        mode = rng.random()
        if shape & STREAM:
            if mode < 0.02:
                shape |= CLOSE_EARLY << 3
            elif mode < 0.03 and not shape & OPENAI:
                shape |= ABANDON << 3
        shapes[i] = shape
    return shapes


LATE_EDGES = (0.05, 0.25, 1.0, 3.0)
"""Buckets (seconds past the deadline) of how late a ttft timeout ended."""


@dataclass
class Lateness:
    """How far past its ttft deadline a timed-out call ended: counts per bucket, and the worst one."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(LATE_EDGES) + 1))
    worst: float = -math.inf
    worst_detail: str = ""

    def add(self, late: float, detail: Callable[[], str]) -> None:
        self.counts[bisect.bisect(LATE_EDGES, late)] += 1
        if late > self.worst:
            self.worst, self.worst_detail = late, detail()

    def line(self) -> str:
        edges = ["0", *(f"{e * 1000:.0f}" for e in LATE_EDGES)]
        parts = [f"{lo}-{hi} ms: {n}" for lo, hi, n in zip(edges, edges[1:], self.counts, strict=False)]
        parts.append(f">{edges[-1]} ms: {self.counts[-1]}")
        return ", ".join(parts) + (f"; worst {self.worst * 1000:+.0f} ms" if sum(self.counts) else "")


def phases(record: PhaseRecord) -> str:
    """Where a call's time went, relative to its start (seconds)."""

    def rel(t: float | None) -> str:
        return "-" if t is None else f"{t - record.start:.3f}"

    attempts = "; ".join(
        f"{a.kind} {a.replica.rsplit(':', 1)[-1]} {rel(a.start)}..{rel(a.finish)} {a.outcome}"
        + (f" ({a.error})" if a.error else "")
        for a in record.attempts
    )
    return f"tier {record.tier}, queued {rel(record.queued)}, attempts [{attempts}], finished {rel(record.finish)}"


@dataclass
class Tally:
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    longest: dict[str, float] = field(default_factory=dict)
    longest_by_tier: dict[tuple[str, bool], float] = field(default_factory=dict)
    """(tier, ended by a ttft timeout) -> the longest such call."""
    examples: dict[str, str] = field(default_factory=dict)
    records: Counter[str] = field(default_factory=Counter)
    attempts: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    late_guard: Lateness = field(default_factory=Lateness)
    """ttft timeouts: the guard's record finished (lease closed) this long after the deadline."""
    late_caller: Lateness = field(default_factory=Lateness)
    """ttft timeouts: the caller saw the failure this long after the deadline."""

    def on_record(self, record: PhaseRecord) -> None:
        self.records[f"{record.status}" + (f" ({record.cause})" if record.cause else "")] += 1
        for attempt in record.attempts:
            self.attempts[attempt.kind] += 1
        if record.cause == "ttft_timeout" and record.finish is not None:
            self.late_guard.add(record.finish - record.start - TIERS[record.tier].ttft, lambda: phases(record))

    def add(self, caller: str, tier: str, outcome: str, seconds: float) -> None:
        self.outcomes[(outcome, caller)] += 1
        self.longest[outcome] = max(seconds, self.longest.get(outcome, 0.0))
        key = (tier, "ttft_timeout" in outcome or outcome == "TTFTTimeout")
        self.longest_by_tier[key] = max(seconds, self.longest_by_tier.get(key, 0.0))
        if key[1]:
            self.late_caller.add(seconds - TIERS[tier].ttft, lambda: f"{caller}, tier {tier}")


def classify(exc: BaseException) -> str:
    """A short name for how a call failed, as its caller saw it."""
    if isinstance(exc, openai.APIStatusError):
        cause = exc.response.headers.get("x-llmguard-cause")
        return f"{type(exc).__name__} {exc.status_code}" + (f" ({cause})" if cause else "")
    if isinstance(exc, openai.APIConnectionError):
        return f"{type(exc).__name__} ({type(exc.__cause__).__name__})"
    if isinstance(exc, openai.APIError):
        return f"APIError ({exc.message})"
    return type(exc).__name__


class Soak:
    def __init__(self, guard: Guard, urls: list[str], shapes: bytearray, tally: Tally) -> None:
        self.guard = guard
        self.shapes = shapes
        self.next = 0
        self.tally = tally
        # openai 3 annotates http_client as an httpx2 client; it accepts an httpx one at run time.
        legacy: Any = guard.http_client()
        self.oai = openai.AsyncOpenAI(base_url=urls[0] + "/v1", api_key="soak", http_client=legacy)
        self.hx = guard.http_client(base_url=urls[0] + "/v1")

    async def worker(self, end: int) -> None:
        while self.next < end:
            shape = self.shapes[self.next]
            self.next += 1
            caller = CALLERS[shape & 3]
            tier = "batch" if shape & BATCH else "interactive"
            start = time.perf_counter()
            outcome = "HUNG (cancelled after 60 s)"
            with anyio.move_on_after(HANG):
                try:
                    outcome = await self.call(shape)
                except Exception as exc:
                    outcome = classify(exc)
                    self.tally.examples.setdefault(outcome, f"{type(exc).__name__}: {exc}"[:400])
                    if not isinstance(exc, (openai.APIError, httpx.HTTPError)) and len(self.tally.unexpected) < 5:
                        self.tally.unexpected.append("".join(traceback.format_exception(exc)))
            self.tally.add(caller, tier, outcome, time.perf_counter() - start)

    async def call(self, shape: int) -> str:
        tier = "batch" if shape & BATCH else "interactive"
        mode = shape >> 3
        if shape & OPENAI:
            return await self._openai(shape & STREAM != 0, tier, mode)
        return await self._httpx(shape & STREAM != 0, tier, mode)

    async def _openai(self, stream: bool, tier: str, mode: int) -> str:
        headers = {"x-llmguard-tier": tier}
        if not stream:
            completion = await self.oai.chat.completions.create(model="m", messages=MESSAGES, extra_headers=headers)
            return "ok" if completion.choices else "no choices"
        chunks = await self.oai.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, extra_headers=headers
        )
        async for _ in chunks:
            if mode == CLOSE_EARLY:
                await chunks.close()
                return "ok (closed early)"
        return "ok"

    async def _httpx(self, stream: bool, tier: str, mode: int) -> str:
        headers = {"x-llmguard-tier": tier}
        if not stream:
            response = await self.hx.post("/chat/completions", json=BODY, headers=headers)
            if response.status_code != 200:
                return _status(response)
            return "ok" if response.json().get("choices") else "no choices"
        request = self.hx.build_request("POST", "/chat/completions", json={**BODY, "stream": True}, headers=headers)
        response = await self.hx.send(request, stream=True)
        if mode == ABANDON:
            if response.status_code != 200:
                await response.aclose()
                return _status(response)
            await response.aiter_raw().__anext__()
            del response  # dropped unclosed: the Guard's garbage-collection path
            return "ok (abandoned unclosed)"
        try:
            if response.status_code != 200:
                await response.aread()
                return _status(response)
            done = error_event = False
            async for line in response.aiter_lines():
                if mode == CLOSE_EARLY:
                    return "ok (closed early)"
                error_event = error_event or line.startswith('data: {"error"')
                done = done or line == "data: [DONE]"
            return "error event in a 200 stream" if error_event else ("ok" if done else "ended without [DONE]")
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        await self.oai.close()
        await self.hx.aclose()


def _status(response: httpx.Response) -> str:
    cause = response.headers.get("x-llmguard-cause")
    return f"HTTP {response.status_code}" + (f" ({cause})" if cause else "")


@dataclass
class Sample:
    calls: int
    seconds: float
    lag: str
    """Event-loop lag during the segment, p50/p99/max ms (not the samples: kept, they would grow RSS)."""
    rss: float
    sockets: int
    pooled: int
    tasks: int
    idle: bool

    def line(self, base_sockets: int) -> str:
        return (
            f"after {self.calls:>6} calls  {self.seconds:7.1f} s  loop lag p50/p99/max "
            f"{self.lag} ms  RSS {self.rss:7.2f} MiB  "
            f"sockets {self.sockets - base_sockets:>3} (pooled connections {self.pooled:>3})  "
            f"tasks {self.tasks}  idle {self.idle}"
        )


def _ms(values: list[float], q: float) -> str:
    value = percentile(values, q)
    return "-" if value is None else f"{value * 1000:.0f}"


async def sample(guard: Guard, calls: int, started: float, lag: list[float], base_tasks: int) -> Sample:
    """Measure at a checkpoint (no call in flight). A connection close that a garbage-collected
    stream scheduled, or an async generator's finalizer, may still be running: give them 0.2 s."""
    seconds = time.perf_counter() - started
    for _ in range(20):
        h.settle()
        if h.asyncio_tasks() == base_tasks:
            break
        await anyio.sleep(0.01)
    snap = guard.snapshot()
    pooled = sum(r.open_connections or 0 for r in snap.replicas)
    lag_text = f"{_ms(lag, 50)}/{_ms(lag, 99)}/{_ms(lag, 100)}"
    return Sample(
        calls,
        seconds,
        lag_text,
        h.rss_mb(),
        h.open_sockets(),
        pooled,
        h.asyncio_tasks(),
        snap.idle and snap.calls_in_flight == 0,
    )


async def run(args: argparse.Namespace, urls: list[str]) -> bool:
    shapes = draw_shapes(args.calls, args.seed)
    h.settle()
    base_sockets, base_tasks, base_rss = h.open_sockets(), h.asyncio_tasks(), h.rss_mb()
    print(f"client start: sockets {base_sockets}, asyncio tasks {base_tasks}, RSS {base_rss:.2f} MiB", flush=True)
    tally = Tally()
    guard = Guard(urls, tiers=TIERS, bulkheads=BULKHEADS, on_record=tally.on_record, pool_limits=args.pool)
    soak = Soak(guard, urls, shapes, tally)
    warm = min(args.warmup, args.calls)
    ends = sorted({warm, *range(warm + args.every, args.calls, args.every), args.calls})
    samples: list[Sample] = []
    tm_start: tracemalloc.Snapshot | None = None
    tm_traced = 0
    started, cpu0 = time.perf_counter(), h.cpu_seconds()
    lag = h.LoopLag()
    for end in ends:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lag.run)
            async with anyio.create_task_group() as workers:
                for _ in range(args.workers):
                    workers.start_soon(soak.worker, end)
            tg.cancel_scope.cancel()
        samples.append(await sample(guard, end, started, lag.take(), base_tasks))
        print(samples[-1].line(base_sockets), flush=True)
        if end == warm and args.tracemalloc:
            tracemalloc.start(4)  # 4 frames: enough to place a site, cheap enough to run
            tm_start = tracemalloc.take_snapshot()
            tm_traced = tracemalloc.get_traced_memory()[0]
    wall, cpu = time.perf_counter() - started, h.cpu_seconds() - cpu0
    tm_end = tracemalloc.take_snapshot() if tm_start is not None else None
    if tm_start is not None and tm_end is not None:
        traced = tracemalloc.get_traced_memory()[0] - tm_traced
        grown = sum(stat.size_diff for stat in tm_end.compare_to(tm_start, "filename"))
        live_exceptions = sum(isinstance(o, BaseException) for o in gc.get_objects())
        print(
            f"tracemalloc: traced memory {traced / 1024:+.1f} KiB since the warm-up; sum of per-file growth "
            f"{grown / 1024:+.1f} KiB; live exception objects: {live_exceptions}"
        )
        tracemalloc.stop()
    end_snapshot = guard.snapshot()
    await soak.aclose()
    await guard.aclose()
    h.settle()
    after_sockets, after_tasks = h.open_sockets(), h.asyncio_tasks()

    print()
    print(f"measured: {llmguard_client.__file__}")
    print(
        f"{args.calls} calls, {args.workers} workers, 3 replicas (separate processes), fault rate "
        f"{args.fault_rate:.0%}, seed {args.seed}, pool {h.label(args.pool or DEFAULT_POOL_LIMITS)}: "
        f"{wall:.1f} s wall, {args.calls / wall:.0f} calls/s, "
        f"client CPU {cpu:.1f} s ({cpu / args.calls * 1e6:.0f} µs per call)"
    )
    report_outcomes(tally)
    warm_sample, last = samples[0], samples[-1]
    growth = last.rss - warm_sample.rss
    checks = {
        "every call accounted for (callers and guard records)": sum(tally.outcomes.values())
        == args.calls
        == sum(tally.records.values()),
        "no call hung": not any(o.startswith("HUNG") for o, _ in tally.outcomes),
        "no unexpected exception": not tally.unexpected,
        "idle at every checkpoint (snapshot().idle, calls_in_flight 0)": all(s.idle for s in samples),
        "sockets == pooled connections at every checkpoint": all(s.sockets - base_sockets == s.pooled for s in samples),
        "asyncio tasks back to start at every checkpoint": all(s.tasks == base_tasks for s in samples),
        f"sockets back to start after aclose ({base_sockets} -> {after_sockets})": after_sockets == base_sockets,
        f"asyncio tasks back to start after aclose ({base_tasks} -> {after_tasks})": after_tasks == base_tasks,
        f"RSS growth after warm-up < 5 MiB ({warm_sample.rss:.2f} -> {last.rss:.2f} MiB, {growth:+.2f})": growth < 5.0
        or tm_start is not None,
    }
    print()
    print(
        f"end snapshot (before aclose): calls_in_flight {end_snapshot.calls_in_flight}, replicas in_flight "
        f"{[r.in_flight for r in end_snapshot.replicas]}, open connections "
        f"{[r.open_connections for r in end_snapshot.replicas]}, bulkheads (in_flight, waiting) "
        f"{ {n: (t.in_flight, t.waiting) for n, t in end_snapshot.tiers.items()} }, budget pending "
        f"{end_snapshot.budget.pending if end_snapshot.budget else None}, idle {end_snapshot.idle}"
    )
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    if tm_start is not None and tm_end is not None:
        report_tracemalloc(tm_start, tm_end)
    return all(checks.values())


def report_outcomes(tally: Tally) -> None:
    print()
    print("| outcome (as the caller saw it) | " + " | ".join(CALLERS) + " | total | longest call |")
    print("|---|" + "---|" * (len(CALLERS) + 2))
    for outcome in sorted({o for o, _ in tally.outcomes}, key=lambda o: (not o.startswith("ok"), o)):
        counts = [tally.outcomes[(outcome, c)] for c in CALLERS]
        print(
            f"| {outcome} | "
            + " | ".join(str(n) for n in counts)
            + f" | {sum(counts)} | {tally.longest[outcome]:.3f} s |"
        )
    print(
        "| **all** | "
        + " | ".join(str(sum(n for (_, c), n in tally.outcomes.items() if c == caller)) for caller in CALLERS)
        + f" | {sum(tally.outcomes.values())} | |"
    )
    print()
    for name, tier in TIERS.items():
        longest = tally.longest_by_tier.get((name, False), 0.0)
        ttft = tally.longest_by_tier.get((name, True))
        print(
            f"tier {name} (ttft {tier.ttft} s, stall {tier.stall} s, total {tier.total} s): longest call "
            f"{max(longest, ttft or 0.0):.3f} s; longest ttft timeout "
            + (f"{ttft:.3f} s ({ttft - tier.ttft:+.3f} s past the deadline)" if ttft is not None else "-")
        )
    print(f"ttft timeouts, how late the guard's record finished: {tally.late_guard.line()}")
    if tally.late_guard.worst_detail:
        print(f"  worst: {tally.late_guard.worst_detail}")
    print(f"ttft timeouts, how late the caller saw it: {tally.late_caller.line()}")
    print("guard records by status (cause): " + ", ".join(f"{k} {v}" for k, v in tally.records.most_common()))
    print(
        "attempts by kind: "
        + ", ".join(f"{k} {v}" for k, v in tally.attempts.most_common())
        + f" ({sum(tally.attempts.values()) / max(1, sum(tally.records.values())):.3f} per call)"
    )
    print("one message per failure kind:")
    for outcome, message in sorted(tally.examples.items()):
        print(f"  {outcome}: {message}")
    for trace in tally.unexpected:
        print("UNEXPECTED:\n" + trace)


def report_tracemalloc(start: tracemalloc.Snapshot, end: tracemalloc.Snapshot) -> None:
    print("\n(tracemalloc on: RSS figures include its own overhead.) Largest growth since the warm-up:")
    for stat in end.compare_to(start, "lineno")[:15]:
        print(f"  {stat}")
    print("\nTop 3 by traceback:")
    for stat in end.compare_to(start, "traceback")[:3]:
        print(f"  {stat.size_diff / 1024:+.1f} KiB, {stat.count_diff:+d} blocks")
        for line in stat.traceback.format():
            print(f"    {line}")


async def server_stats(urls: list[str]) -> None:
    async with httpx.AsyncClient() as client:
        for url in urls:
            stats = (await client.get(url + "/stats")).json()
            stats["open_connections"] -= 1  # this request's own
            print(f"server {url}: " + ", ".join(f"{k} {v}" for k, v in sorted(stats.items())))


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=50_000)
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fault-rate", type=float, default=0.05)
    parser.add_argument("--warmup", type=int, default=5000, help="calls before the RSS reference sample")
    parser.add_argument("--every", type=int, default=5000, help="calls between checkpoints")
    parser.add_argument("--quick", action="store_true", help="2000 calls, warm-up 500, checkpoints every 500")
    parser.add_argument("--tracemalloc", action="store_true", help="trace allocations after the warm-up")
    parser.add_argument(
        "--pool",
        type=h.parse_limits,
        default=None,
        metavar="MAX,KEEPALIVE",
        help="per-replica pool limits (default: the Guard's DEFAULT_POOL_LIMITS)",
    )
    args = parser.parse_args()
    if args.quick:
        args.calls, args.warmup, args.every = 2000, 500, 500
    if args.calls < 1 or args.workers < 1 or args.every < 1 or args.warmup < 0:
        parser.error("--calls, --workers and --every must be >= 1, --warmup >= 0")
    options = [
        [
            "--seed",
            str(args.seed * 10 + i),
            "--fault-rate",
            str(args.fault_rate),
            "--stall",
            str(STALL),
            "--first-token-delay",
            "0.005",
            "--tokens",
            "6",
            "--gap",
            "0.001",
        ]
        for i in range(3)
    ]
    with h.replica_processes(options) as urls:
        ok = anyio.run(run, args, urls)
        anyio.run(server_stats, urls)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
