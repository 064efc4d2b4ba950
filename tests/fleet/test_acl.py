"""The fleet's Redis user, against a real redis-server with ACL users: a permission the fleet needs and lacks
fails the connection (not each session's first use), is told once naming what to grant, and backs off; the
rules the fleet docs give are all the fleet needs."""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path

import anyio
import pytest
import redis.asyncio as redis

from llmguard_client import BudgetPolicy, Guard, RateLimit
from llmguard_client._fleet import FleetStore, parse_fleet_url
from llmguard_client._fleet.acl import CLUSTER_RULES, RULES
from llmguard_client._ratelimit.buckets import RateLimiter
from llmguard_client.server_hints import poll_vllm_metrics
from tests.fleet.guards import states, until
from tests.fleet.test_store import record_pauses
from tests.loopback import LoopbackServer
from tests.redis_cluster import RedisCluster
from tests.redis_server import RedisServer

DOCS = Path(__file__).resolve().parents[2] / "docs" / "fleet.md"
BODY = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}


async def user(server: RedisServer, *rules: str, db: int = 0) -> str:
    """A user ``app`` with ``rules`` (and password ``pw``) on ``server``: its fleet URL (database ``db``)."""
    admin = redis.Redis(port=server.port)
    try:
        await admin.execute_command("ACL", "SETUSER", "app", "reset", "on", ">pw", *rules)
        await admin.execute_command("ACL", "LOG", "RESET")
    finally:
        await admin.aclose()
    return f"redis://app:pw@127.0.0.1:{server.port}/{db}"


async def connections(server: RedisServer) -> int:
    admin = redis.Redis(port=server.port)
    try:
        return int((await admin.info("stats"))["total_connections_received"])
    finally:
        await admin.aclose()


