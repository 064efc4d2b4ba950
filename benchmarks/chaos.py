"""Every fault together, against real parts, for minutes: checks invariants, not averages.

N client processes, each with its own Guard (``fleet=`` a real ``redis-server``, a fleet-wide budget, a rate
limit that never binds so each attempt asks Redis, continuation on, chaos mode on), each making streamed calls
with a few callers at once. Simulated replicas (``python -m llmguard_tools.sim --replicas 1``), one process
each behind a `PartitionProxy` that keeps its address while the process behind it is killed and restarted. Redis
behind a proxy too. Faults, by a fixed cycle and at random (seeded), overlapping:

- a replica killed (SIGKILL) and restarted, paused (SIGSTOP) and resumed, partitioned (its proxy black-holes);
- Redis killed and restarted empty, paused, partitioned;
- chaos storms in the clients (`Chaos`: 429s with Retry-After and 503s at high rates), over a background of
  every injected fault at low rates (429, 503, reset, stall, cut, latency).

The last fault is a Redis kill; during it client 0 gets cool-downs of its own (a 30 s Retry-After's, of every
replica, set in its replica states as a real 429 sets one: what an injected fault teaches is never shared), which
it can share only by its resync once Redis is back. From
that fault's start no client injects anything else: the chaos mode's faults are faults too, and a winning probe
of another client's cool-down of the same replica would rightly end client 0's everywhere.

Invariants checked (each printed with its figures, and a verdict):

1. no call failed because of Redis: every failed call is explained by a replica fault (an attempt marked by
   chaos, or the call overlapping a fault of a replica, plus the circuit's cool-down after it);
2. no call took longer than its deadline (the tier's ttft for a call with no first token, else its total) plus
   ``--bound-ms``, after subtracting the stalls of its own event loop (a starved CPU delays every wake-up);
3. every client's leak counters are back to zero once its callers stopped: calls and attempts in flight,
   budget tickets (``guard.snapshot().idle``), and no connection open after ``aclose``;
4. shared state agrees within ``--agree-s`` after the last fault (from when the restarted Redis answered): every
   client is connected to the store again and sees client 0's cool-down (no other lasts over 10 s).

Fault windows are the times each fault was in force: from its start to when its end was done (a restarted
replica or Redis answering), which on a busy machine is later than scheduled.

    python -m benchmarks.chaos [--minutes 3] [--processes 4] [--callers 4] [--every 4] [--seed 1]

Against your own deployment: ``--replicas URL ...`` (no replica faults but chaos mode) and ``--redis HOST:PORT``
(Redis faults by partition only, through the proxy).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REDIS_KINDS = ("redis_kill", "redis_stop", "redis_partition")
REPLICA_KINDS = ("replica_kill", "replica_stop", "replica_partition")
KINDS = (*REPLICA_KINDS, *REDIS_KINDS, "storm")
TTFT, TOTAL, STALL = 2.0, 8.0, 1.5
"""The one tier every call uses (seconds)."""
CIRCUIT_AFTER = 6.0
"""Seconds after a replica fault ends during which a failure is still the replica's: its circuit's cool-down
(5 s) and a probe."""
WARMUP, SETTLE = 4.0, 10.0
"""Seconds before the first fault; seconds of calls after the last one (the agreement is measured in them)."""
PROBE_RETRY_AFTER = 30.0


@dataclass
class Fault:
    start: float
    """Seconds after the run's start."""
    end: float
    kind: str
    target: int = 0
    """The replica's index (replica faults)."""


@dataclass
class Plan:
    t0: float
    """Wall-clock start (time.time()). Every other time is in seconds after it; a fault's ``end`` is moved to
    when its end was done (a replica's or Redis's restart answering) once the run has applied it."""
    duration: float
    urls: list[str]
    redis: str
    callers: int
    seed: int
    faults: list[Fault] = field(default_factory=list)
    last_fault_end: float = 0.0
    probe: float = 0.0
    """When client 0 gets its cool-downs (seconds after the start)."""
    quiet: float = 0.0
    """When every client stops injecting chaos (the final fault's start): after the last fault nothing is
    injected, and client 0's cool-downs are set, so the state the clients must agree on is what the faults left."""

    @property
    def calls_end(self) -> float:
        return self.duration - 1.0


