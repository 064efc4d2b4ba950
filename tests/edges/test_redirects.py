"""A redirect to an origin that is no replica's is followed there, once, as by the SDK's own client; one on the
guard's own origin is a new guarded call, sent to a replica."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from llmguard_client import Guard, PhaseRecord, Tier
from tests.edges.conftest import pools
from tests.loopback import LoopbackServer, Script

openai = pytest.importorskip("openai")
pytest.importorskip("httpx2")

MESSAGES: Any = [{"role": "user", "content": "req1 hi"}]
CLIENTS: list[tuple[str, Callable[[Guard], Any], bool]] = [
    ("http_client", lambda g: g.http_client(), False),
    ("httpx2_client", lambda g: g.httpx2_client(), False),
    ("sync_http_client", lambda g: g.sync_http_client(), True),
    ("sync_httpx2_client", lambda g: g.sync_httpx2_client(), True),
]


def guard_over(replica: LoopbackServer, records: list[PhaseRecord], **kwargs: Any) -> Guard:
    """A Guard with one replica, ``records`` receiving each call's record."""
    return Guard(
        [replica.url],
        tiers={"t": Tier(10, 20)},
        instrumentation=None,
        transport_factory=pools,
        on_record=records.append,
        **kwargs,
    )


def redirect_to(target: str) -> Callable[[int, int], Script]:
    """Every request answered with a 307 to ``target``."""
    return lambda index, attempt: Script(status=307, body={}, headers={"location": target})


async def create(client: Any, sync: bool, stream: bool = False) -> str:
    """One chat completion with the openai SDK on ``client`` (sync or async, streamed or not): its answer's text."""
    if sync:
        done = openai.OpenAI(base_url="http://llm.internal/v1", api_key="k", http_client=client)
        answer = done.chat.completions.create(model="m", messages=MESSAGES, stream=stream)
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
    else:
        sdk = openai.AsyncOpenAI(base_url="http://llm.internal/v1", api_key="k", http_client=client)
        answer = await sdk.chat.completions.create(model="m", messages=MESSAGES, stream=stream)
        if stream:
            return "".join([c.choices[0].delta.content or "" async for c in answer if c.choices])
    text = answer.choices[0].message.content
    assert isinstance(text, str)
    return text


@pytest.mark.parametrize(("name", "client", "sync"), CLIENTS, ids=[c[0] for c in CLIENTS])
async def test_a_redirect_to_another_origin_is_followed_there_once_as_by_the_sdks_own_client(
    servers: list[LoopbackServer],
    caplog: pytest.LogCaptureFixture,
    name: str,
    client: Callable[[Guard], Any],
    sync: bool,
) -> None:
    replica, elsewhere = servers[0], servers[1]
    replica.scripter = redirect_to(elsewhere.url + "/v1/chat/completions")
    records: list[PhaseRecord] = []
    with caplog.at_level(logging.WARNING, logger="llmguard_client"):
        async with guard_over(replica, records) as guard:
            text = await create(client(guard), sync)
            await create(client(guard), sync)
    assert text
    assert [len(replica.received), len(elsewhere.received)] == [2, 2]  # before: 63 to the replica, then an error
    redirected, followed = records[0], records[1]
    assert (redirected.http_status, redirected.replica, redirected.one_attempt) == (307, replica.url, None)
    assert (followed.cohort, followed.status, followed.replica, followed.one_attempt) == (
        "guarded",
        "ok",
        elsewhere.url,
        "other_origin",
    )
    warnings = [r.getMessage() for r in caplog.records if "no replica's origin" in r.getMessage()]
    assert len(warnings) == 1 and elsewhere.url in warnings[0]


async def test_a_redirect_on_the_guards_own_origin_is_a_new_guarded_call_to_a_replica(
    servers: list[LoopbackServer],
) -> None:
    replica = servers[0]
    replica.scripter = lambda index, attempt: (
        Script(status=307, body={}, headers={"location": "/v1/chat/completions?moved=1"}) if attempt == 1 else None
    )
    records: list[PhaseRecord] = []
    async with guard_over(replica, records) as guard:
        assert await create(guard.http_client(), sync=False)
    assert len(replica.received) == 2
    assert [r.one_attempt for r in records] == [None, None]
    assert records[1].replica == replica.url


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize(("name", "client", "sync"), CLIENTS, ids=[c[0] for c in CLIENTS])
async def test_a_redirect_without_a_body_is_followed_once_not_retried_as_a_failed_answer(
    servers: list[LoopbackServer], name: str, client: Callable[[Guard], Any], sync: bool, stream: bool
) -> None:
    """A 307 with an empty body is no answer to judge (a streamed call's is no event stream): the client gets it
    and follows it, as without a guard (before: the guard sent the request three times and failed the call)."""
    replica = servers[0]
    replica.scripter = lambda index, attempt: (
        Script(status=307, body="", headers={"location": "/v1/chat/completions?moved=1"}) if attempt == 1 else None
    )
    records: list[PhaseRecord] = []
    async with guard_over(replica, records) as guard:
        text = await create(client(guard), sync, stream)
    assert text
    assert len(replica.received) == 2  # the call, then the request that followed its redirect
    assert [(r.http_status, len(r.attempts)) for r in records] == [(307, 1), (200, 1)]


async def test_a_relative_redirect_from_the_other_origin_stays_there(servers: list[LoopbackServer]) -> None:
    replica, elsewhere = servers[0], servers[1]
    replica.scripter = redirect_to(elsewhere.url + "/v1/chat/completions?old=1")
    elsewhere.scripter = lambda index, attempt: (
        Script(status=308, body={}, headers={"location": "/v1/chat/completions"}) if attempt == 1 else None
    )
    records: list[PhaseRecord] = []
    async with guard_over(replica, records) as guard:
        assert await create(guard.http_client(), sync=False)
    assert [len(replica.received), len(elsewhere.received)] == [1, 2]
    assert [(r.replica, r.one_attempt) for r in records[1:]] == [(elsewhere.url, "other_origin")] * 2


async def test_a_control_calls_redirect_elsewhere_stays_in_the_control_cohort(servers: list[LoopbackServer]) -> None:
    replica, elsewhere = servers[0], servers[1]
    replica.scripter = redirect_to(elsewhere.url + "/v1/chat/completions")
    records: list[PhaseRecord] = []
    async with guard_over(replica, records, rollout=0.0) as guard:
        sdk = openai.AsyncOpenAI(base_url=replica.url + "/v1", api_key="k", http_client=guard.http_client())
        assert (await sdk.chat.completions.create(model="m", messages=MESSAGES)).choices[0].message.content
    assert [len(replica.received), len(elsewhere.received)] == [1, 1]
    assert [(r.cohort, r.replica) for r in records] == [("control", replica.url), ("control", elsewhere.url)]
