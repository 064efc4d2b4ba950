"""Pool limits under a burst: waves of concurrent streamed calls, one Guard per pool setting.

    python -m benchmarks.pool_burst [--wave 250] [--waves 3] [--repeats 2] [--ttft 1.0] [--pool-stats]
                                    [--limits 1000,100 1000,20 ...] [--scenarios healthy dead2 plain fixed]

One healthy replica (`llmguard_tools.sim.light` in its own process, first token after 36 ms, then
8 tokens 2 ms apart). For each pool setting ``max_connections,max_keepalive_connections`` (``None``:
no limit), a fresh ``Guard(pool_limits=httpx.Limits(...))`` sends ``--waves`` waves of ``--wave``
streamed calls released at the same instant (the first wave on a cold pool, the next ones on the
connections it kept), each read to its end. Scenario ``healthy``: the Guard has that one replica;
``dead2``: two more replicas that refuse connections (hedges and retries on, the defaults);
``plain``: no Guard, a plain ``httpx.AsyncClient`` with the same pool limits and no deadline (is
it the pool or the guard?); ``fixed``: as ``healthy``, with httpcore's pool assignment pass replaced
by a single-pass one (`benchmarks._fixed_pool`, a diagnostic of the cause).

Per wave: calls that succeeded (the whole stream read), the callers' time to first token p50/p99
(successes), how late a 10 ms sleep woke while the wave ran (event-loop lag, p99 and max), new TCP
connections the server accepted, and the client's CPU seconds. Settings are interleaved, and each is
run ``--repeats`` times: the machine is shared and the numbers are noisy.
"""

from __future__ import annotations

import argparse
import math
import statistics
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

import llmguard_client
from benchmarks import _harness as h
from benchmarks._fixed_pool import use_single_pass_assignment
from llmguard_client import Guard, Tier
from llmguard_client._routing.quantile import percentile

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
SCENARIOS = ("healthy", "dead2", "plain", "fixed")


@dataclass
class Wave:
    ok: int = 0
    ttft: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    lag: list[float] = field(default_factory=list)
    connections: int = 0
    cpu: float = 0.0
    idle_after: bool = True
    assigns: int = 0
    assign_seconds: float = 0.0
    requeued: int = 0


class PoolProbe:
    """``--pool-stats``: counts, in httpcore's pool, calls of ``_assign_requests_to_connections`` and
    the CPU time they take, and requests put back in the queue after their assigned connection turned
    out to be taken already (``ConnectionNotAvailable``). A diagnostic: it wraps private methods."""

    def __init__(self) -> None:
        self.assigns = 0
        self.seconds = 0.0
        self.requeued = 0

    def timed(self, assign: Any) -> Any:
        """``assign`` counted, and its CPU time (not inflated when the machine preempts us) added up."""
        probe = self

        def timed_assign(*args: Any) -> Any:
            start = time.thread_time()
            try:
                return assign(*args)
            finally:
                probe.assigns += 1
                probe.seconds += time.thread_time() - start

        return timed_assign

    def install(self) -> None:
        from httpcore._async import connection_pool as cp

        timed_assign = self.timed(cp.AsyncConnectionPool._assign_requests_to_connections)
        clear = cp.AsyncPoolRequest.clear_connection
        probe = self

        def counted_clear(request: Any) -> None:
            probe.requeued += 1
            clear(request)

        cp.AsyncConnectionPool._assign_requests_to_connections = timed_assign  # type: ignore[method-assign]
        cp.AsyncPoolRequest.clear_connection = counted_clear  # type: ignore[method-assign, assignment]

    def take(self, wave: Wave) -> None:
        wave.assigns, wave.assign_seconds, wave.requeued = self.assigns, self.seconds, self.requeued
        self.assigns, self.seconds, self.requeued = 0, 0.0, 0


PROBE: PoolProbe | None = None


