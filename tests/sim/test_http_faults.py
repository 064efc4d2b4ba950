"""Every fault knob at probability 1 (with short durations) does what it says."""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import json
import time

import httpx
import openai
import pytest

from llmguard_tools.sim.cluster import SimCluster
from llmguard_tools.sim.engine import EngineConfig
from llmguard_tools.sim.faults import FaultConfig, RetryAfterStyle
from tests.clients import plain_httpx, plain_sdk
from tests.sim.conftest import ENGINE, chat_body, one_off, wait_until


async def stream_timings(url: str, body: dict[str, object], timeout: float = 10.0) -> tuple[float, list[float]]:
    """Seconds to the response headers and to every content token, from when the request is sent (building
    the client, ~30 ms of CPU for its TLS context and much more on a loaded machine, is not timed)."""
    tokens: list[float] = []
    async with plain_httpx(timeout=timeout) as http:
        start = time.monotonic()
        async with http.stream("POST", url, json=body) as response:
            headers_at = time.monotonic() - start
            async for line in response.aiter_lines():
                if '"content":" tok"' in line:
                    tokens.append(time.monotonic() - start)
    return headers_at, tokens


async def test_stall_before_first_token() -> None:
    # A 1 s stall, 50-100x the engine's steps: a busy machine stretches the steps, not into a second each.
    async with SimCluster(one_off(faults=(FaultConfig(stall_first_p=1.0, stall_first_s=1.0),))) as cluster:
        url = cluster.urls[0] + "/v1/chat/completions"
        headers_at, tokens = await stream_timings(url, chat_body(max_tokens=3))
        assert headers_at < 1.0 <= tokens[0] and len(tokens) == 3
        assert tokens[-1] - tokens[0] < 1.0  # the stall is before the first token only (else >= 2 s here)
        assert cluster.replicas[0].counters.stalled_first == 1


async def test_stall_mid_stream() -> None:
    faults = FaultConfig(stall_mid_p=1.0, stall_mid_s=1.0, fault_after_tokens=2)
    async with SimCluster(one_off(faults=(faults,))) as cluster:
        _, tokens = await stream_timings(cluster.urls[0] + "/v1/chat/completions", chat_body(max_tokens=4))
        gaps = [b - a for a, b in itertools.pairwise(tokens)]
        # The stall sits between the 2nd and 3rd token: 1 s, 50-100x a step, so no stretched step outgrows it.
        assert len(tokens) == 4 and gaps[1] >= 0.5 and gaps[1] == max(gaps)
        assert cluster.replicas[0].counters.stalled_mid == 1


async def test_slow_replica_multiplies_step_time() -> None:
    # x10: a busy machine stretches the fast replica's 10 ms steps, not to half the slow one's 100 ms.
    scenario = one_off(faults=(FaultConfig(slow_factor=10.0), FaultConfig()), replicas=2)
    async with SimCluster(scenario) as cluster:
        assert cluster.replicas[0].engine.config.step_period == pytest.approx(0.1)
        _, slow = await stream_timings(cluster.urls[0] + "/v1/chat/completions", chat_body(max_tokens=8))
        _, fast = await stream_timings(cluster.urls[1] + "/v1/chat/completions", chat_body(max_tokens=8))
    assert slow[-1] - slow[0] >= 7 * 0.1 * 0.7  # a first token seen late shortens the span a little
    assert (slow[-1] - slow[0]) > 2 * (fast[-1] - fast[0])


async def test_connection_reset_mid_stream() -> None:
    faults = FaultConfig(reset_p=1.0, fault_after_tokens=2)
    async with SimCluster(one_off(faults=(faults,))) as cluster, plain_httpx() as http:
        replica = cluster.replicas[0]
        lines: list[str] = []
        with pytest.raises(httpx.RemoteProtocolError):
            url = cluster.urls[0] + "/v1/chat/completions"
            async with http.stream("POST", url, json=chat_body(max_tokens=10)) as response:
                async for line in response.aiter_lines():
                    lines.append(line)
        assert sum('"content":" tok"' in line for line in lines) == 2
        assert not any("[DONE]" in line for line in lines)
        assert replica.counters.resets == 1 and replica.engine.stats.aborted_other == 1
        assert replica.engine.reserved == replica.engine.kv_used == replica.engine.running == 0
        # The replica keeps serving after the reset.
        assert (await http.get(cluster.urls[0] + "/sim/stats")).status_code == 200


async def test_connection_reset_non_stream() -> None:
    async with SimCluster(one_off(faults=(FaultConfig(reset_p=1.0),))) as cluster, plain_httpx() as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.post(cluster.urls[0] + "/v1/chat/completions", json=chat_body(max_tokens=3, stream=False))


async def test_malformed_event() -> None:
    faults = FaultConfig(malformed_p=1.0, fault_after_tokens=1)
    async with SimCluster(one_off(faults=(faults,))) as cluster, plain_httpx() as http:
        response = await http.post(cluster.urls[0] + "/v1/chat/completions", json=chat_body(max_tokens=3))
        assert cluster.replicas[0].counters.malformed == 1
    events = [e for e in response.text.split("\n\n") if e]
    bad = []
    for event in events:
        assert event.startswith("data: ")
        data = event.removeprefix("data: ")
        if data != "[DONE]":
            try:
                json.loads(data)
            except ValueError:
                bad.append(event)
    assert len(bad) == 1 and events[-1] == "data: [DONE]"
    assert response.text.count('"content":" tok"') == 3


