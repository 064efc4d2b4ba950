"""The sync httpx2 edge (openai.OpenAI >= 3, anthropic.Anthropic >= 1) against real loopback servers."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from llmguard_client import Guard, Tier, TTFTTimeout, guard_failure
from tests.edges.conftest import BODY, client_sockets, eventually, pools, sync_threads
from tests.loopback import LoopbackServer, Script

httpx2 = pytest.importorskip("httpx2")
openai = pytest.importorskip("openai")

MakeGuard = Callable[..., Guard]
MESSAGES = [{"role": "user", "content": "hi"}]


def oai(guard: Guard, server: LoopbackServer, **kwargs: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="k", http_client=guard.sync_httpx2_client(), **kwargs)


def test_openai_streamed_and_not_streamed(servers: list[LoopbackServer], make_guard: MakeGuard) -> None:
    guard = make_guard()
    client = oai(guard, servers[0])
    with guard.capture() as calls:
        done = client.chat.completions.create(model="m", messages=MESSAGES)
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert done.choices[0].message.content == "hello" and text == " t0 t1 t2 t3 t4"
    # openai's sync Stream stops reading at [DONE] and closes the response: a complete answer, so 'ok'.
    assert [(c.stream, c.status) for c in calls] == [(False, "ok"), (True, "ok")]


def test_closing_an_openai_stream_midway_closes_the_upstream(
    servers: list[LoopbackServer], make_guard: MakeGuard
) -> None:
    for server in servers:
        server.script = Script(tokens=300, gap=0.01)
    guard = make_guard(hedge=None)
    stream = oai(guard, servers[0]).chat.completions.create(model="m", messages=MESSAGES, stream=True)
    next(iter(stream))
    stream.close()
    assert eventually(lambda: sum(s.disconnects for s in servers) == 1)


def test_guard_failures_are_httpx2_and_guard_exceptions_at_once(
    servers: list[LoopbackServer], make_guard: MakeGuard
) -> None:
    for server in servers:
        server.script = Script(stall_before_first=5.0)
    guard = make_guard(hedge=None, retry=None, tiers={"fast": Tier(ttft=0.2, total=5.0)}, failure_mode="raise")
    with guard.sync_httpx2_client() as client, pytest.raises(httpx2.TimeoutException) as caught:
        client.post(servers[0].url + "/v1/chat/completions", json={**BODY, "stream": True})
    assert isinstance(caught.value, TTFTTimeout) and guard_failure(caught.value) == "ttft_timeout"


def test_a_stall_mid_stream_reaches_openai_as_api_timeout(servers: list[LoopbackServer], make_guard: MakeGuard) -> None:
    for server in servers:
        server.script = Script(tokens=5, stall_after_first=5.0)
    guard = make_guard(hedge=None, tiers={"t": Tier(ttft=10.0, total=20.0, stall=0.2)})
    stream = oai(guard, servers[0]).chat.completions.create(model="m", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APITimeoutError) as caught:
        for _ in stream:
            pass
    assert guard_failure(caught.value) == "stall_timeout"
    assert isinstance(caught.value.__cause__, httpx2.ReadTimeout)  # as an SDK before 3.57 passes it on


def test_openai_raise_mode_without_sdk_retries_gives_api_timeout_once(
    servers: list[LoopbackServer], make_guard: MakeGuard
) -> None:
    for server in servers:
        server.script = Script(hang_before_headers=5.0)
    guard = make_guard(hedge=None, retry=None, tiers={"fast": Tier(ttft=0.2, total=5.0)}, failure_mode="raise")
    with pytest.raises(openai.APITimeoutError) as caught:
        oai(guard, servers[0], max_retries=0).chat.completions.create(model="m", messages=MESSAGES)
    assert guard_failure(caught.value) == "ttft_timeout"
    # The guard gave up before the server answered; on a busy machine before its handler ran, too.
    assert servers[0].wait_for(lambda: sum(len(s.received) for s in servers) >= 1)
    assert sum(len(s.received) for s in servers) == 1


def test_legacy_httpx_client_works_at_run_time_too(servers: list[LoopbackServer], make_guard: MakeGuard) -> None:
    """openai >= 3 still accepts an httpx.Client at run time (its types do not): the httpx sync edge."""
    guard = make_guard()
    client = openai.OpenAI(base_url=servers[0].url + "/v1", api_key="k", http_client=guard.sync_http_client())
    assert client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content == "hello"


def test_close_leaves_no_thread_and_no_socket(servers: list[LoopbackServer]) -> None:
    guard = Guard([s.url for s in servers], instrumentation=None, transport_factory=pools)
    client = oai(guard, servers[0])
    for _ in range(3):
        client.chat.completions.create(model="m", messages=MESSAGES)
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    next(iter(stream))
    guard.close()
    assert sync_threads() == []
    assert eventually(lambda: client_sockets(servers) == 0)
    with pytest.raises(openai.InternalServerError) as caught:  # response mode for the SDK: a 503, not retried
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert caught.value.status_code == 503 and guard_failure(caught.value) == "guard_closed"
    assert caught.value.response.headers["x-should-retry"] == "false"
