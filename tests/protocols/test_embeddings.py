"""An embeddings answer is passed through as it flows, its model and usage noted from the body's two ends."""

from __future__ import annotations

import base64
import json
import random
import struct
from typing import Any

import openai
import pytest

from llmguard_client import Guard, PhaseRecord
from llmguard_client.protocols.embeddings import EDGE, EmbeddingsReader
from tests.loopback import LoopbackServer, Script


def vectors(count: int, dims: int, encoding: str) -> list[dict[str, Any]]:
    rng = random.Random(count)
    data = []
    for index in range(count):
        values = [rng.uniform(-1, 1) for _ in range(dims)]
        embedding: Any = values
        if encoding == "base64":
            embedding = base64.b64encode(struct.pack(f"{dims}f", *values)).decode()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    return data


def openai_body(count: int, encoding: str = "float", **usage: Any) -> dict[str, Any]:
    """OpenAI's order: data first, then model and usage."""
    usage = usage or {"prompt_tokens": 7, "total_tokens": 7}
    return {"object": "list", "data": vectors(count, 256, encoding), "model": "emb-3", "usage": usage}


def vllm_body(count: int) -> dict[str, Any]:
    """vLLM's order: id, model before data, usage last."""
    return {
        "id": "embd-1",
        "object": "list",
        "created": 1,
        "model": "emb-vllm",
        "data": vectors(count, 256, "float"),
        "usage": {"prompt_tokens": 11, "total_tokens": 11, "completion_tokens": 0},
    }


def read(body: bytes, chunk: int) -> EmbeddingsReader:
    reader = EmbeddingsReader()
    for i in range(0, len(body), chunk):
        reader.feed(body[i : i + chunk])
    assert reader.end_of_body() is None and reader.complete and reader.failure is None
    return reader


@pytest.mark.parametrize("count", [1, 40], ids=["small", "larger-than-both-ends"])
@pytest.mark.parametrize("chunk", [1, 1000, 1 << 20])
@pytest.mark.parametrize(
    ("body", "model", "prompt_tokens"),
    [
        (openai_body, "emb-3", 7),
        (lambda n: openai_body(n, "base64"), "emb-3", 7),
        (lambda n: openai_body(n, prompt_tokens=3, total_tokens=3, details={"cached": 1}), "emb-3", 3),
        (vllm_body, "emb-vllm", 11),
    ],
    ids=["openai", "openai-base64", "nested-usage", "vllm"],
)
def test_the_model_and_usage_are_read_from_either_end_however_the_body_is_split(
    body: Any, model: str, prompt_tokens: int, count: int, chunk: int
) -> None:
    raw = json.dumps(body(count), separators=(",", ":") if chunk == 1000 else (", ", ": ")).encode()
    assert count == 1 or len(raw) > 2 * EDGE
    reader = read(raw, chunk)
    assert (reader.facts.model, reader.facts.prompt_tokens) == (model, prompt_tokens)


def test_a_usage_inside_the_data_array_is_not_taken_for_the_answers() -> None:
    body = openai_body(40)
    body["data"][-1]["usage"] = {"prompt_tokens": 999}
    reader = read(json.dumps(body).encode(), 1000)
    assert reader.facts.prompt_tokens == 7


@pytest.mark.parametrize("body", [b"", b"not json", b'{"object": "list", "data": []}', b'{"usage": {"prompt'])
def test_a_body_without_them_leaves_them_unknown_and_is_never_a_failure(body: bytes) -> None:
    reader = read(body, 5)
    assert (reader.facts.model, reader.facts.prompt_tokens) == (None, None)


def test_its_first_bytes_are_its_first_token() -> None:
    reader = EmbeddingsReader()
    assert reader.feed(b"") is False
    assert reader.feed(b'{"object"') is True


async def test_a_guarded_embeddings_call_records_its_model_and_usage(servers: list[LoopbackServer]) -> None:
    """The record (and so the span and the token-usage metric) has what the SDK sees."""
    servers[0].script = Script(body=openai_body(40))
    records: list[PhaseRecord] = []
    async with Guard([servers[0].url], instrumentation=None, on_record=records.append) as guard:
        oai = openai.AsyncOpenAI(
            base_url=servers[0].url + "/v1", api_key="sk", http_client=guard.http_client_for(openai.AsyncOpenAI)
        )
        result = await oai.embeddings.create(model="emb", input="hello")
    (record,) = records
    assert (record.response_model, record.prompt_tokens) == (result.model, result.usage.prompt_tokens) == ("emb-3", 7)
    assert len(result.data) == 40 and record.status == "ok"


@pytest.mark.parametrize(
    "usage",
    [{"prompt_tokens": 7, "total_tokens": 7}, {"prompt_tokens": 11, "total_tokens": 11, "completion_tokens": 0}],
    ids=["openai", "vllm"],
)
def test_an_embedding_generates_no_tokens_whether_its_usage_says_so_or_not(usage: dict[str, int]) -> None:
    """OpenAI's usage has no completion count: the call's tokens were unknown, and a rate limit's charge for it was
    never corrected."""
    reader = read(json.dumps(openai_body(1, **usage)).encode(), 1 << 20)
    assert (reader.facts.prompt_tokens, reader.facts.completion_tokens) == (usage["prompt_tokens"], 0)
    silent = read(json.dumps({"object": "list", "data": vectors(1, 8, "float"), "model": "m"}).encode(), 1 << 20)
    assert silent.facts.completion_tokens is None  # no usage: nothing known
