"""What every bench client measures: `Sample` and `consume_sse`."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest

from llmguard_client.bench.measure import Probe, Sample, StreamError, consume_sse


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
