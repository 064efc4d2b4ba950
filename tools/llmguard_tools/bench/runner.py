"""Replays one `TrafficPlan` per client against the same replicas and collects samples + server counters.

Server-side counters come from the simulated cluster's ``GET /sim/stats``. Between clients the bench
either starts a fresh cluster per client (``fresh``: the ``--sim`` default, so every client also meets
the same seeded fault draws) or ``POST /sim/reset``s every replica of one cluster (``reset``: the only
choice for ``--target``; it waits first for the previous client's leftovers to drain), so the counters
of a run belong to that client alone. Against a ``--target`` without ``/sim/*`` the server columns are empty.
Each client runs in its own event loop (``anyio.run``), one after another, never concurrently.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import anyio
import httpx

from llmguard_tools.bench.clients import BenchClient, Sample, make_client
from llmguard_tools.bench.conversations import replay_conversations
from llmguard_tools.bench.measure import Replayed
from llmguard_tools.bench.spec import RunSpec
from llmguard_tools.bench.tls import tls_context
from llmguard_tools.bench.traffic import TrafficPlan, request_body

CountersMode = Literal["reset", "fresh", "none"]

COUNTERS_NOTE: dict[str, str] = {
    "reset": "server counters: same cluster, POST /sim/reset on every replica before each client",
    "fresh": "server counters: a fresh simulated cluster (same scenario and seed) per client",
    "none": "server counters: unavailable (target has no /sim/stats)",
}


class TargetError(Exception):
    """The target cannot be used (unreachable, not OpenAI-compatible, sim missing...)."""


@dataclass
class ServerStats:
    replicas: list[dict[str, Any]]
    drained: bool = True

    def total(self, key: str) -> float:
        return float(sum(r.get(key, 0) or 0 for r in self.replicas if isinstance(r.get(key, 0), (int, float))))

    def totals(self) -> dict[str, float]:
        keys = {k for r in self.replicas for k, v in r.items() if isinstance(v, (int, float))}
        return {k: self.total(k) for k in sorted(keys)}


@dataclass
class ClientRun:
    name: str
    samples: list[Sample]
    server: ServerStats | None
    wall: float
    """Seconds from the first send to the last request's end."""
    notes: list[str] = field(default_factory=list)
    behind: float = 0.0
    """How far the load generator itself fell behind the planned arrivals, at most (seconds): a busy event
    loop or machine, not waits for a ``--concurrency`` slot (those are part of the plan)."""


class ProgressSink(Protocol):
    def begin(self, client: str, total: int) -> None: ...
    def advance(self, sample: Sample) -> None: ...
    def end(self, client: str) -> None: ...


class NullProgress:
    def begin(self, client: str, total: int) -> None:
        pass

    def advance(self, sample: Sample) -> None:
        pass

    def end(self, client: str) -> None:
        pass


async def preflight(urls: Sequence[str], probe_timeout: float = 3.0, api_key: str | None = None) -> tuple[str, bool]:
    """Check every replica answers ``GET /v1/models``; return (first model id, has /sim/stats)."""
    model = "bench"
    has_stats = True
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=probe_timeout, headers=headers, verify=tls_context()) as http:
        for i, url in enumerate(urls):
            try:
                r = await http.get(f"{url}/v1/models")
            except httpx.HTTPError as exc:
                raise TargetError(f"cannot reach {url}: {type(exc).__name__} {exc}".rstrip()) from None
            if r.status_code != 200:
                raise TargetError(f"{url}/v1/models answered HTTP {r.status_code}; is it OpenAI-compatible?")
            if i == 0:
                with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
                    model = str(r.json()["data"][0]["id"])
            try:
                s = await http.get(f"{url}/sim/stats")
                has_stats = has_stats and s.status_code == 200 and isinstance(s.json(), dict)
            except (httpx.HTTPError, ValueError):
                has_stats = False
    return model, has_stats


