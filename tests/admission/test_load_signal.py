"""The per-replica load signal: vLLM's ORCA report parsed, believed while fresh, arriving from a replica that
sends it (the simulated cluster over loopback, as vLLM does), and read by admission however it came."""

from __future__ import annotations

import dataclasses
import functools
import math

import anyio
import httpx
import pytest

from llmguard_client import Admission, Guard, Replica, Tier
from llmguard_client._admission.signal import LoadSignal, parse_orca
from llmguard_client._routing.health import server_kv_usage, server_waiting
from llmguard_client._routing.replicas import ReplicaSet
from llmguard_client.server_hints import poll_once
from llmguard_tools.sim.cluster import SimCluster
from tests.clients import plain_httpx
from tests.sim.conftest import ENGINE, chat_body, one_off, wait_until


def test_the_orca_text_report_is_parsed_as_vllm_writes_it() -> None:
    report = "TEXT named_metrics.num_requests_waiting=3.0, named_metrics.kv_cache_usage_perc=0.42"
    assert parse_orca(report) == (3.0, 0.42)
    assert parse_orca("JSON {}") == (None, None)
    assert parse_orca("TEXT named_metrics.num_requests_waiting=nan, named_metrics.kv_cache_usage_perc=x") == (
        None,
        None,
    )


def test_a_report_is_believed_while_fresh_and_its_age_is_always_known() -> None:
    rs = ReplicaSet([Replica("http://a:1")], lambda r: httpx.MockTransport(lambda q: httpx.Response(200)))
    (a,) = rs.states
    assert server_waiting(a.health, 10.0) is None and a.health.reported_at == -math.inf
    rs.router.server_load(a, 10.0, waiting=5.0, kv_usage=0.9, fresh_for=0.2)
    assert (server_waiting(a.health, 10.15), server_kv_usage(a.health, 10.15)) == (5.0, 0.9)
    assert server_waiting(a.health, 10.25) is None and server_kv_usage(a.health, 10.25) is None  # stale: ignored
    rs.router.server_load(a, 11.0, waiting=None, kv_usage=None, fresh_for=0.2)  # a report that says nothing
    assert a.health.reported_at == 10.0  # changes nothing


def test_the_ttft_floor_is_the_fastest_first_token_and_recent_ones_are_smoothed() -> None:
    signal = LoadSignal()
    signal.first_token(1.0, 0.10)
    signal.first_token(1.1, 0.30)
    assert signal.ttft_floor == pytest.approx(0.10, rel=1e-3)  # drifting up by 1 % per 30 s, so 0.1 s later: +0.003 %
    assert signal.ttft_recent == pytest.approx(0.14)


async def test_a_non_streamed_answer_brings_the_replicas_own_report_into_the_snapshot() -> None:
    async with SimCluster(one_off()) as cluster:
        url = cluster.urls[0]
        # Believed for a minute: how soon the snapshot is read after the answer is not what this test checks.
        admission = Admission(signal_fresh_for=60.0)
        async with Guard([url], instrumentation=None, admission=admission) as guard, guard.http_client() as http:
            response = await http.post(url + "/v1/chat/completions", json=chat_body(stream=False))
            assert response.status_code == 200
            snapshot = guard.snapshot()
            view = snapshot.admission[url]
            assert view.server_waiting == 0.0 and view.server_kv_usage is not None
            assert 0.0 <= view.signal_age < 60.0
            assert snapshot.replicas[0].server_waiting == 0.0  # one report, which the router reads too
            assert view.ttft_floor is not None and view.in_flight == 0


async def test_a_queue_the_server_reports_on_its_metrics_cuts_the_admission_limit() -> None:
    # One request at a time: another tenant's long requests wait in the engine's queue, in its /metrics.
    engine = dataclasses.replace(ENGINE, policy="none", step_s=0.05, max_running=1)
    tiers = {"interactive": Tier(ttft=30.0, total=60.0)}  # the guarded call is in time: only the report cuts
    async with SimCluster(one_off(engine)) as cluster, plain_httpx(timeout=30.0) as http:
        url, busy = cluster.urls[0], cluster.replicas[0].engine
        async with (
            Guard([url], tiers, instrumentation=None, admission=Admission()) as guard,
            guard.http_client() as client,
        ):
            async with anyio.create_task_group() as tenant:
                for _ in range(6):
                    body = chat_body(max_tokens=200, stream=False)
                    tenant.start_soon(functools.partial(http.post, url + "/v1/chat/completions", json=body))
                await wait_until(lambda: busy.waiting == 5)
                polled = await poll_once(guard, fresh_for=60.0)
                tenant.cancel_scope.cancel()  # the tenant gives up: its requests leave the engine
            await wait_until(lambda: busy.waiting + busy.running == 0)
            response = await client.post(url + "/v1/chat/completions", json=chat_body(max_tokens=1, stream=True))
            assert response.status_code == 200
            view = guard.snapshot().admission[url]
    # 5 waiting, more than max_server_queue (4): cut to the load the call met (itself), from the initial 16
    report = polled[url]
    assert report is not None and (report.waiting, view.server_waiting, view.limit) == (5.0, 5.0, 1)
