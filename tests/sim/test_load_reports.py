"""A replica reports its load as vLLM does: ``/metrics``, ``/load`` and the ORCA header on non-streaming answers."""

from __future__ import annotations

import dataclasses
import functools

import anyio
import httpx

from llmguard_client.server_hints import parse_vllm_metrics
from llmguard_tools.sim.cluster import SimCluster
from llmguard_tools.sim.scenarios import SCENARIOS
from tests.clients import plain_httpx
from tests.sim.conftest import ENGINE, chat_body, one_off, wait_until

ORCA = {"endpoint-load-metrics-format": "text"}

# Slow steps and no admission: requests pile up in the waiting queue and stay there long enough to be seen.
QUEUEING = dataclasses.replace(ENGINE, policy="none", step_s=0.05, max_running=1)


def test_collapse_is_overload_without_admission() -> None:
    collapse, overload = SCENARIOS["collapse"], SCENARIOS["overload"]
    assert collapse.engine == dataclasses.replace(overload.engine, policy="none", history_every_s=0.1, history_len=600)
    assert (collapse.load, collapse.replicas, collapse.capacity_rps) == (
        overload.load,
        overload.replicas,
        overload.capacity_rps,
    )


async def test_load_and_metrics_count_the_queue_of_a_replica_without_admission() -> None:
    async with SimCluster(one_off(QUEUEING)) as cluster, plain_httpx(timeout=10.0) as http:
        url = cluster.urls[0]
        engine = cluster.replicas[0].engine
        assert (await http.get(url + "/load")).json() == {"server_load": 0}
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(
                    functools.partial(
                        http.post, url + "/v1/chat/completions", json=chat_body(max_tokens=20, stream=False)
                    )
                )
            await wait_until(lambda: engine.running + engine.waiting == 4)
            held = engine.running + engine.waiting
            assert (await http.get(url + "/load")).json() == {"server_load": held}
            metrics = parse_vllm_metrics((await http.get(url + "/metrics")).text)
            assert metrics.waiting == float(engine.waiting) and engine.waiting >= 3
            tg.cancel_scope.cancel()
        stats = (await http.get(url + "/sim/stats")).json()
        assert (stats["received"], stats["metrics_requests"]) == (4, 1)  # a poll is counted apart from the calls


async def test_a_non_streaming_answer_carries_the_orca_report_when_asked() -> None:
    async with SimCluster(one_off(QUEUEING)) as cluster, plain_httpx(timeout=10.0) as http:
        url = cluster.urls[0] + "/v1/chat/completions"
        engine = cluster.replicas[0].engine
        answers: list[httpx.Response] = []

        async def measured() -> None:
            answers.append(await http.post(url, json=chat_body(max_tokens=2, stream=False), headers=ORCA))

        async with anyio.create_task_group() as tg:
            tg.start_soon(measured)
            await wait_until(lambda: engine.running == 1)
            seq = engine._running[0]
            engine.pause(seq, float("inf"))  # held until three more requests queue behind it
            for _ in range(3):
                tg.start_soon(functools.partial(http.post, url, json=chat_body(max_tokens=40, stream=False)))
            await wait_until(lambda: engine.waiting == 3)
            seq.paused_until = 0.0
            await wait_until(lambda: bool(answers))
            tg.cancel_scope.cancel()
        report = answers[0].headers["endpoint-load-metrics"]
        assert report.startswith("TEXT ")
        fields = dict(part.split("=") for part in report[len("TEXT ") :].split(", "))
        assert set(fields) == {"named_metrics.num_requests_waiting", "named_metrics.kv_cache_usage_perc"}
        # read when the answer is sent: one of the three took the freed slot in the step that finished it
        assert float(fields["named_metrics.num_requests_waiting"]) == 2.0
        assert 0.0 < float(fields["named_metrics.kv_cache_usage_perc"]) <= 1.0
        unasked = await http.post(url, json=chat_body(max_tokens=1, stream=False))
        streamed = await http.post(url, json=chat_body(max_tokens=1), headers=ORCA)
        assert "endpoint-load-metrics" not in unasked.headers  # only when asked
        assert "endpoint-load-metrics" not in streamed.headers  # streams carry none, as with vLLM
