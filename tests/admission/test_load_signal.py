"""The per-replica load signal: vLLM's ORCA report parsed, believed while fresh, and arriving from a replica
that sends it (the simulated cluster over loopback, as vLLM does)."""

from __future__ import annotations

import math

import pytest

from llmguard_client import Admission, Guard
from llmguard_client._admission.signal import LoadSignal, parse_orca
from llmguard_tools.sim.cluster import SimCluster
from tests.sim.conftest import chat_body, one_off


def test_the_orca_text_report_is_parsed_as_vllm_writes_it() -> None:
    report = "TEXT named_metrics.num_requests_waiting=3.0, named_metrics.kv_cache_usage_perc=0.42"
    assert parse_orca(report) == (3.0, 0.42)
    assert parse_orca("JSON {}") == (None, None)
    assert parse_orca("TEXT named_metrics.num_requests_waiting=nan, named_metrics.kv_cache_usage_perc=x") == (
        None,
        None,
    )


def test_a_report_is_believed_while_fresh_and_its_age_is_always_known() -> None:
    signal = LoadSignal(fresh_for=0.2)
    assert signal.age(10.0) == math.inf and signal.server_waiting(10.0) is None
    signal.report(10.0, 5.0, 0.9)
    assert signal.age(10.15) == pytest.approx(0.15) and signal.server_waiting(10.15) == 5.0
    assert signal.server_waiting(10.25) is None  # stale: ignored
    signal.report(11.0, None, None)  # a report that says nothing changes nothing
    assert signal.age(11.0) == pytest.approx(1.0)


def test_the_ttft_floor_is_the_fastest_first_token_and_recent_ones_are_smoothed() -> None:
    signal = LoadSignal(fresh_for=0.2)
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
            view = guard.snapshot().admission[url]
            assert view.server_waiting == 0.0 and view.server_kv_usage is not None
            assert 0.0 <= view.signal_age < 60.0
            assert view.ttft_floor is not None and view.in_flight == 0
