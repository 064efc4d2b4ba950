"""The replicas speak OpenAI's wire format: checked with the real ``openai`` package and raw SSE."""

from __future__ import annotations

import json

import anyio
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from llmguard_tools.sim.cluster import SimCluster
from tests.clients import plain_httpx, plain_sdk
from tests.sim.conftest import chat_body, one_off


def make_client(url: str) -> openai.AsyncOpenAI:
    return plain_sdk(url, max_retries=0)


async def test_chat_stream_with_usage_parsed_by_openai() -> None:
    async with SimCluster(one_off()) as cluster, make_client(cluster.urls[0]) as client:
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "one two three"}],
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        chunks = [chunk async for chunk in stream]
    first, *content, finish, usage = chunks
    assert first.object == "chat.completion.chunk" and first.model == "m"
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert [c.choices[0].delta.content for c in content] == [" tok"] * 7
    assert all(c.choices[0].finish_reason is None and c.usage is None for c in content)
    assert finish.choices[0].finish_reason == "length" and finish.choices[0].delta.content is None
    assert usage.choices == [] and usage.usage is not None
    assert (usage.usage.prompt_tokens, usage.usage.completion_tokens, usage.usage.total_tokens) == (5, 7, 12)
    assert len({c.id for c in chunks}) == 1


async def test_raw_sse_framing_ends_with_done() -> None:
    async with SimCluster(one_off()) as cluster, plain_httpx() as http:
        response = await http.post(cluster.urls[0] + "/v1/chat/completions", json=chat_body(max_tokens=3))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.text.endswith("data: [DONE]\n\n")
    events = response.text.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert len(payloads) == 1 + 3 + 1 + 1
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"]["completion_tokens"] == 3
    assert all(p["usage"] is None for p in payloads[:-1])


async def test_stream_without_include_usage_has_no_usage() -> None:
    async with SimCluster(one_off()) as cluster, make_client(cluster.urls[0]) as client:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True
        )
        chunks = [chunk async for chunk in stream]
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert 1 <= sum(1 for c in chunks if c.choices[0].delta.content == " tok") <= 2


async def test_chat_non_stream() -> None:
    async with SimCluster(one_off()) as cluster, make_client(cluster.urls[0]) as client:
        result = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "a b c d"}], max_tokens=4, extra_body={"ignore_eos": True}
        )
    assert result.object == "chat.completion"
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].message.content == " tok" * 4
    assert result.choices[0].finish_reason == "length"
    assert result.usage is not None and (result.usage.prompt_tokens, result.usage.completion_tokens) == (4, 4)


async def test_sampled_output_is_capped_by_max_tokens() -> None:
    results: list[ChatCompletion] = []

    async def one(client: openai.AsyncOpenAI) -> None:
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "x"}]
        results.append(await client.chat.completions.create(model="m", messages=messages, max_tokens=8))

    async with (
        SimCluster(one_off()) as cluster,
        make_client(cluster.urls[0]) as client,
        anyio.create_task_group() as tg,
    ):
        for _ in range(8):
            tg.start_soon(one, client)
    assert len(results) == 8
    for result in results:
        assert result.usage is not None and 1 <= result.usage.completion_tokens <= 8
        expected = "length" if result.usage.completion_tokens == 8 else "stop"
        assert result.choices[0].finish_reason == expected


async def test_text_completions_stream_and_plain() -> None:
    async with SimCluster(one_off()) as cluster, make_client(cluster.urls[0]) as client:
        stream = await client.completions.create(
            model="m",
            prompt="one two",
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        chunks = [chunk async for chunk in stream]
        plain = await client.completions.create(
            model="m", prompt="one two", max_tokens=3, extra_body={"ignore_eos": True}
        )
    assert [c.choices[0].text for c in chunks[:3]] == [" tok"] * 3
    assert chunks[3].choices[0].finish_reason == "length"
    assert chunks[4].usage is not None and chunks[4].usage.prompt_tokens == 2
    assert plain.object == "text_completion" and plain.choices[0].text == " tok" * 3


async def test_models_stats_and_reset() -> None:
    async with SimCluster(one_off(replicas=2)) as cluster, make_client(cluster.urls[1]) as client:
        models = await client.models.list()
        assert [m.id for m in models.data] == ["sim-model"]
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "a b"}], max_tokens=3, extra_body={"ignore_eos": True}
        )
        async with plain_httpx() as http:
            stats = (await http.get(cluster.urls[1] + "/sim/stats")).json()
            other = (await http.get(cluster.urls[0] + "/sim/stats")).json()
            assert (await http.post(cluster.urls[1] + "/sim/reset")).status_code == 200
            after = (await http.get(cluster.urls[1] + "/sim/stats")).json()
    for key in ("received", "admitted", "completed"):
        assert stats[key] == 1 and other[key] == 0 and after[key] == 0
    assert stats["prefill_tokens"] == 2 and stats["decode_tokens"] == 3 and stats["work_tokens"] == 5
    expected = {
        "rejected", "aborted_by_disconnect", "recompute_tokens", "aborted_work_tokens", "preemptions",
        "running", "waiting", "kv_used", "kv_total", "reserved", "history",
    }  # fmt: skip
    assert expected <= stats.keys()
    assert stats["kv_total"] == 4096 and stats["kv_used"] == stats["reserved"] == stats["running"] == 0
    assert all(len(sample) == 4 for sample in stats["history"]) and len(stats["history"]) <= 240


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", b'{"messages": []}', b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}'],
)
async def test_bad_requests_get_400(body: bytes) -> None:
    async with SimCluster(one_off()) as cluster, plain_httpx() as http:
        response = await http.post(cluster.urls[0] + "/v1/chat/completions", content=body)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_too_long_request_gets_400() -> None:
    async with SimCluster(one_off()) as cluster, make_client(cluster.urls[0]) as client:
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x " * 100}], max_tokens=4000
            )
