"""A burst through the guard against the same burst through the raw openai client, side by side.

    python -m benchmarks.burst [--calls 250] [--waves 3] [--pool-connections N] [--ttft 5.0] [--runs 1]

One healthy replica (`llmguard_tools.sim.light` in its own process, so its CPU does not share the client's
GIL: first token after 36 ms, then 8 tokens 2 ms apart). Two ``openai.AsyncOpenAI`` clients in this process:
the raw one (the SDK's own pool) and a guarded one (``http_client=guard.http_client_for(openai.AsyncOpenAI)``,
one replica, tier ttft ``--ttft`` s, so no deadline cuts anything at the default 5 s; ``--pool-connections``
is the guard's ``max_keepalive_connections`` per replica, default `DEFAULT_POOL_LIMITS`'s). Each wave is
``--calls`` streamed calls released at the same instant and read to their end, first through the raw client,
then through the guarded one (the two never run at once); the first wave of each opens its connections (cold),
the next ones reuse what the pool kept (warm). Per wave and client: calls whose first token came within 1 s,
calls that ended in an error, time to first token p50/p99 (as the caller saw it), how late a 10 ms sleep woke
(event-loop lag, p99), new connections the server accepted, and the client process's CPU seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: measure this checkout, not whatever is installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio
import httpx
import httpx2
import openai

import llmguard_client
from benchmarks import _harness as h
from llmguard_client import DEFAULT_POOL_LIMITS, Guard, Tier
from llmguard_client._routing.quantile import percentile

WITHIN = 1.0
"""A call counts as served in time when its first token came within this many seconds."""
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


class PoolStats:
    """``--pool-stats``: in httpcore's pools (the guard's) and httpcore2's (openai >= 3's own), how many times a
    request was handed a connection another request then took (``ConnectionNotAvailable``: it queues again),
    and how long each such request spent on those connections before it was turned away (waiting in line for
    the connection's lock behind the others it was handed to). A diagnostic: it wraps the pools' connections."""

    def __init__(self) -> None:
        self.requeued = 0
        self.lost: dict[int, float] = {}

    def install(self) -> None:
        import importlib

        probe = self
        for package in ("httpcore", "httpcore2"):
            connection: Any = importlib.import_module(f"{package}._async.connection").AsyncHTTPConnection
            not_available: Any = importlib.import_module(package).ConnectionNotAvailable
            send = connection.handle_async_request

            async def timed(self: Any, request: Any, send: Any = send, not_available: Any = not_available) -> Any:
                start = time.perf_counter()
                try:
                    return await send(self, request)
                except not_available:
                    probe.requeued += 1
                    probe.lost[id(request)] = probe.lost.get(id(request), 0.0) + time.perf_counter() - start
                    raise

            connection.handle_async_request = timed

    def take(self, wave: Wave) -> None:
        wave.requeued, wave.lost = self.requeued, list(self.lost.values())
        self.requeued, self.lost = 0, {}


PROBE: PoolStats | None = None


@dataclass
class Wave:
    in_time: int = 0
    ttft: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    lag: list[float] = field(default_factory=list)
    connections: int = 0
    cpu: float = 0.0
    requeued: int | None = None
    lost: list[float] = field(default_factory=list)


async def one_call(client: openai.AsyncOpenAI, go: anyio.Event, wave: Wave) -> None:
    await go.wait()
    start = time.perf_counter()
    first: float | None = None
    try:
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - start
    except openai.APIError as exc:
        wave.failures[getattr(exc, "code", None) or type(exc).__name__] += 1
        return
    if first is None:
        wave.failures["no token"] += 1
        return
    wave.ttft.append(first)
    wave.in_time += first <= WITHIN


async def run_wave(client: openai.AsyncOpenAI, calls: int, stats: httpx.AsyncClient, url: str) -> Wave:
    wave = Wave()
    before = await server_connections(stats, url)
    lag = h.LoopLag()
    go = anyio.Event()
    cpu = h.cpu_seconds()
    if PROBE is not None:
        PROBE.take(Wave())
    async with anyio.create_task_group() as tg:
        tg.start_soon(lag.run)
        async with anyio.create_task_group() as tasks:
            for _ in range(calls):
                tasks.start_soon(one_call, client, go, wave)
            await anyio.sleep(0.05)  # every task is waiting on `go`
            go.set()
        tg.cancel_scope.cancel()
    wave.cpu = h.cpu_seconds() - cpu
    wave.lag = lag.take()
    if PROBE is not None:
        PROBE.take(wave)
    wave.connections = await server_connections(stats, url) - before
    return wave


async def server_connections(stats: httpx.AsyncClient, url: str) -> int:
    """Connections the server has accepted so far (``stats`` keeps its own one connection alive)."""
    return int((await stats.get(url + "/stats")).json().get("connections", 0))


def ms(values: list[float], q: float) -> str:
    value = percentile(values, q)
    return "-" if value is None else f"{value * 1000:.0f}"


def row(run: int, index: int, client: str, wave: Wave, raw: Wave | None) -> str:
    ratio = "" if raw is None else f"{wave.in_time / raw.in_time:.2f}" if raw.in_time else "-"
    failures = ", ".join(f"{k} {v}" for k, v in wave.failures.most_common()) or "-"
    errors = sum(wave.failures.values())
    pool = "" if wave.requeued is None else f"{wave.requeued} | {len(wave.lost)} | {ms(wave.lost, 100)} | "
    return (
        f"| {run} | {index + 1}{' (cold)' if index == 0 else ''} | {client} | {wave.in_time} | {errors} | "
        f"{ms(wave.ttft, 50)} / {ms(wave.ttft, 99)} | {ms(wave.lag, 99)} | {wave.connections} | {wave.cpu:.2f} | "
        f"{pool}{ratio or '-'} | {failures} |"
    )


def guard_limits(args: argparse.Namespace) -> httpx.Limits:
    """The guard's pool limits: its default, with ``--pool-connections`` and ``--keepalive-expiry`` if given."""
    keepalive = args.pool_connections
    if keepalive is None:
        keepalive = DEFAULT_POOL_LIMITS.max_keepalive_connections
    return httpx.Limits(
        max_connections=DEFAULT_POOL_LIMITS.max_connections,
        max_keepalive_connections=keepalive,
        keepalive_expiry=args.keepalive_expiry,
    )


async def run(url: str, args: argparse.Namespace, number: int) -> list[tuple[Wave | None, Wave | None]]:
    expiry = args.keepalive_expiry
    limits = guard_limits(args)
    tiers = {"burst": Tier(ttft=args.ttft, total=30.0, stall=5.0)}
    pairs: list[tuple[Wave | None, Wave | None]] = []
    own = (
        None
        if expiry == 5.0
        else openai.DefaultAsyncHttpxClient(  # the SDK's own pool limits, another expiry
            limits=httpx2.Limits(max_connections=1000, max_keepalive_connections=100, keepalive_expiry=expiry)
        )
    )
    async with Guard([url], tiers=tiers, pool_limits=limits) as guard, httpx.AsyncClient() as stats:
        raw = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk", max_retries=0, http_client=own)
        guarded = openai.AsyncOpenAI(
            base_url=url + "/v1", api_key="sk", max_retries=0, http_client=guard.http_client_for(openai.AsyncOpenAI)
        )
        for index in range(args.waves):
            waves: list[Wave | None] = []
            for name, client in (("raw openai", raw), ("guarded", guarded)):
                if name.split()[0] not in args.clients:
                    waves.append(None)
                    continue
                waves.append(await run_wave(client, args.calls, stats, url))
                await anyio.sleep(args.pause)
            raw_wave, guarded_wave = waves
            if raw_wave is not None:
                print(row(number, index, "raw openai", raw_wave, None), flush=True)
            if guarded_wave is not None:
                print(row(number, index, "guarded", guarded_wave, raw_wave), flush=True)
            pairs.append((raw_wave, guarded_wave))
        await raw.close()
        await guarded.close()
    return pairs


async def main(args: argparse.Namespace) -> bool:
    replica_opts = ["--first-token-delay", "0.036", "--tokens", "8", "--gap", "0.002"]
    with h.replica_processes([replica_opts]) as (url,):
        print(
            f"measured: {llmguard_client.__file__}; openai {openai.__version__}; {args.calls} calls per wave, "
            f"{args.waves} waves; guard: tier ttft {args.ttft} s, pool {h.label(guard_limits(args))} per "
            f"replica; keep-alive expiry {args.keepalive_expiry} s"
        )
        print()
        pool = "re-queued | calls re-queued | longest wait before it, ms | " if PROBE else ""
        print(
            "| run | wave | client | first token within 1 s | errors | TTFT p50 / p99 ms | loop lag p99 ms "
            f"| new connections | client CPU s | {pool}guarded / raw | failures |"
        )
        print("|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if PROBE else "") + "---|---|")
        pairs = [pair for number in range(1, args.runs + 1) for pair in await run(url, args, number)]
    warm = [(r, g) for i, (r, g) in enumerate(pairs) if i % args.waves and r is not None and g is not None]
    met = all(g.in_time >= r.in_time - 0.02 * args.calls for r, g in warm)
    print()
    print(
        f"every warm wave guarded >= raw - 2 % of calls: {met} "
        f"(guarded - raw per warm wave: {', '.join(str(g.in_time - r.in_time) for r, g in warm) or '-'})"
    )
    return met


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.burst", description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=250, help="concurrent calls per wave")
    parser.add_argument("--waves", type=int, default=3, help="waves per client (the first one cold)")
    parser.add_argument(
        "--pool-connections",
        type=int,
        default=None,
        help="the guard's max_keepalive_connections per replica (default: DEFAULT_POOL_LIMITS)",
    )
    parser.add_argument("--ttft", type=float, default=5.0, help="the guard tier's ttft deadline, seconds")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between two waves")
    parser.add_argument("--runs", type=int, default=1, help="times the whole sequence is repeated, fresh clients")
    parser.add_argument(
        "--keepalive-expiry",
        type=float,
        default=5.0,
        help="seconds an idle connection is kept, in both clients' pools (default 5: both defaults)",
    )
    parser.add_argument(
        "--clients",
        nargs="+",
        choices=("raw", "guarded"),
        default=["raw", "guarded"],
        help="which clients run (one alone: to profile it)",
    )
    parser.add_argument("--pool-stats", action="store_true", help="count re-queues in the pools (see PoolStats)")
    args = parser.parse_args()
    if args.pool_stats:
        global PROBE
        PROBE = PoolStats()
        PROBE.install()
    if args.calls < 1 or args.waves < 1 or args.runs < 1 or (args.pool_connections or 0) < 0:
        parser.error("--calls, --waves and --runs must be >= 1, --pool-connections >= 0")
    if not anyio.run(main, args):
        sys.exit(1)


if __name__ == "__main__":
    cli()