async def fetch_stats(http: httpx.AsyncClient, urls: Sequence[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for url in urls:
        r = await http.get(f"{url}/sim/stats")
        r.raise_for_status()
        out.append(r.json())
    return out


async def reset_stats(http: httpx.AsyncClient, urls: Sequence[str]) -> None:
    for url in urls:
        r = await http.post(f"{url}/sim/reset")
        r.raise_for_status()


async def wait_drained(
    http: httpx.AsyncClient, urls: Sequence[str], patience: float
) -> tuple[bool, list[dict[str, Any]]]:
    """Poll until no replica has running or waiting work (or ``patience`` s); return (drained, stats)."""
    deadline = time.perf_counter() + patience
    while True:
        stats = await fetch_stats(http, urls)
        busy = sum((s.get("running", 0) or 0) + (s.get("waiting", 0) or 0) for s in stats)
        if busy == 0:
            return True, stats
        if time.perf_counter() >= deadline:
            return False, stats
        await anyio.sleep(0.1)


async def replay(
    client: BenchClient,
    plan: TrafficPlan,
    model: str,
    on_sample: Callable[[Sample], None] = lambda s: None,
    start: float | None = None,
) -> Replayed:
    """Send every planned request through ``client`` as the plan says (offset 0 at ``start``, a perf_counter
    time: 20 ms from now by default); return samples by index, wall time and how far the generator fell behind
    plan."""
    if plan.mode == "conversations":
        return await replay_conversations(client, plan, model, on_sample)
    samples: list[Sample | None] = [None] * len(plan.requests)
    bodies = [request_body(r, model) for r in plan.requests]
    cap = plan.concurrency
    behind = 0.0

    async def one(i: int, scheduled_at: float) -> None:
        s = await client.run(plan.requests[i], bodies[i], scheduled_at)
        samples[i] = s
        on_sample(s)

    if start is None:
        start = time.perf_counter() + 0.02
    async with anyio.create_task_group() as tg:
        if plan.mode == "closed":
            assert cap is not None
            it: Iterator[int] = iter(range(len(plan.requests)))

            async def worker() -> None:
                for i in it:  # shared iterator: each worker takes the next request when it is free
                    await one(i, time.perf_counter())

            for _ in range(min(cap, len(plan.requests))):
                tg.start_soon(worker)
        else:
            limiter = anyio.CapacityLimiter(cap) if cap is not None else None

            async def capped(i: int, scheduled_at: float) -> None:
                nonlocal behind  # measured before any wait for a --concurrency slot
                behind = max(behind, time.perf_counter() - scheduled_at)
                if limiter is None:
                    await one(i, scheduled_at)
                else:
                    async with limiter:
                        await one(i, scheduled_at)

            for i, req in enumerate(plan.requests):
                at = start + req.arrival
                delay = at - time.perf_counter()
                if delay > 0:
                    await anyio.sleep(delay)
                tg.start_soon(capped, i, at)
    wall = time.perf_counter() - start
    done = [s for s in samples if s is not None]
    assert len(done) == len(plan.requests)
    return Replayed(done, wall, behind)


async def run_one_client(
    name: str,
    urls: Sequence[str],
    spec: RunSpec,
    model: str,
    counters: CountersMode,
    progress: ProgressSink,
) -> ClientRun:
    notes: list[str] = []
    async with httpx.AsyncClient(timeout=10.0, verify=tls_context()) as http:
        if counters != "none":
            drained, _ = await wait_drained(http, urls, spec.drain_timeout)
            if not drained:
                notes.append("previous client's work had not drained before reset")
            await reset_stats(http, urls)
        progress.begin(name, len(spec.plan.requests))
        try:
            samples, wall, behind = await _replay_client(name, urls, spec, model, progress)
        finally:
            progress.end(name)
        server = None
        if counters != "none":
            drained, stats = await wait_drained(http, urls, spec.drain_timeout)
            server = ServerStats(stats, drained)
            if not drained:
                notes.append(f"server still busy {spec.drain_timeout:g} s after the last request")
    if spec.processes.get(name, 1) > 1:
        notes.append(f"replayed from {spec.processes[name]} processes, each with a client of its own")
    if spec.fleet is not None and name.startswith("guarded"):
        notes.append("its Guards share their fleet state through Redis")
    if behind > 0.25:
        notes.append(f"load generator fell behind plan by up to {behind:.2f} s")
    return ClientRun(name, samples, server, wall, notes, behind)


async def _replay_client(name: str, urls: Sequence[str], spec: RunSpec, model: str, progress: ProgressSink) -> Replayed:
    """The client's replay of the plan, in this process or split over its worker processes."""
    processes = spec.processes.get(name, 1)
    if processes > 1:
        from llmguard_tools.bench.shards import run_sharded

        replayed = await run_sharded(name, urls, spec, model, processes)
        for sample in replayed.samples:
            progress.advance(sample)
        return replayed
    client = client_for(name, urls, model, spec)
    await client.start()
    try:
        return await replay(client, spec.plan, model, progress.advance)
    finally:
        await client.aclose()


def client_for(name: str, urls: Sequence[str], model: str, spec: RunSpec) -> BenchClient:
    """Client ``name`` as the run sets up every client, in this process or a shard worker: the run's tier,
    deadline and key, the calls' tiers, the guarded clients' fleet and the hints client's poll interval."""
    from llmguard_tools.bench.guarded import GuardedClient, GuardedHintsClient

    client = make_client(
        name,
        urls,
        model=model,
        tier=spec.tier,
        deadline=spec.deadline,
        api_key=spec.api_key,
        rollout=spec.rollout,
        records=spec.records,
    )
    client.tiers = spec.tiers
    if isinstance(client, GuardedClient) and spec.fleet is not None:
        client.fleet = (spec.fleet[0], f"{spec.fleet[1]}-{client.name}")
    if isinstance(client, GuardedHintsClient):
        client.every = spec.hints_every
    return client


ClusterFactory = Callable[[], contextlib.AbstractContextManager[list[str]]]


def run_clients(
    names: Sequence[str],
    spec: RunSpec,
    *,
    urls: Sequence[str] | None = None,
    cluster: ClusterFactory | None = None,
    fresh_cluster: bool = False,
    progress: ProgressSink | None = None,
) -> tuple[list[ClientRun], CountersMode, str]:
    """Run every client in turn; return (runs, counters mode, model). Give ``urls`` or ``cluster``."""
    progress = progress or NullProgress()
    if (urls is None) == (cluster is None):
        raise ValueError("give exactly one of urls= or cluster=")
    runs: list[ClientRun] = []
    if cluster is not None and fresh_cluster:
        model = spec.model or "bench"
        for name in names:
            with cluster() as fresh_urls:
                found, has_stats = anyio.run(preflight, fresh_urls, 3.0, spec.api_key)
                model = spec.model or found
                mode: CountersMode = "fresh" if has_stats else "none"
                runs.append(anyio.run(run_one_client, name, fresh_urls, spec, model, mode, progress))
        return runs, ("fresh" if all(r.server is not None for r in runs) else "none"), model

    with contextlib.ExitStack() as stack:
        if urls is not None:
            target = list(urls)
        else:
            assert cluster is not None
            target = stack.enter_context(cluster())
        found, has_stats = anyio.run(preflight, target, 3.0, spec.api_key)
        model = spec.model or found
        mode = "reset" if has_stats else "none"
        for name in names:
            runs.append(anyio.run(run_one_client, name, target, spec, model, mode, progress))
    return runs, mode, model
