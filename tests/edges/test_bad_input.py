"""Bad input is refused before anything is sent, with an error that names what was wrong.

A list of tiers, a relative URL (async and sync), a closed Guard asked for a client. (A second event loop
running beside the Guard's: tests/core/test_loop_owner.py.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from llmguard_client import Guard, GuardClosed, GuardConfigError, GuardRequestError, Tier
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


def test_a_relative_url_on_a_client_with_a_base_url_is_sent(servers: list[LoopbackServer]) -> None:
    with Guard([servers[0].url], instrumentation=None, transport_factory=pools) as guard:
        with guard.sync_http_client(base_url=servers[0].url) as client:
            assert client.post(CHAT, json=BODY).status_code == 200
    assert len(servers[0].received) == 1
