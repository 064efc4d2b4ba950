"""The degraded-replica knobs: a first-token delay, a slowdown limited to a window, and /metrics."""

from __future__ import annotations

import anyio
import pytest

from llmguard_client.server_hints import parse_vllm_metrics
from llmguard_tools.sim.cluster import SimCluster
from llmguard_tools.sim.faults import FaultConfig
from tests.clients import plain_httpx
from tests.sim.conftest import chat_body, one_off
from tests.sim.test_http_faults import stream_timings

DELAY = 0.2
"""The first-token delay (s): several 10 ms engine steps, and short, because these tests wait it out."""


async def test_first_token_delay_holds_every_request_and_is_not_a_fault() -> None:
    scenario = one_off(faults=(FaultConfig(first_token_delay_s=DELAY), FaultConfig()), replicas=2)
    async with SimCluster(scenario) as cluster:
        _, slow = await stream_timings(cluster.urls[0] + "/v1/chat/completions", chat_body(max_tokens=3))
        _, fast = await stream_timings(cluster.urls[1] + "/v1/chat/completions", chat_body(max_tokens=3))
        # Relative checks: on a loaded machine both streams run late by about the same amount.
        assert slow[0] >= DELAY and fast[0] < slow[0]
        assert slow[-1] - slow[0] < slow[0] - fast[0]  # only the first token waits
        assert cluster.replicas[0].counters.stalled_first == 0


async def test_a_slowdown_window_applies_only_inside_it() -> None:
    # The window outlasts the slow stream (DELAY + 5 steps of 80 ms, about 0.6 s) with room for a loaded machine.
    degraded = FaultConfig(slow_factor=8.0, first_token_delay_s=DELAY, slow_between=(0.0, 1.0))
    async with SimCluster(one_off(faults=(degraded,))) as cluster:
        url = cluster.urls[0] + "/v1/chat/completions"
        assert cluster.replicas[0].slow_now()
        _, during = await stream_timings(url, chat_body(max_tokens=5))
        await anyio.sleep(max(0.0, 1.1 - during[-1]))
        assert not cluster.replicas[0].slow_now()
        _, after = await stream_timings(url, chat_body(max_tokens=5))
        assert during[0] >= DELAY and after[0] < during[0]
        assert (during[-1] - during[0]) > 2 * (after[-1] - after[0])  # 80 ms steps, then 10 ms


def test_bad_degradation_knobs_are_refused() -> None:
    with pytest.raises(ValueError, match="first_token_delay_s must be >= 0"):
        FaultConfig(first_token_delay_s=-1)
    with pytest.raises(ValueError, match="slow_between must be"):
        FaultConfig(slow_between=(5.0, 1.0))
    assert FaultConfig(slow_between=(1.0, 2.0)).slow_at(1.5) and not FaultConfig(slow_between=(1.0, 2.0)).slow_at(2.0)


async def test_metrics_report_the_queue_and_kv_use_as_vllm_does() -> None:
    async with SimCluster(one_off()) as cluster, plain_httpx() as http:
        response = await http.get(cluster.urls[0] + "/metrics")
        assert response.status_code == 200
        load = parse_vllm_metrics(response.text)
        assert load.waiting == 0.0 and load.kv_usage == 0.0
