"""The simulated replicas fail inside HTTP 200 streams the way real engines do, and speak /v1/responses and
/v1/messages; the guard reads them with the same protocol readers."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest

from llmguard_client.protocols import reader_for
from llmguard_tools.sim.cluster import SimCluster
from llmguard_tools.sim.engine import EngineConfig
from llmguard_tools.sim.faults import FaultConfig, draw_faults
from llmguard_tools.sim.scenarios import SCENARIOS
from tests.clients import plain_httpx, plain_sdk
from tests.sim.conftest import chat_body, one_off

TIGHT = EngineConfig(step_s=0.02, tbud=128, kv_tokens=100, policy="token", out_reserve=32)
VLLM_STYLE = FaultConfig(overload_signal="in_stream")
PROMPT = " ".join(["word"] * 5)
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": chat_body(),
    "/v1/completions": {
        "model": "m",
        "prompt": PROMPT,
        "max_tokens": 5,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    },
    "/v1/responses": {"model": "m", "input": PROMPT, "max_output_tokens": 5, "ignore_eos": True, "stream": True},
    "/v1/messages": {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 5,
        "ignore_eos": True,
        "stream": True,
    },
}


async def read(http: httpx.AsyncClient, url: str, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    async with http.stream("POST", url + path, json=body) as response:
        raw = await response.aread()
    return response.status_code, response.headers.get("content-type", ""), raw


def judge(path: str, content_type: str, raw: bytes, stream: bool = True) -> Any:
    reader = reader_for("POST", path, content_type, stream)
    reader.feed(raw)
    reader.end_of_body()
    return reader


@pytest.mark.parametrize("path", list(BODIES))
async def test_every_endpoint_streams_a_complete_answer_with_usage(path: str) -> None:
    async with SimCluster(one_off()) as cluster, plain_httpx() as http:
        status, content_type, raw = await read(http, cluster.urls[0], path, BODIES[path])
        plain = await http.post(cluster.urls[0] + path, json={**BODIES[path], "stream": False})
    assert status == 200
    reader = judge(path, content_type, raw)
    assert reader.first_token and reader.complete and reader.failure is None
    assert (reader.facts.prompt_tokens, reader.facts.completion_tokens) == (5, 5)
    body = judge(path, plain.headers["content-type"], plain.content, stream=False)
    assert body.failure is None and body.facts.completion_tokens == 5


async def test_openai_responses_stream_from_the_sim() -> None:
    async with (
        SimCluster(one_off()) as cluster,
        plain_sdk(cluster.urls[0], max_retries=0) as client,
    ):
        stream = await client.responses.create(model="m", input=PROMPT, max_output_tokens=4, stream=True)
        events = [event async for event in stream]
    assert [e.delta for e in events if e.type == "response.output_text.delta"] == [" tok"] * 4
    assert events[-1].type == "response.incomplete" and events[-1].response.usage.output_tokens == 4  # type: ignore[union-attr]


@pytest.mark.parametrize("path", list(BODIES))
async def test_vllm_style_overload_is_a_200_with_an_error_event(path: str) -> None:
    async with SimCluster(one_off(TIGHT, faults=(VLLM_STYLE,))) as cluster, plain_httpx() as http:
        url = cluster.urls[0]
        big = {**BODIES[path], "max_tokens": 40, "max_output_tokens": 40}
        words = " ".join(["word"] * 50)
        for key in ("messages", "prompt", "input"):
            if key in big:
                big[key] = [{"role": "user", "content": words}] if key == "messages" else words
        async with http.stream("POST", url + path, json=big) as holder:  # takes the whole admission budget
            assert holder.status_code == 200
            rejected = await read(http, url, path, big)
            plain = await http.post(url + path, json={**big, "stream": False})
        stats = (await http.get(url + "/sim/stats")).json()
    status, content_type, raw = rejected
    assert status == 200 and "text/event-stream" in content_type
    assert b"currently busy" in raw
    reader = judge(path, content_type, raw)
    assert reader.failure is not None and reader.failure.kind == "error_event" and reader.failure.overload
    if path in ("/v1/chat/completions", "/v1/completions"):
        error = json.loads(raw.split(b"\n\n")[0][len(b"data: ") :])["error"]
        assert (error["code"], error["type"]) == (503, "Service Unavailable")
        assert raw.endswith(b"data: [DONE]\n\n")
    assert plain.status_code == 503 and "retry-after" not in plain.headers
    assert plain.json()["error"]["code"] == 503
    assert stats["faults"]["overload_in_stream"] == 1 and stats["rejected"] == 2


@pytest.mark.parametrize("path", list(BODIES))
async def test_an_error_event_before_the_first_token(path: str) -> None:
    async with SimCluster(one_off(faults=(FaultConfig(error_first_p=1.0),))) as cluster, plain_httpx() as http:
        status, content_type, raw = await read(http, cluster.urls[0], path, BODIES[path])
        assert cluster.replicas[0].counters.error_first == 1
        assert cluster.replicas[0].engine.stats.admitted == 0  # never ran
    reader = judge(path, content_type, raw)
    assert status == 200 and not reader.first_token
    assert reader.failure is not None and reader.failure.kind == "error_event" and reader.failure.status == 500


@pytest.mark.parametrize("path", list(BODIES))
async def test_an_error_event_after_the_first_tokens(path: str) -> None:
    faults = FaultConfig(error_mid_p=1.0, fault_after_tokens=2)
    async with SimCluster(one_off(faults=(faults,))) as cluster, plain_httpx() as http:
        status, content_type, raw = await read(http, cluster.urls[0], path, BODIES[path])
        replica = cluster.replicas[0]
        assert replica.counters.error_mid == 1
        assert replica.engine.reserved == replica.engine.kv_used == replica.engine.running == 0
    reader = judge(path, content_type, raw)
    assert status == 200 and reader.first_token and reader.chunks >= 2
    assert reader.failure is not None and reader.failure.kind == "error_event"


@pytest.mark.parametrize("path", list(BODIES))
async def test_truncation_after_the_first_tokens(path: str) -> None:
    faults = FaultConfig(truncate_p=1.0, fault_after_tokens=2)
    async with SimCluster(one_off(faults=(faults,))) as cluster, plain_httpx() as http:
        status, content_type, raw = await read(http, cluster.urls[0], path, BODIES[path])  # a clean EOF
        assert cluster.replicas[0].counters.truncated == 1
    reader = judge(path, content_type, raw)
    assert status == 200 and reader.first_token
    assert reader.failure is not None and reader.failure.kind == "truncated"
    assert b"[DONE]" not in raw and b"message_stop" not in raw and b"response.completed" not in raw


def test_stream_faults_leave_other_configs_replaying_as_before() -> None:
    """Six numbers per request without stream faults (as before they existed), nine with them."""
    reference = random.Random(1)
    numbers = [reference.random() for _ in range(10)]
    plain, with_stream = random.Random(1), random.Random(1)
    draw_faults(FaultConfig(reset_p=0.5), plain)
    draw_faults(FaultConfig(reset_p=0.5, truncate_p=0.5), with_stream)
    assert (plain.random(), with_stream.random()) == (numbers[6], numbers[9])


def test_the_in_stream_overload_scenario() -> None:
    scenario = SCENARIOS["overload-in-stream"]
    assert all(scenario.faults_for(i).overload_signal == "in_stream" for i in range(scenario.replicas))
    assert scenario.engine == SCENARIOS["overload"].engine and scenario.load == SCENARIOS["overload"].load


def test_fault_config_validates_the_new_knobs() -> None:
    with pytest.raises(ValueError, match="fault probabilities"):
        FaultConfig(truncate_p=1.5)
    with pytest.raises(ValueError, match="overload_signal"):
        FaultConfig(overload_signal="smoke")  # type: ignore[arg-type]
