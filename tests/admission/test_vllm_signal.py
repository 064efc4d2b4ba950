"""Admission's load signal from a real vLLM engine (skipped unless ``LLMGUARD_VLLM_URL`` points at one that
answers /health).

    /work/shared/tools/vllm/setup.sh serve --no-enable-prefix-caching            # port 8011, no queue limit
    LLMGUARD_VLLM_URL=http://127.0.0.1:8011 python -m pytest -n 0 tests/admission/test_vllm_signal.py

vLLM (0.32) answers a non-streamed chat call that asks with ``endpoint-load-metrics-format: text`` with an
``endpoint-load-metrics`` header (ORCA) read from its Prometheus registry: ``vllm:num_requests_waiting`` and
``vllm:kv_cache_usage_perc``, the same gauges ``/metrics`` shows. Any ``--max-num-seqs`` works: the second test
reads from ``/metrics`` how many of its calls the engine runs and how many wait, and checks that the header says
the same (with ``--max-num-seqs 2`` both report a waiting queue; with the default, both report none).
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import httpx
import openai

from llmguard_client import Admission, Guard, Tier
from tests.vllm_engine import NEEDS_VLLM, URL

pytestmark = NEEDS_VLLM
TIERS = {"t": Tier(ttft=20.0, total=60.0)}
BACKGROUND = 4
"""Long calls sent beside the guard's, so that the engine has something to report."""


def _messages() -> list[dict[str, str]]:
    """A fresh prompt (no prefix-cache hit can shorten a call)."""
    return [{"role": "user", "content": f"hello {uuid.uuid4().hex}"}]


def _gauges(text: str) -> dict[str, float]:
    """The unlabelled-by-reason gauges of vLLM's ``/metrics`` that the ORCA header carries, and the running count."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
            out[name] = float(rest.rpartition("}")[2])
    return out


async def _metrics(http: httpx.AsyncClient) -> dict[str, float]:
    response = await http.get(URL + "/metrics")
    response.raise_for_status()
    return _gauges(response.text)


async def _settle(http: httpx.AsyncClient, expected: int) -> dict[str, float]:
    """/metrics once the engine holds ``expected`` calls (running or waiting); a guard against a stuck engine."""
    with anyio.fail_after(30):
        while True:
            gauges = await _metrics(http)
            if gauges["vllm:num_requests_running"] + gauges["vllm:num_requests_waiting"] >= expected:
                return gauges
            await anyio.sleep(0.02)


async def _create(oai: openai.AsyncOpenAI, max_tokens: int) -> Any:
    return await oai.chat.completions.create(
        model="tiny-llama",
        messages=_messages(),
        max_tokens=max_tokens,
        extra_body={"ignore_eos": True},  # type: ignore[arg-type]
    )


async def test_a_non_streamed_answer_brings_vllms_orca_report_into_the_snapshot() -> None:
    # Believed for a minute: how soon the snapshot is read after the answer is not what this test checks.
    admission = Admission(signal_fresh_for=60.0)
    async with Guard([URL], tiers=TIERS, instrumentation=None, hedge=None, admission=admission) as guard:
        oai = openai.AsyncOpenAI(base_url=URL + "/v1", api_key="sk", http_client=guard.http_client(), max_retries=0)
        before = guard.snapshot().admission
        answer = await _create(oai, 5)
        assert answer.usage is not None and answer.usage.completion_tokens == 5
        view = guard.snapshot().admission[URL]
        await oai.close()
    assert URL not in before or before[URL].server_waiting is None
    assert view.server_waiting is not None and view.server_waiting >= 0.0
    assert view.server_kv_usage is not None and 0.0 <= view.server_kv_usage <= 1.0
    assert 0.0 <= view.signal_age < 60.0
    assert view.ttft_floor is not None and view.in_flight == 0


async def test_without_the_ask_vllm_sends_no_report() -> None:
    admission = Admission(signal_fresh_for=60.0, ask_load_reports=False)
    async with Guard([URL], tiers=TIERS, instrumentation=None, hedge=None, admission=admission) as guard:
        oai = openai.AsyncOpenAI(base_url=URL + "/v1", api_key="sk", http_client=guard.http_client(), max_retries=0)
        await _create(oai, 5)
        view = guard.snapshot().admission[URL]
        await oai.close()
    assert view.server_waiting is None and view.server_kv_usage is None and view.signal_age == float("inf")
    assert view.ttft_floor is not None  # the call itself was admitted and taught the gate its first token


async def test_the_reported_queue_and_kv_use_are_the_engines_own_gauges() -> None:
    """The guard's call is sent first, then ``BACKGROUND`` longer calls (plain httpx): while the guard's call
    runs, the engine holds all of them, running or (past ``--max-num-seqs``) waiting; when it ends, the ORCA
    report it brings back names the same queue ``/metrics`` shows and a KV use above zero."""
    admission = Admission(signal_fresh_for=60.0)
    async with (
        Guard([URL], tiers=TIERS, instrumentation=None, hedge=None, admission=admission) as guard,
        httpx.AsyncClient(timeout=60.0) as http,
        anyio.create_task_group() as tg,
    ):
        oai = openai.AsyncOpenAI(base_url=URL + "/v1", api_key="sk", http_client=guard.http_client(), max_retries=0)
        idle = await _metrics(http)
        assert idle["vllm:num_requests_running"] + idle["vllm:num_requests_waiting"] == 0, "the engine is not idle"
        answer: list[Any] = []
        answered = anyio.Event()

        async def guarded() -> None:
            answer.append(await _create(oai, 600))
            answered.set()

        async def background() -> None:
            body = {"model": "tiny-llama", "messages": _messages(), "max_tokens": 990, "ignore_eos": True}
            await http.post(URL + "/v1/chat/completions", json=body)

        tg.start_soon(guarded)
        await _settle(http, 1)  # the guard's call is in the engine first: nothing it waits behind
        for _ in range(BACKGROUND):
            tg.start_soon(background)
        held = await _settle(http, 1 + BACKGROUND)
        await answered.wait()
        view = guard.snapshot().admission[URL]
        after = await _metrics(http)
        tg.cancel_scope.cancel()  # closing the background calls' connections aborts them in the engine
        await oai.close()
    assert answer[0].usage.completion_tokens == 600
    assert answer[0].choices[0].finish_reason == "length"
    reported = view.server_waiting
    assert reported is not None
    # Nothing new arrived and the background calls outlast the guard's: the queue can only have shrunk by the
    # one call that took the guard's place, between the moment the header was written and /metrics was read.
    waiting_then, waiting_now = held["vllm:num_requests_waiting"], after["vllm:num_requests_waiting"]
    assert waiting_now <= reported <= waiting_then
    assert reported - waiting_now <= 1
    assert view.server_kv_usage is not None and view.server_kv_usage > 0.0
    assert after["vllm:kv_cache_usage_perc"] > 0.0