async def test_html_500() -> None:
    async with SimCluster(one_off(faults=(FaultConfig(html_500_p=1.0),))) as cluster:
        async with plain_httpx() as http:
            response = await http.post(cluster.urls[0] + "/v1/chat/completions", json=chat_body())
        assert response.status_code == 500 and response.headers["content-type"].startswith("text/html")
        assert response.text.startswith("<html>")
        async with plain_sdk(cluster.urls[0], max_retries=0) as client:
            with pytest.raises(openai.InternalServerError):
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert cluster.replicas[0].engine.stats.submitted == 0


async def test_headers_never_sent() -> None:
    async with SimCluster(one_off(faults=(FaultConfig(blackhole_p=1.0),))) as cluster:
        async with plain_httpx(timeout=0.3) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post(cluster.urls[0] + "/v1/chat/completions", json=chat_body())
        replica = cluster.replicas[0]
        assert replica.counters.blackholed == 1 and replica.engine.stats.submitted == 0
        # The handler ended with the client (its task is gone), so shutdown has nothing to wait out; a time
        # bound could not tell this apart on a busy machine (uvicorn's graceful-shutdown timeout is only 1 s).
        await wait_until(lambda: not cluster._servers[0].server_state.tasks)


STYLES: tuple[RetryAfterStyle, ...] = ("seconds", "garbage", "negative", "huge", "http-date", "ms-only")
TIGHT = EngineConfig(step_s=0.02, tbud=128, kv_tokens=100, policy="token", out_reserve=32)


async def test_token_admission_429_and_retry_after_styles() -> None:
    scenario = one_off(TIGHT, faults=tuple(FaultConfig(retry_after=s) for s in STYLES), replicas=len(STYLES))
    async with SimCluster(scenario) as cluster, plain_httpx() as http:
        rejections: dict[str, httpx.Response] = {}
        for style, url in zip(STYLES, cluster.urls, strict=True):
            endpoint = url + "/v1/chat/completions"
            # 50 + min(40, 32) = 82 of 95 reservable tokens: a second such request does not fit.
            async with http.stream("POST", endpoint, json=chat_body(words=50, max_tokens=40)) as holder:
                assert holder.status_code == 200
                rejections[style] = await http.post(endpoint, json=chat_body(words=50, max_tokens=40))
        stats = [(await http.get(url + "/sim/stats")).json() for url in cluster.urls]
    for name, response in rejections.items():
        assert response.status_code == 429, name
        assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert all(s["rejected"] == 1 and s["admitted"] == 1 for s in stats)
    seconds = rejections["seconds"].headers
    assert int(seconds["retry-after"]) >= 1
    ms = int(seconds["retry-after-ms"])
    assert 0 < ms <= int(seconds["retry-after"]) * 1000
    with pytest.raises(ValueError):
        float(rejections["garbage"].headers["retry-after"])
    with pytest.raises(ValueError):
        float(rejections["garbage"].headers["retry-after-ms"])
    assert int(rejections["negative"].headers["retry-after"]) < 0
    assert int(rejections["negative"].headers["retry-after-ms"]) < 0
    assert int(rejections["huge"].headers["retry-after"]) > 10**8
    when = email.utils.parsedate_to_datetime(rejections["http-date"].headers["retry-after"])
    assert when.timestamp() >= time.time() - 1 and "retry-after-ms" not in rejections["http-date"].headers
    assert "retry-after" not in rejections["ms-only"].headers
    assert int(rejections["ms-only"].headers["retry-after-ms"]) > 0


async def test_openai_sees_a_rate_limit_error_with_retry_after() -> None:
    async with SimCluster(one_off(TIGHT)) as cluster, plain_httpx() as http:
        url = cluster.urls[0]
        async with (
            http.stream("POST", url + "/v1/chat/completions", json=chat_body(words=50, max_tokens=40)),
            plain_sdk(url, max_retries=0) as client,
        ):
            with pytest.raises(openai.RateLimitError) as info:
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "w " * 50}], max_tokens=40
                )
    assert float(info.value.response.headers["retry-after-ms"]) > 0


async def test_fault_draws_are_reproducible() -> None:
    faults = (FaultConfig(html_500_p=0.5),)
    codes: list[list[int]] = []
    for _ in range(2):
        async with SimCluster(one_off(faults=faults), seed=7) as cluster, plain_httpx() as http:
            url = cluster.urls[0] + "/v1/chat/completions"
            codes.append([(await http.post(url, json=chat_body(max_tokens=1))).status_code for _ in range(8)])
    assert codes[0] == codes[1] and {200, 500} == set(codes[0])


def test_fault_config_validation() -> None:
    with pytest.raises(ValueError):
        FaultConfig(reset_p=1.5)
    with pytest.raises(ValueError):
        FaultConfig(slow_factor=0)
    assert ENGINE.policy == "token"


async def test_a_rate_limited_window_answers_429_with_a_long_retry_after() -> None:
    faults = (FaultConfig(rate_limited_between=(0.0, 2.0), rate_limited_retry_after_s=30.0),)
    async with SimCluster(one_off(faults=faults)) as cluster, plain_httpx() as http:
        url = cluster.urls[0] + "/v1/chat/completions"
        refused = await http.post(url, json=chat_body(max_tokens=2))
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "30" and refused.headers["retry-after-ms"] == "30000"
        await asyncio.sleep(2.1)  # the window is over: served again
        served = await http.post(url, json=chat_body(max_tokens=2))
        assert served.status_code == 200
        assert cluster.replicas[0].counters.rate_limited == 1


def test_a_rate_limited_window_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="rate_limited_between"):
        FaultConfig(rate_limited_between=(5.0, 1.0))
