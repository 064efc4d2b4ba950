"""One client's replay spread over N worker processes that share its plan (``--client-processes N``).

A client with hundreds of calls in flight spends its event loop on its own bookkeeping (httpx's connection pool
walks every connection for every request it assigns), and a load generator on that loop falls behind its plan:
the run then measures the generator, not the client. Split over N processes, each worker replays every Nth
planned request (``requests[k::N]``, arrival times unchanged) from one common start instant with a client of its
own, so together they send the whole plan on time; the parent joins their samples back in plan order.

What a sharded client compares is unchanged for the baselines (each call is independent of the others). A
guarded client sharded is N Guards, each learning from its share of the traffic: several processes in front
of the same replicas, which is what ``--guard-processes`` asks for.

Each worker (`llmguard_tools.bench.shard_worker`) starts its client and says so; the common start instant is
sent once every worker is ready, so a worker slow to start does not make the others' calls late.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

from llmguard_tools.bench.measure import Replayed, Sample
from llmguard_tools.bench.spec import RunSpec
from llmguard_tools.bench.traffic import TrafficPlan

__all__ = ["ShardJob", "merge", "run_sharded", "shard_plan"]

START_DELAY_S = 0.2
"""Seconds from the last worker ready to the common start."""


@dataclass(frozen=True)
class ShardJob:
    """What one worker runs: its client, its share of the plan and the common start (wall clock)."""

    client: str
    urls: tuple[str, ...]
    spec: RunSpec
    """The run's spec, its plan already cut to this worker's share."""
    model: str


def shard_plan(plan: TrafficPlan, k: int, n: int) -> TrafficPlan:
    """Every ``n``-th planned request from the ``k``-th (arrival offsets unchanged)."""
    if plan.mode not in ("poisson", "profile") or plan.concurrency is not None:
        raise ValueError("--client-processes needs an open-loop plan (--rate or --profile, no --concurrency)")
    return dataclasses.replace(plan, requests=plan.requests[k::n], _fingerprint="")


def merge(parts: Sequence[Replayed]) -> Replayed:
    """The workers' replays as one: samples in plan order, the longest wall, the furthest behind."""
    samples: list[Sample] = sorted((s for p in parts for s in p.samples), key=lambda s: s.index)
    return Replayed(samples, max((p.wall for p in parts), default=0.0), max((p.behind for p in parts), default=0.0))


def _write_jobs(tmp: str, client: str, urls: Sequence[str], spec: RunSpec, model: str, n: int) -> list[str]:
    """Each worker's job, pickled in ``tmp``; their paths."""
    paths = []
    for k in range(n):
        paths.append(os.path.join(tmp, f"job{k}.pickle"))
        with open(paths[-1], "wb") as f:
            pickle.dump(
                ShardJob(client, tuple(urls), dataclasses.replace(spec, plan=shard_plan(spec.plan, k, n)), model), f
            )
    return paths


async def run_sharded(client: str, urls: Sequence[str], spec: RunSpec, model: str, n: int) -> Replayed:
    """Replay ``spec.plan`` through ``client`` from ``n`` worker processes; their joined result."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    workers: list[asyncio.subprocess.Process] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for path in _write_jobs(tmp, client, urls, spec, model, n):
                workers.append(
                    await asyncio.create_subprocess_exec(
                        sys.executable,
                        "-m",
                        "llmguard_tools.bench.shard_worker",
                        path,
                        stdin=asyncio.subprocess.PIPE,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE,
                        env=env,
                    )
                )
            for worker in workers:  # every worker's client started
                assert worker.stdout is not None
                await worker.stdout.readline()
            go = f"{time.time() + START_DELAY_S!r}\n".encode()
            answers = await asyncio.gather(*(w.communicate(go) for w in workers))
        finally:  # a worker failed or the run was cancelled: none is left running
            for worker in workers:
                if worker.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        worker.kill()
                    await worker.wait()
    parts = []
    for worker, (out, err) in zip(workers, answers, strict=True):
        if worker.returncode != 0:
            last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"a bench worker ({client}) failed with exit code {worker.returncode}: {last}")
        parts.append(pickle.loads(out))
    return merge(parts)