def make_faults(duration: float, every: float, seed: int, replicas: int, kinds: tuple[str, ...]) -> list[Fault]:
    """A fixed cycle through ``kinds`` every ``every`` s, plus as many again at random times, overlapping; one
    fault per target at a time, never every replica at once; all over before the final Redis kill (or partition,
    when Redis cannot be killed)."""
    rng = random.Random(seed)
    last_start = duration - SETTLE - 3.0
    wanted: list[Fault] = []
    t, i = WARMUP, 0
    while t + 2.0 < last_start - 4.0:
        kind = kinds[i % len(kinds)]
        length = 3.0 if kind == "redis_partition" else 2.0
        wanted.append(Fault(t, t + length, kind, i % replicas))
        i += 1
        t += every
    t = WARMUP
    while True:
        t += rng.expovariate(1.0 / every)
        length = rng.uniform(0.5, 3.0)
        if t + length >= last_start - 4.0:
            break
        wanted.append(Fault(t, t + length, rng.choice(kinds), rng.randrange(replicas)))
    kept: list[Fault] = []
    for fault in sorted(wanted, key=lambda f: f.start):
        overlapping = [k for k in kept if k.start < fault.end and fault.start < k.end]
        if fault.kind in REDIS_KINDS and any(k.kind in REDIS_KINDS for k in overlapping):
            continue
        if fault.kind in REPLICA_KINDS:
            busy = {k.target for k in overlapping if k.kind in REPLICA_KINDS}
            if fault.target in busy or len(busy) + 1 >= replicas:
                continue
        if fault.kind == "storm" and any(k.kind == "storm" for k in overlapping):
            continue
        kept.append(fault)
    final = next((k for k in ("redis_kill", "redis_partition") if k in kinds), None)  # your own Redis: partitioned
    if final is not None:
        kept.append(Fault(last_start, last_start + 3.0, final))
    return kept


# --- the client processes --------------------------------------------------------------------------


def worker(plan_path: Path, index: int, out_path: Path) -> None:
    import anyio

    result = anyio.run(_worker, Plan(**_load(plan_path)), index)
    out_path.write_text(json.dumps(result))


def _load(path: Path) -> dict[str, Any]:
    raw = json.loads(path.read_text())
    raw["faults"] = [Fault(**f) for f in raw["faults"]]
    return dict(raw)


