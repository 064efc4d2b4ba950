"""What every bench client measures: `Sample` and `consume_sse`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from llmguard_tools.bench.measure import Probe, Sample, StreamError, consume_sse
from llmguard_tools.sim.cluster import SimCluster
from tests.clients import plain_httpx
from tests.sim.conftest import one_off


def sample(i: int, status: str = "ok", ttft: float | None = 0.1, e2e: float = 1.0, tokens: int = 10) -> Sample:
    return Sample(
        index=i, client="plain", status=status, http_status=200 if status == "ok" else None, cause=None,
        scheduled=0.0, lag=0.0, ttft=ttft, e2e=e2e, completion_tokens=tokens, prompt_tokens=5, attempts=1,
    )  # fmt: skip


def test_tpot() -> None:
    s = sample(0, ttft=0.2, e2e=1.2, tokens=11)
    assert s.tpot == pytest.approx(0.1)
    assert sample(0, tokens=1).tpot == 0.0
    assert sample(0, status="timeout").tpot is None


def _stream(*events: Any, done: bool = True) -> httpx.Response:
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return httpx.Response(200, content=body + (b"data: [DONE]\n\n" if done else b""))


def _read(response: httpx.Response) -> Probe:
    probe = Probe(t0=0.0)
    anyio.run(consume_sse, response, probe)
    return probe


def _delta(content: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": content}}]}


def test_consume_sse_counts_content_chunks_and_reads_usage() -> None:
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}
    probe = _read(_stream(role, _delta("a"), _delta("b"), _delta("c"), usage))
    assert probe.done and probe.content_chunks == 3 and probe.first_token is not None
    assert (probe.usage_prompt, probe.usage_completion) == (4, 3)


def test_consume_sse_fails_on_an_error_event_or_a_missing_done() -> None:
    with pytest.raises(StreamError, match="error event in stream"):
        _read(_stream(_delta("a"), {"error": {"message": "overloaded"}}))
    with pytest.raises(StreamError, match=r"stream ended without \[DONE\]"):
        _read(_stream(_delta("a"), done=False))


def test_consume_sse_reads_the_body_to_its_end_after_done() -> None:
    read_all = False

    async def body() -> AsyncIterator[bytes]:
        nonlocal read_all
        yield b"data: " + json.dumps(_delta("a")).encode() + b"\n\ndata: [DONE]\n\n"
        yield b"data: " + json.dumps(_delta("late")).encode() + b"\n\n"  # after [DONE]: read, not counted
        read_all = True

    probe = _read(httpx.Response(200, stream=_Stream(body())))
    assert read_all and probe.done and probe.content_chunks == 1


class _Stream(httpx.AsyncByteStream):
    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.chunks:
            yield chunk


async def test_a_client_reading_with_consume_sse_reuses_its_connection() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True, "ignore_eos": True}
    streams = []
    async with SimCluster(one_off()) as cluster, plain_httpx() as http:
        for _ in range(2):
            async with http.stream("POST", cluster.urls[0] + "/v1/chat/completions", json=body) as response:
                probe = Probe(t0=0.0)
                await consume_sse(response, probe)
                streams.append(response.extensions["network_stream"])
            assert probe.content_chunks == 3
    assert streams[0] is streams[1]  # the first request's connection went back to the pool
