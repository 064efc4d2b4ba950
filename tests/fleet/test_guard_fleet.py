"""A Guard with ``fleet=``: no Redis round trip per call, and Redis killed, paused and restarted during a run
fails no call; the snapshot shows the transitions and the resync. Against a real redis-server and real
loopback replicas."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import anyio
import httpx
import redis.asyncio as redis

from llmguard_client import Guard, RateLimit
from tests.loopback import LoopbackServer
from tests.redis_server import RedisServer

BODY = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def until(condition: Callable[[], bool], seconds: float = 15.0) -> None:
    with anyio.fail_after(seconds):
        while not condition():  # noqa: ASYNC110 (polled state has no event)
            await anyio.sleep(0.01)


OWN = {"cmdstat_info", "cmdstat_hello", "cmdstat_client|setinfo"}


async def commands(url: str) -> Counter[str]:
    """Commands the server has run so far, by name (INFO commandstats), less this helper's own: INFO and the
    commands a new connection sends (HELLO, CLIENT SETINFO)."""
    client = redis.Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if k not in OWN})


async def call(client: httpx.AsyncClient, url: str) -> int:
    async with client.stream("POST", url + "/v1/chat/completions", json=BODY) as response:
        await response.aread()
        return response.status_code


async def test_calls_make_no_redis_round_trip(redis_server: RedisServer, servers: list[LoopbackServer]) -> None:
    guard = Guard([s.url for s in servers[:2]], fleet=redis_server.url, name="checkout")
    async with guard, guard.http_client() as client:
        await until(lambda: bool(guard.snapshot().fleet and guard.snapshot().fleet.connected))
        before = await commands(redis_server.url)
        for _ in range(200):
            assert await call(client, servers[0].url) == 200
        after = await commands(redis_server.url)
    ran = after - before
    # Only the background's commands ran meanwhile, however long 200 calls took on a loaded machine: a PING per
    # 0.5 s and the rollout flag's read (MGET) per 5 s; no call touched Redis.
    assert set(ran) <= {"ping", "mget"}, ran
    assert ran["ping"] + ran["mget"] < 200, ran


async def test_redis_killed_paused_and_restarted_fails_no_call(
    redis_factory: type[RedisServer], servers: list[LoopbackServer]
) -> None:
    store = redis_factory()
    store.start()
    guard = Guard([s.url for s in servers[:2]], fleet=store.url, name="checkout")
    states: list[str] = []
    statuses: list[int] = []

    def fleet_state() -> str:
        fleet = guard.snapshot().fleet
        assert fleet is not None
        if not states or states[-1] != fleet.state:
            states.append(fleet.state)
        return fleet.state

    async with guard, guard.http_client() as client:
        running = True

        async def traffic() -> None:
            while running:
                statuses.append(await call(client, servers[0].url))
                fleet_state()
                await anyio.sleep(0.005)

        async with anyio.create_task_group() as tg:
            tg.start_soon(traffic)
            await until(lambda: fleet_state() == "connected")
            for fault, repair in ((store.stop, store.start), (store.pause, store.resume)):
                fault()
                await until(lambda: fleet_state() == "degraded")
                repair()
                await until(lambda: fleet_state() == "connected")
            running = False
        snap = guard.snapshot().fleet
    assert statuses and set(statuses) == {200}, statuses
    assert states[-4:] == ["degraded", "connected", "degraded", "connected"], states
    assert snap is not None and snap.transitions == 4 and snap.resyncs == 3 and snap.last_error


async def test_a_fleet_url_also_makes_the_rate_limit_fleet_wide(
    redis_server: RedisServer, servers: list[LoopbackServer]
) -> None:
    limit = RateLimit(requests_per_minute=6000)
    guard = Guard([s.url for s in servers[:2]], fleet=redis_server.url, name="checkout", rate_limit=limit)
    assert guard._fleet is not None
    guard._fleet.store.op_timeout = 10.0  # the default 50 ms fails open on a loaded machine: not what this tests
    async with guard, guard.http_client() as client:
        await until(lambda: bool(guard.snapshot().fleet and guard.snapshot().fleet.connected))
        assert await call(client, servers[0].url) == 200
    admin = redis.Redis.from_url(redis_server.url)
    try:
        keys = [k.decode() async for k in admin.scan_iter("llmguard:checkout:ratelimit:*")]
    finally:
        await admin.aclose()
    assert keys, "the rate limit's bucket is not in the fleet store"


async def test_room_given_back_reaches_the_fleet_bucket_before_the_next_admission(
    redis_server: RedisServer, servers: list[LoopbackServer]
) -> None:
    # 1,000 tokens, one more per 10 s: what the bucket holds after the call is what it was charged and given back.
    limit = RateLimit(tokens_per_minute=6, burst=10_000.0)
    guard = Guard([s.url for s in servers[:2]], fleet=redis_server.url, name="checkout", rate_limit=limit)
    assert guard._fleet is not None and guard.rate_limiter is not None
    guard._fleet.store.op_timeout = 10.0
    body = {**BODY, "max_tokens": 500, "stream_options": {"include_usage": True}}
    admin = redis.Redis.from_url(redis_server.url)
    key = guard.rate_limiter.fleet_key(servers[0].url)
    assert key is not None
    try:
        async with guard, guard.http_client() as client:
            await until(lambda: bool(guard.snapshot().fleet and guard.snapshot().fleet.connected))
            async with client.stream("POST", servers[0].url + "/v1/chat/completions", json=body) as response:
                await response.aread()
            record = response.extensions["llmguard"]
            assert record.status == "ok" and record.completion_tokens is not None

            # Charged its prompt estimate + 500 (the fleet's bucket fell below 500), it used 12 tokens: the rest
            # goes back in the background, with no other admission to carry it.
            async def level() -> float:
                return float(await admin.hget(key, "t") or 0.0)  # type: ignore[arg-type]

            with anyio.fail_after(15.0):
                while await level() < 900.0:  # noqa: ASYNC110 (polled state has no event)
                    await anyio.sleep(0.01)
            assert await admin.hget(key, "n") == b"1"  # one admission: the give-back was not one
    finally:
        await admin.aclose()