async def one_call(client: httpx.AsyncClient, go: anyio.Event, wave: Wave) -> None:
    await go.wait()
    start = time.perf_counter()
    try:
        async with client.stream("POST", "/chat/completions", json=BODY) as response:
            if response.status_code != 200:
                await response.aread()
                wave.failures[f"HTTP {response.status_code} {response.headers.get('x-llmguard-cause', '')}"] += 1
                return
            first: float | None = None
            body = b""
            async for chunk in response.aiter_raw():
                if first is None:
                    first = time.perf_counter() - start
                body += chunk
            if not body.endswith(b"data: [DONE]\n\n") or first is None:
                wave.failures["incomplete stream"] += 1
                return
    except httpx.HTTPError as exc:
        wave.failures[getattr(exc, "cause", None) or type(exc).__name__] += 1
        return
    wave.ok += 1
    wave.ttft.append(first)


async def server_connections(stats: httpx.AsyncClient, url: str) -> int:
    """Connections the server has accepted so far (``stats`` keeps its own one connection alive)."""
    return int((await stats.get(url + "/stats")).json().get("connections", 0))


def fixed_transport(limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    transport = use_single_pass_assignment(httpx.AsyncHTTPTransport(limits=limits, retries=0))
    if PROBE is not None:
        pool: Any = transport._pool
        pool._assign_requests_to_connections = PROBE.timed(pool._assign_requests_to_connections)
    return transport


async def run_setting(urls: list[str], limits: httpx.Limits, args: argparse.Namespace, scenario: str) -> list[Wave]:
    guard: Guard | None = None
    tiers = {"burst": Tier(ttft=args.ttft, total=20.0, stall=5.0)}
    if scenario == "plain":
        transport = httpx.AsyncHTTPTransport(limits=limits, retries=0)
        client = httpx.AsyncClient(transport=transport, base_url=urls[0] + "/v1", timeout=None)
    elif scenario == "fixed":
        guard = Guard(urls, tiers=tiers, transport_factory=lambda _: fixed_transport(limits))
        client = guard.http_client(base_url=urls[0] + "/v1")
    else:
        guard = Guard(urls, tiers=tiers, pool_limits=limits)
        client = guard.http_client(base_url=urls[0] + "/v1")
    waves: list[Wave] = []
    async with httpx.AsyncClient() as stats:
        for _ in range(args.waves):
            wave = Wave()
            before = await server_connections(stats, urls[0])
            lag = h.LoopLag()
            go = anyio.Event()
            cpu = h.cpu_seconds()
            if PROBE is not None:
                PROBE.take(Wave())
            async with anyio.create_task_group() as tg:
                tg.start_soon(lag.run)
                async with anyio.create_task_group() as calls:
                    for _ in range(args.wave):
                        calls.start_soon(one_call, client, go, wave)
                    await anyio.sleep(0.05)  # every task is waiting on `go`
                    go.set()
                tg.cancel_scope.cancel()
            wave.cpu = h.cpu_seconds() - cpu
            if PROBE is not None:
                PROBE.take(wave)
            wave.lag = lag.take()
            wave.connections = await server_connections(stats, urls[0]) - before
            wave.idle_after = guard.snapshot().idle if guard is not None else True
            waves.append(wave)
            await anyio.sleep(args.pause)
    await client.aclose()
    if guard is not None:
        await guard.aclose()
    return waves


def ms(values: list[float], q: float) -> str:
    value = percentile(values, q)
    return "-" if value is None else f"{value * 1000:.0f}"


def wave_cell(wave: Wave) -> str:
    return f"{wave.ok} | {ms(wave.ttft, 50)} / {ms(wave.ttft, 99)} | {ms(wave.lag, 99)} / {ms(wave.lag, 100)}"


async def main(args: argparse.Namespace) -> None:
    results: dict[tuple[str, str], list[list[Wave]]] = {}
    healthy_opts = ["--first-token-delay", "0.036", "--tokens", "8", "--gap", "0.002"]
    with h.replica_processes([healthy_opts]) as (healthy,):
        deployments = {
            "healthy": [healthy],
            "dead2": [healthy, h.dead_url(), h.dead_url()],
            "plain": [healthy],
            "fixed": [healthy],
        }
        print(
            f"measured: {llmguard_client.__file__}; {args.wave} calls per wave, {args.waves} waves, "
            f"tier ttft {args.ttft} s; one row per run (settings interleaved)"
        )
        print()
        print(
            "| scenario | pool (max_connections, max_keepalive) | run | "
            + " | ".join(f"wave {i + 1} ok | TTFT p50 / p99 ms | loop lag p99 / max ms" for i in range(args.waves))
            + " | new connections per wave | client CPU s per wave | idle after each wave"
            + (" | pool: assign calls / CPU s in them / requeued, per wave" if PROBE is not None else "")
            + " | failures |"
        )
        print("|---|---|---|" + "---|---|---|" * args.waves + "---|---|---|" + ("---|" if PROBE else "") + "---|")
        for run in range(1, args.repeats + 1):
            for scenario in args.scenarios:
                for limits in args.limits:
                    waves = await run_setting(deployments[scenario], limits, args, scenario)
                    results.setdefault((scenario, h.label(limits)), []).append(waves)
                    failures: Counter[str] = Counter()
                    for wave in waves:
                        failures.update(wave.failures)
                    print(
                        f"| {scenario} | {h.label(limits)} | {run} | "
                        + " | ".join(wave_cell(w) for w in waves)
                        + f" | {', '.join(str(w.connections) for w in waves)}"
                        + f" | {', '.join(f'{w.cpu:.2f}' for w in waves)}"
                        + f" | {all(w.idle_after for w in waves)}"
                        + (
                            f" | {', '.join(f'{w.assigns}/{w.assign_seconds:.2f}/{w.requeued}' for w in waves)}"
                            if PROBE is not None
                            else ""
                        )
                        + f" | {', '.join(f'{k} {v}' for k, v in failures.most_common()) or '-'} |",
                        flush=True,
                    )
    print()
    print("Summary (successes per wave: every run; the rest: median over the warm waves of every run):")
    print()
    print(
        "| scenario | pool | successes wave 1 / 2 / 3 ... | warm waves TTFT p50 / p99 ms | "
        "warm waves loop lag p99 / max ms | warm waves client CPU s | warm waves pool CPU s / requeued |"
    )
    print("|---|---|---|---|---|---|---|")
    for (scenario, name), runs in results.items():
        per_wave = " / ".join(",".join(str(r[i].ok) for r in runs) for i in range(args.waves))
        warm = [w for r in runs for w in r[1:]]

        def med(pick: str, q: float, waves: list[Wave] = warm) -> str:
            values = [percentile(getattr(w, pick), q) for w in waves]
            present = [v for v in values if v is not None]
            return f"{statistics.median(present) * 1000:.0f}" if present else "-"

        cpu = statistics.median(w.cpu for w in warm) if warm else math.nan
        pool = (
            (
                f"{statistics.median(w.assign_seconds for w in warm):.2f} / "
                f"{statistics.median(w.requeued for w in warm):.0f}"
            )
            if warm and PROBE is not None
            else "-"
        )
        print(
            f"| {scenario} | {name} | {per_wave} | {med('ttft', 50)} / {med('ttft', 99)} | "
            f"{med('lag', 99)} / {med('lag', 100)} | {cpu:.2f} | {pool} |"
        )


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pool_burst", description=__doc__.split("\n")[0])
    parser.add_argument("--wave", type=int, default=250, help="concurrent calls per wave")
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ttft", type=float, default=1.0, help="the tier's ttft deadline, seconds")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between waves")
    parser.add_argument(
        "--limits",
        type=h.parse_limits,
        nargs="+",
        default=[h.parse_limits(s) for s in ("1000,100", "1000,20", "100,20", "256,64", "None,20", "None,256")],
        metavar="MAX,KEEPALIVE",
    )
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--pool-stats", action="store_true", help="count work inside httpcore's pool (see PoolProbe)")
    args = parser.parse_args()
    if args.pool_stats:
        global PROBE
        PROBE = PoolProbe()
        PROBE.install()
    if args.wave < 1 or args.waves < 1 or args.repeats < 1:
        parser.error("--wave, --waves and --repeats must be >= 1")
    anyio.run(main, args)


if __name__ == "__main__":
    cli()