def told(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_user_without_channels_fails_to_connect_says_so_once_and_backs_off(
    redis_factory: type[RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    """Redis 7 gives a new user no channels (``resetchannels``): SUBSCRIBE is refused. Before, the refusal came
    after the session counted as connected: each reconnected after 0.1 s, saying "degraded" then "connected
    again" (227 warnings and 227 connections in 10 s of an idle Guard)."""
    caplog.set_level(logging.INFO, "llmguard_client")
    server = redis_factory()
    server.start()
    url = await user(server, "~*", "+@all")
    store = FleetStore(parse_fleet_url(url), "checkout")
    store.subscribe(store.key("events"), lambda _: None)
    delays = record_pauses(store)
    try:
        before = await connections(server)
        store.start()
        await until(lambda: len(delays) >= 6 or len(told(caplog)) > 6)  # six rounds (or the flood of before)
        assert len(told(caplog)) == 1 and "&llmguard:*" in told(caplog)[0], told(caplog)
        rounds = len(delays)
        assert delays[:6] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
        snap = store.snapshot()
        assert (snap.state, snap.resyncs, snap.transitions) == ("degraded", 0, 0)
        assert snap.last_error is not None and "grant the channels &llmguard:*" in snap.last_error
        assert await connections(server) - before - 1 <= 2 * (rounds + 1)  # a command and a pub/sub one a round
    finally:
        await store.aclose()


async def test_a_user_refused_evalsha_fails_to_connect_naming_it_and_admits_locally(
    redis_factory: type[RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    """A fleet-wide rate limit runs a script (EVALSHA) per admission. Refused, it failed each session on its
    first admission, which reconnected at once (235 warnings in 10 s); now connecting checks it."""
    caplog.set_level(logging.INFO, "llmguard_client")
    server = redis_factory()
    server.start()
    url = await user(server, "~*", "&*", "+@all", "-evalsha")
    store = FleetStore(parse_fleet_url(url), "checkout")
    limiter = RateLimiter(RateLimit(requests_per_minute=60_000), {}, time.monotonic, store)
    delays = record_pauses(store)
    try:
        with anyio.fail_after(10):  # four rounds (or the flood of before), admitting meanwhile
            while len(delays) < 4 and len(told(caplog)) <= 4:
                assert (await limiter.admit("r", 1, 0.0)).admitted  # the local bucket decides
                await anyio.sleep(0.001)
        assert len(told(caplog)) == 1, told(caplog)
        assert delays[:4] == [0.1, 0.2, 0.4, 0.8]
        snap = store.snapshot()
        assert (snap.state, snap.resyncs, snap.transitions) == ("degraded", 0, 0)
        assert snap.last_error is not None and "grant the command +evalsha" in snap.last_error, snap.last_error
    finally:
        await store.aclose()


@pytest.mark.parametrize("db", [0, 3])
async def test_the_documented_rules_are_all_the_fleet_needs(
    redis_factory: type[RedisServer], servers: list[LoopbackServer], caplog: pytest.LogCaptureFixture, db: int
) -> None:
    """A user with exactly the docs' rules runs everything the fleet does (the rollout flag, the resync, a
    shared cool-down, the fleet-wide rate limit's script, the fleet budget's sync and the hints poller's lease) and
    the server refuses nothing (its ACL LOG stays empty), on database 0 and on another one (the docs' staging and
    production)."""
    assert f"ACL SETUSER llmguard on >CHANGE-ME {RULES}" in DOCS.read_text()
    caplog.set_level(logging.INFO, "llmguard_client")
    server = redis_factory()
    server.start()
    url = await user(server, *RULES.split(), db=db)
    options = {"rate_limit": RateLimit(requests_per_minute=6000), "budget": BudgetPolicy(scope="fleet")}
    a = Guard([s.url for s in servers[:2]], fleet=url, name="checkout", **options)  # type: ignore[arg-type]
    b = Guard([s.url for s in servers[:2]], fleet=url, name="checkout", **options)  # type: ignore[arg-type]
    admin = redis.Redis(port=server.port)
    try:
        async with a, b, a.http_client() as client:
            await until(lambda: all(g.snapshot().fleet.connected for g in (a, b)))  # type: ignore[union-attr]
            for _ in range(3):
                response = await client.post(servers[0].url + "/v1/chat/completions", json=BODY)
                assert response.status_code == 200
            a._replica_set.cool_down(states(a)[1], anyio.current_time(), 30.0)
            await until(lambda: states(b)[1].cooling(anyio.current_time()))
            async with anyio.create_task_group() as tg:  # the hints poller's lease (its script) and report
                for g in (a, b):
                    tg.start_soon(functools.partial(poll_vllm_metrics, g, every=0.1))
                await until(lambda: {g.snapshot().fleet.hints for g in (a, b)} == {"polling", "following"})  # type: ignore[union-attr]
                tg.cancel_scope.cancel()

            async def synced() -> bool:
                return int((await admin.info("commandstats")).get("cmdstat_zadd", {}).get("calls", 0)) >= 2

            with anyio.fail_after(10):
                while not await synced():  # noqa: ASYNC110 (polled state has no event)
                    await anyio.sleep(0.01)
            assert (await admin.info("commandstats"))["cmdstat_evalsha"]["calls"] >= 3
            for g in (a, b):
                assert g.snapshot().fleet.connected  # type: ignore[union-attr]
        assert await admin.execute_command("ACL", "LOG") == []
        assert told(caplog) == [], told(caplog)
    finally:
        await admin.aclose()


async def test_the_documented_rules_serve_a_cluster_with_its_two_more(
    redis_cluster: RedisCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """On a Redis Cluster the client also reads the slots (CLUSTER SLOTS) and the commands' key positions
    (COMMAND): with those two more, two Guards share a cool-down and the fleet-wide rate limit's bucket, and no
    node refuses anything."""
    assert f"add `{CLUSTER_RULES}`" in DOCS.read_text()
    caplog.set_level(logging.INFO, "llmguard_client")
    for port in redis_cluster.ports:
        admin = redis.Redis(port=port)
        try:
            await admin.execute_command("ACL", "SETUSER", "app", "reset", "on", ">pw", *RULES.split())
            await admin.execute_command("ACL", "SETUSER", "app", *CLUSTER_RULES.split())
            await admin.execute_command("ACL", "LOG", "RESET")
        finally:
            await admin.aclose()
    url = f"redis+cluster://app:pw@127.0.0.1:{redis_cluster.ports[0]}"
    replicas = ["http://127.0.0.1:9/r0", "http://127.0.0.1:9/r1"]
    a, b = (Guard(replicas, fleet=url, name="acl", rate_limit=RateLimit(requests_per_minute=6000)) for _ in "ab")
    async with a, b:
        await until(lambda: all(g.snapshot().fleet.connected for g in (a, b)))  # type: ignore[union-attr]
        a._replica_set.cool_down(states(a)[1], anyio.current_time(), 30.0)
        await until(lambda: states(b)[1].cooling(anyio.current_time()))
        assert a._fleet is not None
        limiter = RateLimiter(RateLimit(requests_per_minute=6000), {}, time.monotonic, a._fleet.store)
        assert (await limiter.admit("r", 1, 0.0)).admitted
    for port in redis_cluster.ports:
        admin = redis.Redis(port=port)
        try:
            assert await admin.execute_command("ACL", "LOG") == [], port
        finally:
            await admin.aclose()
    assert told(caplog) == [], told(caplog)