async def _worker(plan: Plan, index: int) -> dict[str, Any]:
    import anyio
    import httpx

    from llmguard_client import (
        BudgetPolicy,
        Chaos,
        ContinuationPolicy,
        Guard,
        PhaseRecord,
        RateLimit,
        Tier,
        guard_failure,
    )

    background = Chaos(
        rate_limited=0.01,
        unavailable=0.01,
        reset=0.005,
        stall=0.005,
        stall_for=3.0,
        cut=0.005,
        latency=0.02,
        latency_for=0.05,
        seed=plan.seed * 100 + index,
    )
    storm = Chaos(rate_limited=0.3, unavailable=0.2, retry_after=1.0, seed=plan.seed * 100 + index + 50)
    guard = Guard(
        plan.urls,
        tiers={"t": Tier(ttft=TTFT, total=TOTAL, stall=STALL)},
        fleet=plan.redis,
        name="chaos",
        budget=BudgetPolicy(scope="fleet"),
        rate_limit=RateLimit(requests_per_minute=6_000_000, tokens_per_minute=6_000_000_000),
        continuation=ContinuationPolicy(),
        instrumentation=None,
        chaos=background,
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 16}
    calls: list[dict[str, Any]] = []
    stalls: list[tuple[float, float]] = []
    samples: list[tuple[float, bool, float]] = []
    result: dict[str, Any] = {"index": index}

    def at(offset: float) -> float:
        return plan.t0 + offset

    async def sleep_until(offset: float) -> None:
        await anyio.sleep(max(0.0, at(offset) - time.time()))

    async def caller(client: httpx.AsyncClient) -> None:
        while time.time() < at(plan.calls_end):
            start = time.time()
            error = cause = None
            with guard.capture() as captured:
                try:
                    async with client.stream("POST", plan.urls[0] + "/v1/chat/completions", json=body) as response:
                        await response.aread()
                        ok = response.status_code == 200
                        if not ok:
                            error = f"http_{response.status_code}"
                except Exception as exc:
                    ok, error, cause = False, type(exc).__name__, guard_failure(exc)
            end = time.time()
            record: PhaseRecord | None = captured[0] if captured else None
            call: dict[str, Any] = {"start": start, "end": end, "ok": ok}
            if record is not None:
                call["first_token"] = record.first_token is not None
                call["chaos"] = any(a.chaos for a in record.attempts)
            if not ok:
                call.update(error=error, cause=cause or (record.cause if record else None))
                if record is not None:
                    call["attempts"] = [[a.replica, list(a.chaos), a.error, a.outcome] for a in record.attempts]
            calls.append(call)
            await anyio.sleep(0.02)

    async def chaos_schedule() -> None:
        for fault in sorted((f for f in plan.faults if f.kind == "storm"), key=lambda f: f.start):
            await sleep_until(fault.start)
            guard.set_chaos(storm)
            await sleep_until(fault.end)
            guard.set_chaos(background)
        await sleep_until(plan.quiet)
        guard.set_chaos(None)
        if index == 0:
            await sleep_until(plan.probe)
            # A real Retry-After's cool-down (an injected one stays in this process), of every replica (a lone one
            # would end at its first probe, 1 s in): the repository's own harness sets them in the replica states, as
            # the retry layer does for a real 429.
            replicas = guard._replica_set
            for state in replicas.states:
                replicas.cool_down(state, guard._clock(), PROBE_RETRY_AFTER, injected=False)
            result["probe_cooling"] = _cooling(guard)
            result["probe_at"] = time.time() - plan.t0

    async def sampler() -> None:
        while time.time() < at(plan.duration):
            fleet = guard.snapshot().fleet
            samples.append((time.time(), bool(fleet and fleet.connected), _cooling(guard)))
            await anyio.sleep(0.05)

    async def loop_stalls() -> None:
        while True:
            start = time.monotonic()
            await anyio.sleep(0.005)
            late = time.monotonic() - start - 0.005
            if late > 0.002:
                stalls.append((time.time(), late))

    await sleep_until(0.0)
    async with guard, guard.http_client() as client, anyio.create_task_group() as background_tasks:
        background_tasks.start_soon(loop_stalls)
        background_tasks.start_soon(chaos_schedule)
        background_tasks.start_soon(sampler)
        async with anyio.create_task_group() as callers:
            for _ in range(plan.callers):
                callers.start_soon(caller, client)
        await anyio.sleep(0.2)  # the last bodies' closes
        snap = guard.snapshot()
        result["idle"] = snap.idle
        result["calls_in_flight"] = snap.calls_in_flight
        result["attempts_in_flight"] = sum(r.in_flight for r in snap.replicas)
        result["budget_pending"] = snap.budget.pending if snap.budget is not None else 0
        fleet = snap.fleet
        result["fleet"] = None if fleet is None else {"transitions": fleet.transitions, "resyncs": fleet.resyncs}
        await sleep_until(plan.duration)
        background_tasks.cancel_scope.cancel()
    result["open_connections_after_close"] = sum(r.open_connections or 0 for r in guard.snapshot().replicas)
    result.update(calls=calls, stalls=stalls, samples=samples)
    return result


def _cooling(guard: Any) -> float:
    """The longest cool-down in force in this client (seconds left)."""
    return max((r.cooling_for for r in guard.snapshot().replicas), default=0.0)


# --- the parts the faults act on -------------------------------------------------------------------


class SimReplica:
    """One simulated replica in its own process (``python -m llmguard_tools.sim --replicas 1``)."""

    def __init__(self, seed: int, tmp: Path) -> None:
        self.seed = seed
        self.ready = tmp / f"replica-{seed}.json"
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> int:
        self.ready.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "llmguard_tools.sim", "--scenario", "healthy", "--replicas", "1"]
        cmd += ["--seed", str(self.seed), "--ready-file", str(self.ready)]
        self.process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not self.ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("a simulated replica did not start")
            time.sleep(0.02)
        url = json.loads(self.ready.read_text())["urls"][0]
        self.port = int(url.rsplit(":", 1)[1])
        return self.port

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)


