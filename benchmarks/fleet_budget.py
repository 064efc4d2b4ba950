"""The retry budget across a fleet: extra attempts per call with ``BudgetPolicy(scope="fleet")`` against
``scope="process"``, several processes calling one failing service, both scopes in the same run.

One replica process serves two replica URLs and fails the first attempt of every call with a 500 (a call is
known by its ``x-call`` header; its retry, on the other replica, succeeds). Each scenario runs once per scope:
``--processes`` worker processes, each with its own ``Guard(fleet=..., name=...)`` (a name per scenario and
scope, so no run sees another's counters), enter their Guard, wait until the store is connected, start
together, and make their calls one at a time, paced. Retries only (no hedging): ``RetryPolicy(max_attempts=2)``
and a budget of ``ratio`` x calls + ``floor`` over ``window`` s (all calls of a run fit in one window). The
replica counts the attempts, so extra attempts = attempts - calls.

Scenarios: ``even`` (every process makes ``--calls`` calls, all failing once), ``quiet`` (every process
makes ``--calls // 6``: the floors weigh), ``one-failing`` (only process 0's calls fail once; the others'
succeed at once, so their calls earn budget that process 0 may spend with ``scope="fleet"``).

    python -m benchmarks.fleet_budget [--processes 4] [--calls 150] [--rate 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import time
from typing import Any

import anyio
import httpx

from llmguard_client import BudgetPolicy, Guard, RetryPolicy, Tier
from tests.redis_server import RedisServer

RATIO, FLOOR, WINDOW = 0.1, 3, 10.0


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: set[str], stats: Any) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            length = int(headers.get("content-length", "0"))
            if length:
                await reader.readexactly(length)
            if lines[0].startswith("GET /stats"):
                body, status = json.dumps(stats).encode(), "200 OK"
            else:
                call = headers.get("x-call", "")
                stats["attempts"] += 1
                fail = call.startswith("f") and call not in seen
                seen.add(call)
                status = "500 Internal Server Error" if fail else "200 OK"
                body = b'{"error": {"message": "first attempt fails"}}' if fail else b'{"choices": []}'
            writer.write(
                f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def _serve(queue: Any) -> None:
    async def main() -> None:
        seen: set[str] = set()
        stats = {"attempts": 0}
        server = await asyncio.start_server(lambda r, w: _handle(r, w, seen, stats), "127.0.0.1", 0)
        queue.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


async def _call(client: httpx.AsyncClient, url: str, call: str) -> bool:
    response = await client.post(
        url + "/v1/chat/completions", json={"model": "m", "messages": []}, headers={"x-call": call}
    )
    return response.status_code == 200


def _worker(index: int, args: tuple[Any, ...], barrier: Any, results: Any) -> None:
    base, fleet, name, scope, calls, rate, failing = args

    logging.getLogger("llmguard_client").setLevel(logging.ERROR)  # the failing replicas' warnings

    async def main() -> None:
        guard = Guard(
            [base + "/a", base + "/b"],
            tiers={"i": Tier(ttft=5, total=10)},
            hedge=None,
            retry=RetryPolicy(max_attempts=2, backoff_initial=0.001, backoff_max=0.001, circuit_failures=10**6),
            budget=BudgetPolicy(ratio=RATIO, floor=FLOOR, window=WINDOW, scope=scope),
            fleet=fleet,
            name=name,
            failure_mode="response",
            instrumentation=None,
        )
        async with guard, guard.http_client() as client:
            while not (guard.snapshot().fleet and guard.snapshot().fleet.connected):  # noqa: ASYNC110
                await anyio.sleep(0.01)
            await anyio.to_thread.run_sync(barrier.wait)
            start = time.monotonic()
            ok = 0
            for i in range(calls):
                await anyio.sleep(max(0.0, start + i / rate - time.monotonic()))
                ok += await _call(client, base, f"{'f' if failing else 'o'}{name}-{index}-{i}")
            snap = guard.snapshot().budget
            assert snap is not None
            results.put((index, calls, ok, snap.refused))

    anyio.run(main)


async def _attempts(base: str) -> int:
    async with httpx.AsyncClient() as client:
        return int((await client.get(base + "/stats")).json()["attempts"])


async def run(base: str, fleet: str, scenario: str, scope: str, processes: int, calls: int, rate: float) -> str:
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    per = calls // 6 if scenario == "quiet" else calls
    name = f"bench-{scenario}-{scope}-{int(time.time() * 1000) % 10**6}"
    workers = [
        ctx.Process(
            target=_worker,
            args=(i, (base, fleet, name, scope, per, rate, scenario != "one-failing" or i == 0), barrier, results),
        )
        for i in range(processes)
    ]
    before = await _attempts(base)
    for w in workers:
        w.start()
    got = [await anyio.to_thread.run_sync(results.get, True, 120) for _ in workers]
    for w in workers:
        w.join(30)
    extras = await _attempts(base) - before - sum(c for _, c, _, _ in got)
    total = sum(c for _, c, _, _ in got)
    failed_first = per if scenario == "one-failing" else total
    ok = sum(o for _, _, o, _ in got)
    floors = FLOOR if scope == "fleet" else FLOOR * processes
    bound = RATIO * total + floors
    return (
        f"| {scenario} | {scope} | {total} | {failed_first} | {extras} | {extras / total:.3f} | "
        f"{bound / total:.3f} | {ok / total:.3f} |"
    )


async def main(processes: int, calls: int, rate: float) -> None:
    queue: Any = multiprocessing.get_context("spawn").Queue()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(queue,), daemon=True)
    server.start()
    base = f"http://127.0.0.1:{queue.get(timeout=30)}"
    store = RedisServer()
    store.start()
    rows = []
    try:
        for scenario in ("even", "quiet", "one-failing"):
            for scope in ("process", "fleet"):
                rows.append(await run(base, store.url, scenario, scope, processes, calls, rate))
    finally:
        store.stop()
        server.terminate()
    print(f"{processes} processes, ratio {RATIO}, floor {FLOOR}, window {WINDOW:g} s, {rate:g} calls/s per process")
    print("| scenario | scope | calls | calls failing once | extra attempts | extra / calls | bound / calls | ok |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--calls", type=int, default=150, help="calls per process (a sixth of it in 'quiet')")
    parser.add_argument("--rate", type=float, default=50.0, help="calls per second per process")
    a = parser.parse_args()
    anyio.run(main, a.processes, a.calls, a.rate)
