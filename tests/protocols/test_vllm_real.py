"""Against a real vLLM server (skipped unless ``LLMGUARD_VLLM_URL`` points at one that answers /health).

    PORT=8031 /work/shared/tools/vllm/setup.sh serve --max-num-seqs 1 --max-num-queued-reqs 1
    LLMGUARD_VLLM_URL=http://127.0.0.1:8031 python -m pytest tests/protocols/test_vllm_real.py

The overflow test needs the queue limits above: concurrent streaming requests then race past vLLM's
pre-flight admission check and get HTTP 200 + ``data: {"error": {..., "code": 503}}`` + ``[DONE]``.
"""

from __future__ import annotations

from typing import Any

import anyio
import openai

from llmguard_client import BudgetPolicy, Guard, PhaseRecord, Tier
from tests.loopback import LoopbackServer, Script
from tests.vllm_engine import NEEDS_VLLM, URL

pytestmark = NEEDS_VLLM
MESSAGES = [{"role": "user", "content": "hello"}]


def make_guard(urls: list[str], records: list[PhaseRecord], **kwargs: Any) -> Guard:
    kwargs.setdefault("hedge", None)
    tiers = {"t": Tier(ttft=20.0, total=60.0)}
    return Guard(replicas=urls, tiers=tiers, instrumentation=None, on_record=records.append, **kwargs)


async def test_each_protocol_streams_ok_with_usage() -> None:
    records: list[PhaseRecord] = []
    async with make_guard([URL], records) as guard:
        oai = openai.AsyncOpenAI(base_url=URL + "/v1", api_key="sk", http_client=guard.http_client())
        stream = await oai.chat.completions.create(
            model="tiny-llama", messages=MESSAGES, max_tokens=5, stream=True, stream_options={"include_usage": True}
        )
        _ = [chunk async for chunk in stream]
        stream2 = await oai.completions.create(
            model="tiny-llama", prompt="hello", max_tokens=5, stream=True, stream_options={"include_usage": True}
        )
        _ = [chunk async for chunk in stream2]
        events = await oai.responses.create(model="tiny-llama", input="hello", max_output_tokens=5, stream=True)
        _ = [event async for event in events]
        async with guard.http_client() as client:
            body = {"model": "tiny-llama", "max_tokens": 5, "messages": MESSAGES, "stream": True}
            async with client.stream("POST", URL + "/v1/messages", json=body) as response:
                await response.aread()
    assert [r.status for r in records] == ["ok"] * 4
    assert all(r.first_token is not None and r.completion_tokens == 5 and r.prompt_tokens for r in records)


async def test_queue_overflow_in_stream_goes_to_another_replica(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=5)
    records: list[PhaseRecord] = []
    # A burst of 12 simultaneous calls: about half go to vLLM before any of them learns it overflows, and the
    # default budget (10 % of calls + 4) would pay for only 5 of their retries (the rest get vLLM's 503).
    budget = BudgetPolicy(ratio=1.0, floor=12)
    async with make_guard([URL, servers[0].url], records, budget=budget) as guard:
        oai = openai.AsyncOpenAI(base_url=URL + "/v1", api_key="sk", http_client=guard.http_client())

        async def one() -> None:
            stream = await oai.chat.completions.create(
                model="tiny-llama", messages=MESSAGES, max_tokens=20, stream=True
            )
            _ = [chunk async for chunk in stream]

        async with anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(one)
    assert [r.status for r in records] == ["ok"] * 12
    failed = [a for r in records for a in r.attempts if a.outcome == "failed"]
    assert failed, "vLLM never overflowed: start it with --max-num-seqs 1 --max-num-queued-reqs 1"
    assert {a.error for a in failed} <= {"stream_error_event", "http_503"}
    assert all(a.replica == URL for a in failed)