# --- the run ------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks._partition_proxy import PartitionProxy, ProxyThread
    from tests.redis_server import RedisServer

    duration = args.minutes * 60.0
    with tempfile.TemporaryDirectory(prefix="llmguard-chaos-") as tmp_name:
        tmp = Path(tmp_name)
        sims: list[SimReplica] = []
        redis: RedisServer | None = None
        workers: list[subprocess.Popen[bytes]] = []
        proxy_thread: ProxyThread | None = None
        try:
            if args.replicas:
                proxies: list[PartitionProxy] = []
                urls = list(args.replicas)
            else:
                sims = [SimReplica(args.seed * 10 + i, tmp) for i in range(args.replica_count)]
                proxies = [PartitionProxy(f"replica{i}", sim.start()) for i, sim in enumerate(sims)]
            if args.redis:
                host, _, port = args.redis.rpartition(":")
                redis_proxy = PartitionProxy("redis", int(port), upstream_host=host)
            else:
                redis = RedisServer()
                redis.start()
                redis_proxy = PartitionProxy("redis", redis.port)
            proxy_thread = ProxyThread([*proxies, redis_proxy])
            proxy_thread.start()  # each proxy's port is known from here on
            if not args.replicas:
                urls = [f"http://{p.address}" for p in proxies]
            kinds = tuple(
                k
                for k in KINDS
                if (k not in REPLICA_KINDS or sims) and (k not in REDIS_KINDS or redis or k == "redis_partition")
            )
            faults = make_faults(duration, args.every, args.seed, max(2, len(urls)), kinds)
            last = max((f.end for f in faults if f.kind != "storm"), default=0.0)
            final = faults[-1] if faults and faults[-1].kind in REDIS_KINDS else None
            plan = Plan(
                t0=time.time() + 3.0 + 0.5 * args.processes,  # every client imported and waiting
                duration=duration,
                urls=urls,
                redis=f"redis://{redis_proxy.address}/0",
                callers=args.callers,
                seed=args.seed,
                faults=faults,
                last_fault_end=last,
                probe=(final.start + 0.5) if final is not None else last - 1.0,
                quiet=final.start if final is not None else last - 1.5,
            )
            plan_path = tmp / "plan.json"
            plan_path.write_text(json.dumps(asdict(plan)))
            env = {**os.environ, "LLMGUARD_CHAOS": "1"}
            for i in range(args.processes):
                cmd = [sys.executable, "-m", "benchmarks.chaos", "--worker", str(i), "--plan", str(plan_path)]
                workers.append(subprocess.Popen([*cmd, "--out", str(tmp / f"out-{i}.json")], env=env))
            actions = sorted(_actions(faults), key=lambda a: a[0])
            for offset, action, fault in actions:
                time.sleep(max(0.0, plan.t0 + offset - time.time()))
                _apply(action, fault, sims, proxies, redis, redis_proxy)
                if action == "end":  # a restart takes a while on a busy machine: the fault lasted until now
                    fault.end = max(fault.end, time.time() - plan.t0)
                if args.verbose:
                    print(f"{time.time() - plan.t0:7.2f}s {action} {fault.kind} {fault.target}", flush=True)
            for w in workers:
                w.wait(timeout=duration + 120)
            outs = [json.loads((tmp / f"out-{i}.json").read_text()) for i in range(args.processes)]
            plan.last_fault_end = max((f.end for f in faults if f.kind != "storm"), default=0.0)
            return judge(plan, outs, args.bound_ms / 1000.0, args.agree_s)
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
            for sim in sims:
                sim.kill()
            if proxy_thread is not None:
                proxy_thread.stop()
            if redis is not None:
                redis.stop()


def _actions(faults: list[Fault]) -> Iterator[tuple[float, str, Fault]]:
    for fault in faults:
        if fault.kind != "storm":
            yield fault.start, "begin", fault
            yield fault.end, "end", fault


def _apply(action: str, fault: Fault, sims: list[SimReplica], proxies: list[Any], redis: Any, redis_proxy: Any) -> None:
    begin = action == "begin"
    kind = fault.kind
    if kind == "replica_kill":
        sim = sims[fault.target]
        if begin:
            sim.kill()
        else:
            proxies[fault.target].upstream_port = sim.start()
    elif kind == "replica_stop":
        sims[fault.target].signal(signal.SIGSTOP if begin else signal.SIGCONT)
    elif kind == "replica_partition":
        proxies[fault.target].partitioned = begin
    elif kind == "redis_kill":
        if begin:
            redis.stop()
        else:
            redis.start()  # the same port, empty
    elif kind == "redis_stop":
        if begin:
            redis.pause()
        else:
            redis.resume()
    elif kind == "redis_partition":
        redis_proxy.partitioned = begin


