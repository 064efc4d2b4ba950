"""Failures keep their type: what an openai caller catches is what the guard's attempts met.

Real openai SDK (async and sync) through the guard to a real loopback server. Every attempt timed out ->
``openai.APITimeoutError`` in every failure mode (the guard raises an ``httpx.TimeoutException`` subclass,
which the SDK maps); a server's 5xx -> that status; the guard's own reason for stopping stays readable
through `guard_failure`, and a cooling replica never turns a timeout into a 429. A read timeout mid-stream is an
``httpx.ReadTimeout`` through the guard as without it (SDKs before openai 3.57 pass it on as it is).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from llmguard_client import AllAttemptsTimedOut, FailureMode, Guard, RetryPolicy, Tier, guard_failure
from tests.edges.conftest import pools
from tests.loopback import LoopbackServer, Script

openai = pytest.importorskip("openai")
pytest.importorskip("httpx2")
MESSAGES: Any = [{"role": "user", "content": "hi"}]
SLOW = Script(hang_before_headers=2.5)
"""Answers after 2.5 s: longer than the SDK's ``timeout=1.0``."""
RETRY = RetryPolicy(backoff_initial=0.01, backoff_max=0.02)


def one_replica(server: LoopbackServer, mode: FailureMode = "auto") -> Guard:
    """One hosted endpoint, a tier far longer than the SDK's timeout: the SDK's timeout is what fires."""
    return Guard(
        [server.url],
        tiers={"t": Tier(ttft=30, total=60)},
        failure_mode=mode,
        retry=RETRY,
        instrumentation=None,
        transport_factory=pools,
    )


@pytest.mark.parametrize("mode", ["auto", "response", "raise"])
async def test_every_attempt_timed_out_is_an_api_timeout_error(
    servers: list[LoopbackServer], mode: FailureMode
) -> None:
    server = servers[0]
    server.script = SLOW
    async with one_replica(server, mode) as guard:
        client = openai.AsyncOpenAI(
            base_url=server.url + "/v1",
            api_key="k",
            timeout=1.0,
            max_retries=0,
            http_client=guard.http_client_for(openai.AsyncOpenAI),
        )
        with pytest.raises(openai.APITimeoutError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES)
    # The SDK's read timeout ends the request (docs/usage.md): one attempt, given up at the SDK's 1 s, its to retry.
    assert guard_failure(caught.value) == "all_attempts_timed_out"
    cause = caught.value.__cause__
    assert isinstance(cause, AllAttemptsTimedOut) and cause.record is not None
    assert len(cause.record.attempts) == 1


@pytest.mark.parametrize("edge", ["httpx2", "httpx"])
def test_every_attempt_timed_out_is_an_api_timeout_error_sync(servers: list[LoopbackServer], edge: str) -> None:
    server = servers[0]
    server.script = SLOW
    with one_replica(server) as guard:
        http = guard.http_client_for(openai.OpenAI) if edge == "httpx2" else guard.sync_http_client()
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", timeout=1.0, max_retries=0, http_client=http)
        with pytest.raises(openai.APITimeoutError) as caught:
            client.chat.completions.create(model="m", messages=MESSAGES)
    assert guard_failure(caught.value) == "all_attempts_timed_out"


async def test_a_5xx_stays_that_status(servers: list[LoopbackServer]) -> None:
    server = servers[0]
    server.script = Script(status=500, body={"error": {"message": "boom", "type": "server_error"}})
    async with one_replica(server) as guard:
        client = openai.AsyncOpenAI(
            base_url=server.url + "/v1",
            api_key="k",
            max_retries=0,
            http_client=guard.http_client_for(openai.AsyncOpenAI),
        )
        with pytest.raises(openai.InternalServerError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES)
    assert caught.value.status_code == 500 and guard_failure(caught.value) == "upstream_status"


async def test_a_cooling_replica_does_not_turn_a_timeout_into_a_429(servers: list[LoopbackServer]) -> None:
    # Two replicas, both cooling: the next call is still sent (spread by load). With one replica it would wait
    # for the cool-down's probe or be refused before sending (docs/routing.md).
    pair = servers[:2]
    guard = Guard(
        [s.url for s in pair],
        tiers={"t": Tier(ttft=30, total=60)},
        retry=RETRY,
        instrumentation=None,
        transport_factory=pools,
    )
    async with guard:
        client = openai.AsyncOpenAI(
            base_url=pair[0].url + "/v1",
            api_key="k",
            timeout=1.0,
            max_retries=0,
            http_client=guard.http_client_for(openai.AsyncOpenAI),
        )
        for server in pair:
            server.script = Script(status=429, headers={"retry-after": "120"})
        with pytest.raises(openai.RateLimitError):  # that call's own answer; both replicas now cool
            await client.chat.completions.create(model="m", messages=MESSAGES)
        for server in pair:
            server.script = SLOW
        with pytest.raises(openai.APITimeoutError) as caught:  # this call's own failure, not the cooldown's 429
            await client.chat.completions.create(model="m", messages=MESSAGES)
    assert guard_failure(caught.value) == "all_attempts_timed_out"  # the SDK's 1 s read timeout: this call's own


@pytest.mark.parametrize("kind", ["plain", "guarded"])
async def test_a_read_timeout_mid_stream_is_a_read_timeout(servers: list[LoopbackServer], kind: str) -> None:
    """The caller's read timeout (0.3 s) passes after the first token: ``except httpx.ReadTimeout`` around the
    stream's reads catches it through the guard (its `StallTimeout`, the timeout capping the tier's stall) as
    without it."""
    server = servers[0]
    server.script = Script(tokens=5, stall_after_first=3.0)
    timeout = httpx.Timeout(10.0, read=0.3)
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    async with one_replica(server) as guard:
        client = httpx.AsyncClient(timeout=timeout) if kind == "plain" else guard.http_client(timeout=timeout)
        async with client, client.stream("POST", server.url + "/v1/chat/completions", json=body) as response:
            with pytest.raises(httpx.ReadTimeout) as caught:
                async for _ in response.aiter_raw():
                    pass
    assert (guard_failure(caught.value) == "stall_timeout") == (kind == "guarded")
