"""The guarded bench clients: their reading of the phase record (waits, time in attempts), tiers, server hints."""

from __future__ import annotations

import dataclasses
import functools
import importlib
from types import SimpleNamespace

import anyio
import pytest

from llmguard_tools.bench.guarded import GuardedAdmissionClient, GuardedClient, GuardedHintsClient
from llmguard_tools.bench.measure import Probe, Sample, TierSpec
from llmguard_tools.bench.runner import client_for
from llmguard_tools.bench.spec import RunSpec
from llmguard_tools.bench.traffic import PlannedRequest, make_plan, request_body
from llmguard_tools.sim.cluster import SimCluster
from tests.clients import plain_httpx
from tests.loopback import CHAT_PATHS, LoopbackCluster
from tests.sim.conftest import ENGINE, chat_body, one_off, wait_until


def test_guarded_waited_counts_gaps_before_retry_rounds_only() -> None:
    def attempt(kind: str, start: float, finish: float) -> SimpleNamespace:
        return SimpleNamespace(kind=kind, start=start, finish=finish)

    record = SimpleNamespace(
        attempts=[attempt("primary", 0.0, 0.1), attempt("hedge", 0.05, 0.12), attempt("retry", 0.62, 0.7)]
    )
    probe = Probe(t0=0.0, extra={"record": record})
    client = GuardedClient(["http://127.0.0.1:1"], model="m", tier=TierSpec(ttft=1.0, total=5.0, stall=None))
    assert client.waited_of(probe) == pytest.approx(0.5)  # 0.12 -> 0.62; the hedge overlapped, no wait


def test_guarded_in_attempts_is_the_union_of_attempt_intervals() -> None:
    record = SimpleNamespace(
        attempts=[
            SimpleNamespace(kind="primary", start=0.0, finish=0.1),
            SimpleNamespace(kind="hedge", start=0.05, finish=0.12),  # overlaps the primary
            SimpleNamespace(kind="retry", start=0.62, finish=0.7),
        ]
    )
    client = GuardedClient(["http://127.0.0.1:1"], model="m", tier=TierSpec(ttft=1.0, total=5.0, stall=None))
    assert client.in_attempts_of(Probe(t0=0.0, extra={"record": record})) == pytest.approx(0.2)


def test_a_batch_call_of_a_tier_mix_goes_through_the_guard_on_the_batch_tier(cluster: LoopbackCluster) -> None:
    async def main() -> list[Sample]:
        client = GuardedAdmissionClient(cluster.urls, model="m", tier=TierSpec(ttft=1.0, total=5.0, stall=None))
        client.tiers = ("interactive", "batch")
        await client.start()
        try:
            out = []
            for i in range(2):
                req = PlannedRequest(index=i, arrival=0.0, prompt_words=5, max_tokens=3)
                out.append(await client.run(req, request_body(req, "m"), 0.0))
            return out
        finally:
            await client.aclose()

    first, second = anyio.run(main)
    assert (first.status, first.tier, second.status, second.tier) == ("ok", "interactive", "ok", "batch")
    # the time each attempt had left for its first token: under the interactive tier's 1 s, under batch's 30 s
    left = sorted(int(r.headers["x-slo-ttft-ms"]) for s in cluster.servers for r in s.received if r.path in CHAT_PATHS)
    assert left[0] <= 1000 < 25_000 < left[1] <= 30_000


async def test_the_hints_client_steers_calls_away_from_a_replica_whose_server_reports_a_queue() -> None:
    # One request at a time, 50 ms a step: requests sent to replica 0 wait there, in its /metrics.
    engine = dataclasses.replace(ENGINE, policy="none", step_s=0.05, max_running=1)
    async with SimCluster(one_off(engine, replicas=2)) as cluster, plain_httpx(timeout=30.0) as http:
        busy = cluster.replicas[0].engine
        async with anyio.create_task_group() as tenant:  # another tenant's requests, which the guard never sees
            for _ in range(4):
                body = chat_body(max_tokens=40, stream=False)
                tenant.start_soon(functools.partial(http.post, cluster.urls[0] + "/v1/chat/completions", json=body))
            await wait_until(lambda: busy.waiting == 3)
            tier = TierSpec(ttft=5.0, total=30.0, stall=None)
            client = GuardedHintsClient(cluster.urls, model="sim-model", tier=tier)
            await client.start()
            try:
                queued = client._guard._replica_set.states[0].health
                await wait_until(lambda: queued.waiting == 3.0)  # the first poll, as the client starts
                samples = []
                for i in range(4):
                    req = PlannedRequest(index=i, arrival=0.0, prompt_words=5, max_tokens=3)
                    samples.append(await client.run(req, request_body(req, "sim-model"), 0.0))
            finally:
                await client.aclose()
            tenant.cancel_scope.cancel()
    # Every call's first attempt goes to the other replica. Blind to the queue, the guard takes turns between two
    # idle replicas: a call sent to replica 0 waits there until it is hedged to replica 1.
    other = cluster.urls[1].rsplit(":", 1)[1]
    assert [(s.status, (s.trail or "").split(">")[0]) for s in samples] == [("ok", f"primary@{other}:won/200")] * 4
    assert all(r.counters.metrics_requests >= 1 for r in cluster.replicas)  # what the report's /metrics column adds


@pytest.mark.parametrize(("every", "expected"), [(None, {}), (0.15, {"every": 0.15})])
async def test_the_hints_client_polls_at_the_runs_interval_or_the_pollers_default(
    every: float | None, expected: dict[str, float], cluster: LoopbackCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    polls: list[dict[str, float]] = []

    async def poll(guard: object, **rate: float) -> None:
        polls.append(rate)
        await anyio.sleep_forever()

    monkeypatch.setattr(importlib.import_module("llmguard_client.server_hints"), "poll_vllm_metrics", poll)
    plan = make_plan(1, seed=0, rate=1.0)
    spec = RunSpec(plan=plan, tier=TierSpec(ttft=5.0, total=30.0, stall=None), hints_every=every)
    client = client_for("guarded-hints", cluster.urls, "m", spec)
    await client.start()
    try:
        await wait_until(lambda: bool(polls))
    finally:
        await client.aclose()
    assert polls == [expected]
