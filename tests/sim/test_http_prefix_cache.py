"""A replica with a prefix cache over HTTP: hashes from the request's messages, vLLM's counters on /metrics."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from llmguard_client.server_hints import parse_vllm_metrics
from llmguard_tools.sim.cluster import SimCluster
from llmguard_tools.sim.protocol import Kind, parse_request
from tests.clients import plain_httpx
from tests.sim.conftest import ENGINE, one_off

SYSTEM = " ".join(f"sys{i}" for i in range(200))


def turn_body(*user: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}]
    for i, text in enumerate(user):
        if i:
            messages.append({"role": "assistant", "content": "tok tok tok"})
        messages.append({"role": "user", "content": text})
    return {"model": "sim-model", "messages": messages, "max_tokens": 2, "ignore_eos": True}


def metric(text: str, name: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(name + "{")]
    return float(line.rsplit(" ", 1)[1])


async def test_a_second_turn_hits_its_first_turns_prefix_and_metrics_count_it_in_tokens() -> None:
    engine = dataclasses.replace(ENGINE, prefix_cache_tokens=2048)
    async with SimCluster(one_off(engine)) as cluster, plain_httpx() as http:
        url = cluster.urls[0]
        first = await http.post(url + "/v1/chat/completions", json=turn_body("hello there"))
        second = await http.post(url + "/v1/chat/completions", json=turn_body("hello there", "and now"))
        assert first.status_code == second.status_code == 200
        text = (await http.get(url + "/metrics")).text
        assert "# TYPE vllm:prefix_cache_queries_total counter" in text
        assert metric(text, "vllm:prefix_cache_queries_total") == 202 + 207
        assert metric(text, "vllm:prefix_cache_hits_total") == 192  # the first turn's 12 full blocks of 16
        assert parse_vllm_metrics(text).waiting == 0.0  # the usual gauges still parse
        stats = (await http.get(url + "/sim/stats")).json()
        assert (stats["prefix_cache_queries"], stats["prefix_cache_hits"]) == (409, 192)
        await http.post(url + "/sim/reset")  # a bench's next client starts with a cold cache
        await http.post(url + "/v1/chat/completions", json=turn_body("hello there"))
        text = (await http.get(url + "/metrics")).text
        assert metric(text, "vllm:prefix_cache_queries_total") == 202
        assert metric(text, "vllm:prefix_cache_hits_total") == 0


async def test_without_a_cache_metrics_carry_no_prefix_counters() -> None:
    async with SimCluster(one_off()) as cluster, plain_httpx() as http:
        await http.post(cluster.urls[0] + "/v1/chat/completions", json=turn_body("hello"))
        text = (await http.get(cluster.urls[0] + "/metrics")).text
        assert "prefix_cache" not in text
        assert (await http.get(cluster.urls[0] + "/sim/stats")).json()["prefix_cache_queries"] == 0


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("chat", {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "q"}]}),
        ("messages", {"system": SYSTEM, "messages": [{"role": "user", "content": "q"}], "max_tokens": 5}),
        ("responses", {"instructions": SYSTEM, "input": "q"}),
        ("text", {"prompt": SYSTEM + " q"}),
    ],
)
def test_every_endpoint_hashes_the_system_prompt_first(kind: Kind, body: dict[str, Any]) -> None:
    parsed = parse_request(json.dumps(body).encode(), kind, "m", block_tokens=16)
    assert len(parsed.block_hashes) == 201 // 16
    assert parse_request(json.dumps(body).encode(), kind, "m").block_hashes == ()  # not asked: not computed


def test_the_prompt_counts_what_is_hashed_whether_or_not_it_is_hashed() -> None:
    body = {"instructions": "be brief today", "input": "one two"}  # a string input: instructions count too
    for block in (0, 2):
        assert parse_request(json.dumps(body).encode(), "responses", "m", block_tokens=block).prompt_tokens == 5
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a b c"}, {"type": "image"}]}]}
    for block in (0, 2):
        parsed = parse_request(json.dumps(parts).encode(), "chat", "m", block_tokens=block)
        assert parsed.prompt_tokens == 3 and len(parsed.block_hashes) == (1 if block else 0)
