"""Bad input is refused before anything is sent, with an error that names what was wrong.

A list of tiers, a relative URL (async and sync), a closed Guard asked for a client, one Guard used from a
second event loop (two threads each running ``asyncio.run``; then a later ``asyncio.run``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from llmguard_client import Guard, GuardClosed, GuardConfigError, GuardRequestError, Tier, WrongEventLoop
from tests.edges.conftest import pools
from tests.loopback import LoopbackServer

openai = pytest.importorskip("openai")
pytest.importorskip("httpx2")
CHAT = "/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_tiers_given_as_a_list_name_what_is_accepted() -> None:
    with pytest.raises(GuardConfigError, match=r"tiers must map tier names to Tier values, e\.g\. \{'interactive'"):
        Guard(["http://127.0.0.1:9"], tiers=[Tier(1, 10)])  # type: ignore[arg-type]


async def test_a_relative_url_is_refused_before_sending(servers: list[LoopbackServer]) -> None:
    async with Guard([servers[0].url], instrumentation=None, transport_factory=pools) as guard:
        async with guard.http_client() as client:
            with pytest.raises(GuardRequestError, match="not an absolute http:// or https:// URL"):
                await client.post(CHAT, json=BODY)
        async with guard.httpx2_client() as client2:
            with pytest.raises(GuardRequestError, match="base_url"):
                await client2.post(CHAT, json=BODY)
    assert servers[0].received == []


def test_a_relative_url_is_refused_before_sending_sync(servers: list[LoopbackServer]) -> None:
    with Guard([servers[0].url], instrumentation=None, transport_factory=pools) as guard:
        with guard.sync_http_client() as client, pytest.raises(GuardRequestError, match="not an absolute"):
            client.post(CHAT, json=BODY)
        with guard.sync_httpx2_client() as client2, pytest.raises(GuardRequestError, match="not an absolute"):
            client2.post(CHAT, json=BODY)
    assert servers[0].received == []


@pytest.mark.parametrize(
    "hand_out",
    [
        lambda g: g.http_client(),
        lambda g: g.httpx2_client(),
        lambda g: g.sync_http_client(),
        lambda g: g.sync_httpx2_client(),
        lambda g: g.http_client_for(openai.AsyncOpenAI),
        lambda g: g.http_client_for(openai.OpenAI),
    ],
    ids=["http_client", "httpx2_client", "sync_http_client", "sync_httpx2_client", "for async", "for sync"],
)
def test_a_closed_guard_hands_out_no_client(servers: list[LoopbackServer], hand_out: Callable[[Guard], Any]) -> None:
    guard = Guard([servers[0].url], instrumentation=None, transport_factory=pools)
    guard.close()
    with pytest.raises(GuardClosed, match="hands out no new clients"):
        hand_out(guard)


def test_a_second_event_loop_gets_a_clear_error(servers: list[LoopbackServer]) -> None:
    """Thread A's loop makes a call and stays up while thread B's loop calls: B is refused, naming the fix,
    and nothing is sent for it; a later asyncio.run, after A's loop ended, is refused the same way."""
    guard = Guard([servers[0].url], instrumentation=None, transport_factory=pools)
    a_called, b_done = threading.Event(), threading.Event()
    seen: dict[str, BaseException | str] = {}

    async def call(name: str) -> None:
        client = openai.AsyncOpenAI(
            base_url=servers[0].url + "/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI)
        )
        try:
            await client.chat.completions.create(
                model="m",
                messages=BODY["messages"],  # type: ignore[arg-type]
                extra_headers={"connection": "close"},  # nothing kept in the pool for the ended loop to leak
            )
            seen[name] = "ok"
        except openai.APIError as exc:
            seen[name] = exc

    async def a() -> None:
        await call("a")
        a_called.set()
        await asyncio.to_thread(b_done.wait, 10)

    def b() -> None:
        a_called.wait(10)
        asyncio.run(call("b"))
        b_done.set()

    threads = [threading.Thread(target=asyncio.run, args=(a(),)), threading.Thread(target=b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    asyncio.run(call("later"))
    guard_loop_ended = seen["later"]
    try:
        assert seen["a"] == "ok"
        refused = seen["b"]
        assert isinstance(refused, openai.BadRequestError)  # response mode for the SDK: a 400, not retried
        assert "still running" in refused.message and "one Guard per event loop" in refused.message
        assert "sync_http_client" in refused.message
        assert isinstance(guard_loop_ended, openai.BadRequestError) and "which has ended" in guard_loop_ended.message
        assert len(servers[0].received) == 1
    finally:
        guard.close()


async def test_raise_mode_raises_wrong_event_loop(servers: list[LoopbackServer]) -> None:
    guard = Guard([servers[0].url], instrumentation=None, transport_factory=pools)
    try:
        async with guard.http_client() as client:
            assert (await client.post(servers[0].url + CHAT, json=BODY)).status_code == 200

        def elsewhere() -> BaseException | None:
            async def go() -> None:
                async with guard.http_client() as other:
                    await other.post(servers[0].url + CHAT, json=BODY)

            try:
                asyncio.run(go())
            except WrongEventLoop as exc:
                return exc
            return None

        error = await asyncio.to_thread(elsewhere)
        assert isinstance(error, WrongEventLoop) and isinstance(error, GuardRequestError)
        assert error.cause == "wrong_event_loop" and len(servers[0].received) == 1
    finally:
        await guard.aclose()


def test_a_relative_url_on_a_client_with_a_base_url_is_sent(servers: list[LoopbackServer]) -> None:
    with Guard([servers[0].url], instrumentation=None, transport_factory=pools) as guard:
        with guard.sync_http_client(base_url=servers[0].url) as client:
            assert client.post(CHAT, json=BODY).status_code == 200
    assert len(servers[0].received) == 1
