"""What a fault injected by chaos mode teaches a Guard (a cool-down, an open circuit) stays in that Guard: through a
real redis-server, another Guard of the same fleet and name never sees it, nor does a resync write it; the
injecting Guard itself cools and opens as it does for the real fault."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio as redis

from llmguard_client import Chaos, Guard, RetryPolicy
from llmguard_client._chaos import CHAOS_ENV
from tests.fleet.guards import connected, states, until
from tests.loopback import LoopbackServer
from tests.redis_server import RedisServer

BODY: Any = {"model": "m", "messages": [{"role": "user", "content": "x"}]}


@pytest.fixture(autouse=True)
def chaos_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CHAOS_ENV, "1")


def guard(url: str, replicas: list[str], **kwargs: Any) -> Guard:
    retry = RetryPolicy(circuit_failures=2, circuit_cooldown=60.0)
    return Guard(replicas, fleet=url, name="checkout", hedge=None, retry=retry, instrumentation=None, **kwargs)


async def call_until(client: httpx.AsyncClient, url: str, done: Any) -> None:
    """Calls of one attempt each (the router picks the replica) until ``done()``, at most 40."""
    for _ in range(40):
        if done():
            return
        await client.post(url + "/v1/chat/completions", json=BODY, headers={"x-llmguard-max-attempts": "1"})
    assert done()


async def test_an_injected_cool_down_or_circuit_is_not_shared(
    redis_server: RedisServer, servers: list[LoopbackServer]
) -> None:
    limited, failing, other = (s.url for s in servers)
    chaos = Chaos(rate_limited=1.0, retry_after=30.0, replicas=[limited], seed=1)
    injecting = guard(redis_server.url, [limited, failing, other], chaos=chaos)
    plain = guard(redis_server.url, [limited, failing, other])
    client = injecting.http_client()
    try:
        await connected(injecting, plain)
        mine, theirs = states(injecting), states(plain)
        # Injected 429s with a Retry-After: the injecting Guard cools the replica, as for real ones ...
        await call_until(client, limited, lambda: mine[0].cooling(anyio.current_time()))
        assert mine[0].cooling_until - anyio.current_time() > 20.0
        # ... and injected 500s open its circuit (on two replicas: the router takes calls away from the first failure).
        injecting.set_chaos(Chaos(server_error=1.0, replicas=[failing, other], seed=1))
        await call_until(client, failing, lambda: mine[1].open(anyio.current_time()))
        injecting.set_chaos(None)
        # A real cool-down learned after them (of the third replica) reaches the plain Guard: the channel's events
        # come in order, so the injected ones, had they been published, would have come first.
        assert injecting._fleet is not None
        injecting._fleet.mirror.cooled(mine[2], 30.0, None)
        await until(lambda: theirs[2].cooling(anyio.current_time()))
        now = anyio.current_time()
        assert not theirs[0].cooling(now) and not theirs[1].open(now) and not theirs[1].tripped
        assert mine[0].cooling(now) and mine[1].open(now)  # the injecting Guard's own, as documented
        db = redis.Redis.from_url(redis_server.url)
        try:
            await injecting._fleet.mirror.resync(db)  # as after a reconnection: what is in force here is written
            keys = {k.decode() for k in await db.keys("llmguard:checkout:*:http*")}
        finally:
            await db.aclose()
        assert keys == {f"llmguard:checkout:cool:{other}"}
        # The plain Guard's call goes to the healthy replica the injected faults cooled elsewhere.
        for _ in range(3):
            answer = await plain.http_client().post(limited + "/v1/chat/completions", json=BODY)
            assert answer.status_code == 200
    finally:
        await client.aclose()
        for g in (injecting, plain):
            await g.aclose()


async def test_a_real_clear_elsewhere_leaves_an_injected_cool_down(
    redis_server: RedisServer, servers: list[LoopbackServer]
) -> None:
    """Another process's probe that wins ends the cool-downs the fleet shares, not one an injected fault set here."""
    replicas = [servers[0].url, servers[1].url]
    injecting, plain = guard(redis_server.url, replicas), guard(redis_server.url, replicas)
    try:
        await connected(injecting, plain)
        mine, theirs = states(injecting), states(plain)
        now = anyio.current_time()
        injecting._replica_set.cool_down(mine[0], now, 30.0, injected=True)
        assert injecting._replica_set.failed(mine[0], now, threshold=1, cooldown=30.0, injected=True)
        theirs[0].probing = True
        plain._replica_set.succeeded(theirs[0], 0.05, anyio.current_time())  # its probe served: cleared everywhere
        plain._replica_set.cool_down(theirs[1], anyio.current_time(), 30.0)  # an event after it, to wait for
        await until(lambda: mine[1].cooling(anyio.current_time()))
        assert mine[0].cooling(anyio.current_time()) and mine[0].open(anyio.current_time())
    finally:
        for g in (injecting, plain):
            await g.aclose()