# --- the verdict ----------------------------------------------------------------------------------------


def judge(plan: Plan, outs: list[dict[str, Any]], bound: float, agree_within: float) -> dict[str, Any]:
    t0 = plan.t0
    replica_windows: dict[str, list[tuple[float, float]]] = {}
    redis_windows: list[tuple[float, float]] = []
    for f in plan.faults:
        if f.kind in REPLICA_KINDS:
            url = plan.urls[f.target].rstrip("/")
            replica_windows.setdefault(url, []).append((t0 + f.start, t0 + f.end + CIRCUIT_AFTER))
        elif f.kind in REDIS_KINDS:
            redis_windows.append((t0 + f.start, t0 + f.end))

    def overlaps(windows: list[tuple[float, float]], start: float, end: float) -> bool:
        return any(a < end and start < b for a, b in windows)

    calls = failed = by_replica = by_chaos = by_redis = unexplained = outside = 0
    causes: dict[str, int] = {}
    worst = worst_raw = 0.0
    over: list[dict[str, Any]] = []
    examples: list[dict[str, Any]] = []
    for out in outs:
        stalls = sorted(out["stalls"])
        woke = [w for w, _ in stalls]
        longest = max((late for _, late in stalls), default=0.0)
        for c in out["calls"]:
            calls += 1
            limit = TOTAL if c.get("first_token") else TTFT
            raw = c["end"] - c["start"] - limit
            near = stalls[bisect.bisect_left(woke, c["start"]) : bisect.bisect_right(woke, c["end"] + longest)]
            stalled = sum(min(late, max(0.0, min(c["end"], w) - max(c["start"], w - late))) for w, late in near)
            worst_raw = max(worst_raw, raw)
            worst = max(worst, raw - stalled)
            if raw - stalled > bound:
                over.append({"process": out["index"], "over_s": round(raw - stalled, 3), **_short(c, t0)})
            if c["ok"]:
                continue
            failed += 1
            key = str(c.get("cause") or c.get("error"))
            causes[key] = causes.get(key, 0) + 1
            attempts = c.get("attempts", [])
            in_window = any(overlaps(replica_windows.get(a[0], []), c["start"], c["end"]) for a in attempts) or (
                not attempts and any(overlaps(w, c["start"], c["end"]) for w in replica_windows.values())
            )
            if any(a[1] for a in attempts):
                by_chaos += 1
            elif in_window or any(a[2] for a in attempts):  # an attempt's own error: the replica's path failed
                by_replica += 1
                if not in_window:
                    outside += 1
                    examples.append({"process": out["index"], "outside_windows": True, **_short(c, t0)})
            elif overlaps(redis_windows, c["start"], c["end"]):
                by_redis += 1
                examples.append({"process": out["index"], **_short(c, t0)})
            else:
                unexplained += 1
                examples.append({"process": out["index"], **_short(c, t0)})
    leaks = [
        {k: o[k] for k in ("index", "idle", "calls_in_flight", "attempts_in_flight", "budget_pending")}
        | {"open_connections_after_close": o["open_connections_after_close"]}
        for o in outs
    ]
    leak_free = all(
        o["idle"] and o["calls_in_flight"] == 0 and o["attempts_in_flight"] == 0 and o["budget_pending"] == 0
        for o in outs
    ) and all(o["open_connections_after_close"] == 0 for o in outs)
    last = t0 + plan.last_fault_end
    connected_after: list[float | None] = []
    seen_after: list[float | None] = []
    for out in outs:
        after = [s for s in out["samples"] if s[0] >= last]
        connected_after.append(next((s[0] - last for s in after if s[1]), None))
        seen_after.append(next((s[0] - last for s in after if s[2] > PROBE_RETRY_AFTER / 3), None))
    agreed = [None if s is None or c is None else max(s, c) for s, c in zip(seen_after, connected_after, strict=True)]
    probe_took = outs[0].get("probe_cooling", 0.0) > PROBE_RETRY_AFTER / 3
    verdicts = {
        "no call failed because of Redis": by_redis == 0 and unexplained == 0,
        f"every call within its deadline + {bound * 1000:.0f} ms (less its loop's stalls)": not over,
        "leak counters back to zero": leak_free,
        f"shared state agrees within {agree_within:.1f} s of the last fault": probe_took
        and all(a is not None and a <= agree_within for a in agreed),
    }
    kinds: dict[str, int] = {}
    for f in plan.faults:
        kinds[f.kind] = kinds.get(f.kind, 0) + 1
    return {
        "minutes": plan.duration / 60.0,
        "processes": len(outs),
        "faults": kinds,
        "schedule": [
            [round(f.start, 2), round(f.end, 2), f.kind, plan.urls[f.target] if f.kind in REPLICA_KINDS else ""]
            for f in plan.faults
        ],
        "calls": calls,
        "failed": failed,
        "failed_by": {
            "injected (chaos-marked attempt)": by_chaos,
            "replica fault": by_replica,
            "of which outside a scheduled replica fault": outside,
            "redis": by_redis,
            "unexplained": unexplained,
        },
        "failure_causes": causes,
        "calls_with_chaos": sum(1 for o in outs for c in o["calls"] if c.get("chaos")),
        "worst_overshoot_ms_raw": round(worst_raw * 1000, 1),
        "worst_overshoot_ms_less_stalls": round(worst * 1000, 1),
        "over_bound": over[:10],
        "failures_to_read": examples[:10],
        "leaks": leaks,
        "probe_took": probe_took,
        "probe": {"at_s": outs[0].get("probe_at"), "cooling_s": outs[0].get("probe_cooling")},
        "connected_after_last_fault_s": [None if c is None else round(c, 2) for c in connected_after],
        "probe_seen_after_last_fault_s": [None if s is None else round(s, 2) for s in seen_after],
        "fleet": [o["fleet"] for o in outs],
        "verdicts": verdicts,
    }


