"""``llmguard bench --sim SCENARIO --processes N [--fleet URL|auto]``: N client processes against one provider limit.

The scenario's cluster (which enforces a provider `RateLimit` over every replica) runs in this process; for each
client mode N worker processes (`llmguard_tools.bench.fleet_worker`) each send ``rate / N`` rps for the run's
duration, all starting at one instant:

- ``plain``: httpx, one request per call (a 429 fails the call);
- ``guarded per-process``: a `Guard` each, with the provider's limit divided by N;
- ``guarded fleet``: a `Guard` each with the whole limit, its bucket shared through Redis (``--fleet``).

Fleet totals side by side: calls, 429s the provider sent (and per call), server requests per call, calls the
guard refused itself (`RateLimited`), calls that failed otherwise by cause (e.g. ``ttft_timeout``: let through,
then no first token in time), goodput (completed calls per second) and TTFT p50/p99.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

DEFAULT_DURATION = 20.0
"""Seconds of traffic per client mode."""


@contextlib.contextmanager
def fleet_url(spec: str | None) -> Iterator[str | None]:
    """``--fleet``: a Redis URL, ``auto`` (a local ``redis-server`` on a free port, stopped afterwards) or None."""
    if spec != "auto":
        yield spec
        return
    server = shutil.which("redis-server")
    if server is None:
        raise RuntimeError("--fleet auto needs redis-server on PATH (e.g. apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if process.poll() is not None:
                raise RuntimeError(f"--fleet auto: redis-server exited at start on port {port}")
            try:  # a PONG, not an accepted connection: a connect loop on a free port can connect to itself
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(64).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            time.sleep(0.05)
        else:
            raise RuntimeError(f"--fleet auto: redis-server did not answer on port {port} within 10 s")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait()


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _mode(cluster: Any, mode: str, spec: dict[str, Any], processes: int) -> dict[str, Any]:
    provider = cluster.provider
    provider.reset()
    received_before = sum(r.counters.received for r in cluster.replicas)
    start_at = time.time() + 2.0 + 0.5 * processes  # every worker imported and ready before it
    workers: list[asyncio.subprocess.Process] = []
    results = []
    try:
        for i in range(processes):
            job = {**spec, "mode": mode, "seed": spec["seed"] * 1000 + i, "start_at": start_at}
            workers.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "llmguard_tools.bench.fleet_worker",
                    json.dumps(job),
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,  # reported when it fails; not on the terminal at a Ctrl-C
                    env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                )
            )
        for worker in workers:
            out, err = await worker.communicate()
            if worker.returncode != 0:
                last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
                raise RuntimeError(f"a bench worker ({mode}) failed with exit code {worker.returncode}: {last}")
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
    finally:  # one worker failed (or the run was cancelled): the others are not left running
        for worker in workers:
            if worker.returncode is None:
                with contextlib.suppress(ProcessLookupError):  # ended, not yet collected
                    worker.kill()
                await worker.wait()
    calls = sum(r["calls"] for r in results)
    failed: dict[str, int] = {}
    for r in results:
        for cause, n in r["failed"].items():
            failed[cause] = failed.get(cause, 0) + n
    ttfts = [t for r in results for t in r["ttfts"]]
    server_requests = sum(r.counters.received for r in cluster.replicas) - received_before
    return {
        "mode": mode,
        "calls": calls,
        "provider_429": provider.counters.limited,
        "server_requests": server_requests,
        "refused_by_guard": sum(r["refused"] for r in results),
        "completed": sum(r["ok"] for r in results),
        "goodput": sum(r["ok"] for r in results) / spec["duration"],
        "ttft_p50": _quantile(ttfts, 0.5),
        "ttft_p99": _quantile(ttfts, 0.99),
        "fleet_transitions": sum(r["fleet_transitions"] for r in results),
        "failed": failed,
    }


def render(rows: list[dict[str, Any]], title: str) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f} ms"

    def others(failed: dict[str, int]) -> str:
        rest = {cause: n for cause, n in failed.items() if cause not in ("rate_limited", "http_429")}
        return ", ".join(f"{n} {cause}" for cause, n in sorted(rest.items())) or "0"

    lines = [
        title,
        "",
        "| client | calls | 429s from the provider | server requests / call | refused by the guard "
        "| failed otherwise | goodput (completed/s) | TTFT p50 | TTFT p99 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        calls = max(1, r["calls"])
        lines.append(
            f"| {r['mode']} | {r['calls']} | {r['provider_429']} ({100 * r['provider_429'] / calls:.1f} %) "
            f"| {r['server_requests'] / calls:.2f} | {r['refused_by_guard']} | {others(r['failed'])} "
            f"| {r['goodput']:.2f} "
            f"| {ms(r['ttft_p50'])} | {ms(r['ttft_p99'])} |"
        )
    return "\n".join(lines)


async def _run(args: argparse.Namespace, fleet_url: str | None) -> list[dict[str, Any]]:
    from llmguard_tools.sim.cluster import SimCluster
    from llmguard_tools.sim.scenarios import get_scenario

    scenario = get_scenario(args.sim, args.replicas)
    limit = scenario.rate_limit
    if limit is None:
        raise RuntimeError(f"--processes needs a scenario with a provider rate limit (ratelimited), not {args.sim}")
    n = args.processes
    rps_limit = (limit.requests_per_minute or 0) / 60.0
    rate = args.rate or 2.0 * rps_limit
    tier = (args.tier_ttft or 2.0, args.tier_total or 20.0)
    spec: dict[str, Any] = {
        "rate": rate / n,
        "duration": DEFAULT_DURATION,
        "ttft": tier[0],
        "total": tier[1],
        "seed": args.seed,
        "fleet_url": fleet_url,
        "run_id": f"bench{os.getpid()}",
        "connect": args.fleet_connect,
    }
    whole = {
        "requests_per_minute": limit.requests_per_minute,
        "tokens_per_minute": limit.tokens_per_minute,
        "burst": limit.burst,
    }
    share = {k: (v / n if k != "burst" and v is not None else v) for k, v in whole.items()}
    rows = []
    async with SimCluster(scenario, seed=args.seed) as cluster:
        spec["urls"] = cluster.urls
        rows.append(await _mode(cluster, "plain", spec, n))
        rows.append({**await _mode(cluster, "local", {**spec, "limit": share}, n), "mode": "guarded per-process"})
        if fleet_url is not None:
            rows.append({**await _mode(cluster, "fleet", {**spec, "limit": whole}, n), "mode": "guarded fleet"})
    return rows


def run_processes(args: argparse.Namespace) -> int:
    """Run the three client modes and print the fleet totals (and write ``--json``)."""
    if not args.sim:
        raise RuntimeError("--processes needs --sim (a scenario whose cluster enforces a provider rate limit)")
    with fleet_url(args.fleet) as url:
        rows = asyncio.run(_run(args, url))
    from llmguard_tools.sim.scenarios import get_scenario

    limit = get_scenario(args.sim).rate_limit
    connect = "" if args.fleet_connect == "early" else ", fleet stores connecting on the first call"
    title = (
        f"sim:{args.sim}, {args.processes} processes, provider limit {limit}, "
        f"{DEFAULT_DURATION:.0f} s per client{connect}"
    )
    print(render(rows, title))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0