def _short(call: dict[str, Any], t0: float) -> dict[str, Any]:
    keep = {k: v for k, v in call.items() if k not in ("start", "end")}
    return {"at_s": round(call["start"] - t0, 2), "took_s": round(call["end"] - call["start"], 3), **keep}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--callers", type=int, default=4, help="calls at once per process")
    parser.add_argument("--replica-count", type=int, default=3)
    parser.add_argument("--every", type=float, default=4.0, help="seconds between two scheduled faults")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bound-ms", type=float, default=50.0)
    parser.add_argument("--agree-s", type=float, default=2.0)
    parser.add_argument("--replicas", nargs="*", default=None, metavar="URL", help="your replicas (no sims)")
    parser.add_argument("--redis", default=None, metavar="HOST:PORT", help="your Redis (partitions only)")
    parser.add_argument("--json", action="store_true", help="print the whole verdict as JSON")
    parser.add_argument("--verbose", action="store_true", help="print each fault as it is applied")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--plan", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.plan, args.worker, args.out)
        return 0
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 0 if all(report["verdicts"].values()) else 1


def render(report: dict[str, Any]) -> str:
    lines = [
        f"{report['processes']} processes x {report['minutes']:.1f} min; faults: "
        + ", ".join(f"{k} {v}" for k, v in sorted(report["faults"].items())),
        f"calls {report['calls']}, failed {report['failed']} "
        + "("
        + ", ".join(f"{k}: {v}" for k, v in report["failed_by"].items())
        + f"); calls with an injected fault: {report['calls_with_chaos']}",
        "failure causes: " + ", ".join(f"{k} {v}" for k, v in sorted(report["failure_causes"].items())),
        f"worst overshoot past the deadline: {report['worst_overshoot_ms_raw']} ms raw, "
        f"{report['worst_overshoot_ms_less_stalls']} ms less the event loop's stalls",
        f"after the last fault: connected again after {report['connected_after_last_fault_s']} s; client 0's "
        f"cool-down seen after {report['probe_seen_after_last_fault_s']} s (probe took: {report['probe_took']})",
        "leaks: " + "; ".join(json.dumps(x) for x in report["leaks"]),
    ]
    for example in report["over_bound"] + report["failures_to_read"]:
        lines.append("  " + json.dumps(example))
    lines += [f"{'PASS' if ok else 'FAIL'}  {name}" for name, ok in report["verdicts"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
