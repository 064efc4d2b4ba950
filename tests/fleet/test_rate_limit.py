"""The fleet-wide rate limit against a real redis-server: one bucket for every process, one script call per
attempt, corrections riding on the next admission, and the local bucket deciding when Redis is down."""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
import redis.asyncio as redis

from llmguard_client import PhaseRecord, RateLimit, Replica, RetryPolicy, Tier
from llmguard_client._fleet import FleetStore, parse_fleet_url
from llmguard_client._ratelimit.buckets import RateLimiter, build_rate_limiter
from tests.fleet.fleet_ops import RedisFleetOps
from tests.redis_server import RedisServer
from tests.virtual import FakeReplica, Plan, virtual_guard

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 20}).encode()
CHARGE = math.ceil(len(BODY) / 4) + 20
USED = 4  # FakeReplica's usage: 3 prompt + 1 completion tokens


@pytest.fixture
async def fleet(redis_server: RedisServer) -> AsyncIterator[RedisFleetOps]:
    ops = RedisFleetOps(redis_server.url, timeout=2.0)  # generous: a busy machine must not fail the store
    yield ops
    await ops.aclose()


async def level_of(fleet: RedisFleetOps, key: str, field: str) -> float:
    raw = await fleet.client.hget(key, field)
    assert raw is not None, f"no {field!r} in {key!r}"
    return float(raw)


def bucket(limiter: RateLimiter, replica: str = "r") -> str:
    """The fleet's bucket that ``limiter`` charges ``replica``'s attempts to."""
    key = limiter.fleet_key(replica)
    assert key is not None
    return key


def frozen() -> float:
    """A local clock that never moves: a process's own bucket does not refill while a test runs, however long a
    loaded machine takes between two admissions (the fleet's bucket refills on Redis's clock, which the tests
    bound by the time that really passed)."""
    return 0.0


async def post(client: httpx.AsyncClient) -> httpx.Response:
    return await client.post("http://a/v1/chat/completions", content=BODY, headers={"content-type": "application/json"})


async def test_two_processes_share_one_bucket_and_a_refusal_says_when_to_come_back(fleet: RedisFleetOps) -> None:
    limit = RateLimit(requests_per_minute=6, burst=30.0)  # 3 requests, one more every 10 s
    first = RateLimiter(limit, {}, frozen, fleet)
    second = RateLimiter(limit, {}, frozen, fleet)
    started = time.monotonic()  # the bucket refills from its first admission, when it fell below full
    assert (await first.admit("r", 10, 0.0)).admitted
    assert (await second.admit("r", 10, 0.0)).admitted
    assert (await first.admit("r", 10, 0.0)).admitted
    refused = await second.admit("r", 10, 0.0)
    # A whole request missing / 0.1 per second, less what the bucket refilled since its first admission.
    assert refused.retry_after is not None
    assert 10.0 - (time.monotonic() - started) - 0.01 <= refused.retry_after <= 10.0 + 0.01
    # Each process's local bucket was charged only its own admissions: alone it would have let this one in.
    assert second.bucket("r").levels()[0] == pytest.approx(2.0, abs=0.01)
    assert fleet.failures == 0


async def test_a_guard_of_the_same_name_with_another_limit_does_not_refill_this_ones_bucket(
    fleet: RedisFleetOps,
) -> None:
    """One service, two providers, one ``name``: the slow provider's bucket (2 requests, one more every 100 s)
    is not the fast one's (a million requests a second), whose admissions would refill it at their rate."""
    slow = build_rate_limiter(
        RateLimit(requests_per_minute=0.6, burst=200.0), [Replica("http://a:1/v1")], frozen, fleet
    )
    fast = build_rate_limiter(RateLimit(requests_per_minute=6e7), [Replica("http://b:1/v1")], frozen, fleet)
    assert slow is not None and fast is not None
    assert (await slow.admit("http://a:1/v1", 10, 0.0)).admitted
    assert (await slow.admit("http://a:1/v1", 10, 0.0)).admitted
    for _ in range(5):
        assert (await fast.admit("http://b:1/v1", 10, 0.0)).admitted
    refused = await slow.admit("http://a:1/v1", 10, 0.0)
    assert refused.retry_after is not None and refused.retry_after > 90.0  # a whole request at 0.01 per second
    assert fleet.failures == 0


async def test_the_fleets_bucket_is_named_by_the_limit_and_the_replicas_in_any_order(fleet: RedisFleetOps) -> None:
    """Processes with the same limit and replicas share one bucket; another limit or other replicas under the
    same ``name`` (another provider) get one of their own, and so does a replica's own limit with other numbers."""
    limit = RateLimit(requests_per_minute=60, tokens_per_minute=1000)
    replicas = [Replica("http://a:1/v1"), Replica("http://b:1/v1", rate_limit=RateLimit(requests_per_minute=5))]

    def key(limit: RateLimit, replicas: list[Replica], replica: str = "http://a:1/v1") -> str | None:
        limiter = build_rate_limiter(limit, replicas, frozen, fleet)
        assert limiter is not None
        return limiter.fleet_key(replica)

    mine = key(limit, replicas)
    assert mine is not None and mine.startswith("llmguard:test:ratelimit:guard:")
    assert key(RateLimit(requests_per_minute=60.0, tokens_per_minute=1000.0), replicas[::-1]) == mine
    assert key(RateLimit(requests_per_minute=60, tokens_per_minute=1000, burst=2.0), replicas) != mine
    assert key(RateLimit(requests_per_minute=6000, tokens_per_minute=1000), replicas) != mine
    assert key(limit, [Replica("http://c:1/v1"), replicas[1]]) != mine
    own = key(limit, replicas, "http://b:1/v1")
    assert own is not None and own.startswith("llmguard:test:ratelimit:replica:http://b:1/v1:")
    other = [replicas[0], Replica("http://b:1/v1", rate_limit=RateLimit(requests_per_minute=50))]
    assert key(limit, other, "http://b:1/v1") not in (own, None)
    assert key(limit, [Replica("http://u:p@a:1/v1"), replicas[1]]) == mine  # credentials name no other provider


@pytest.mark.parametrize("max_wait", [30.0, math.inf])
async def test_a_call_without_a_deadline_waits_for_room_in_the_fleets_bucket(
    fleet: RedisFleetOps, max_wait: float
) -> None:
    """A call of a tier without a ttft deadline (the default tier: ``max_wait`` infinite) is admitted by the
    script after the wait the bucket needs, as one with room to wait is; never refused (and no ``"inf"`` reaches
    Lua, which reads it only where the server's C library does)."""
    limit = RateLimit(requests_per_minute=6, burst=10.0)  # 1 request, one more every 10 s
    limiter = RateLimiter(limit, {}, frozen, fleet)
    assert (await limiter.admit("r", 10, 0.0)).admitted
    waited = await limiter.admit("r", 10, max_wait)
    assert waited.admitted and waited.wait == pytest.approx(10.0, abs=0.5)
    assert fleet.failures == 0


async def test_one_script_call_per_attempt_and_nothing_else(fleet: RedisFleetOps, redis_server: RedisServer) -> None:
    fakes = {"http://a": FakeReplica("a", [Plan(), Plan(status=500), Plan()] * 4)}
    records: list[PhaseRecord] = []
    limit = RateLimit(requests_per_minute=6000, tokens_per_minute=600_000)
    guard = virtual_guard(
        fakes,
        records,
        rate_limit=limit,
        fleet=fleet,
        tiers={"t": Tier(ttft=5.0, total=10.0)},
        retry=RetryPolicy(backoff_initial=0.001, backoff_max=0.001),
        budget=None,
    )
    admin = redis.Redis.from_url(redis_server.url)
    try:
        async with guard, guard.http_client() as client:
            (await post(client)).raise_for_status()  # loads the script (EVALSHA -> NOSCRIPT -> EVAL) once
            await admin.config_resetstat()
            for _ in range(8):
                response = await post(client)
                assert response.status_code == 200, (records[-1].attempts, records[-1].cause)
        stats = await admin.info("commandstats")
    finally:
        await admin.aclose()
    attempts = sum(len(r.attempts) for r in records[1:])
    assert attempts > 8  # some calls were retried: their retries were charged too
    calls = {name.removeprefix("cmdstat_"): value["calls"] for name, value in stats.items()}
    calls = {name: n for name, n in calls.items() if not name.startswith(("config", "info"))}
    # The client sent one EVALSHA per attempt; the rest are the script's own commands inside it, on the server.
    inside = dict.fromkeys(("time", "hmget", "hset", "pexpire"), attempts)
    assert calls == {"evalsha": attempts, **inside}
    assert fleet.failures == 0


async def test_a_correction_rides_on_the_next_admission(fleet: RedisFleetOps, redis_server: RedisServer) -> None:
    fakes = {"http://a": FakeReplica("a")}
    records: list[PhaseRecord] = []
    limit = RateLimit(tokens_per_minute=6, burst=10000.0)  # 1,000 tokens, one more per 10 s
    guard = virtual_guard(fakes, records, rate_limit=limit, fleet=fleet, tiers={"t": Tier(ttft=5.0, total=10.0)})
    assert guard.rate_limiter is not None
    key = guard.rate_limiter.fleet_key("http://a")
    assert key is not None
    async with guard, guard.http_client() as client:
        (await post(client)).raise_for_status()
        level = await level_of(fleet, key, "t")
        assert level == pytest.approx(1000 - CHARGE, abs=1.0)  # charged; its correction is still local
        (await post(client)).raise_for_status()
        level = await level_of(fleet, key, "t")
        # The first corrected; the second charged at the ratio the first's usage reported (3 prompt tokens).
        assert level == pytest.approx(1000 - USED - (3 + 20), abs=1.0)


async def test_when_redis_is_down_the_local_bucket_decides(redis_factory: type[RedisServer]) -> None:
    server = redis_factory()
    server.start()
    ops = RedisFleetOps(server.url, timeout=0.5)
    limiter = RateLimiter(RateLimit(requests_per_minute=0.6, burst=200.0), {}, frozen, ops)  # 2 requests
    try:
        assert (await limiter.admit("r", 1, 0.0)).admitted  # through the fleet
        assert ops.failures == 0
        server.stop()
        assert (await limiter.admit("r", 1, 0.0)).admitted  # the store fails: the local bucket decides
        refused = await limiter.admit("r", 1, 0.0)  # locally: both requests spent (one through the fleet)
        assert refused.retry_after == pytest.approx(100.0)  # a whole request / 0.01 per second
        assert ops.failures == 2
        server.start()  # empty: a full bucket, and no script cached (NOSCRIPT -> EVAL)
        assert (await limiter.admit("r", 1, 0.0)).admitted
        assert ops.failures == 2
        level = await level_of(ops, bucket(limiter), "r")
        assert level == pytest.approx(0.0, abs=0.05)  # 2 - this one - the one admitted locally meanwhile
    finally:
        await ops.aclose()


async def test_a_paused_redis_fails_open_after_the_stores_timeout(redis_factory: type[RedisServer]) -> None:
    server = redis_factory()
    server.start()
    ops = RedisFleetOps(server.url, timeout=0.2)
    limiter = RateLimiter(RateLimit(requests_per_minute=60), {}, time.monotonic, ops)
    try:
        server.pause()
        assert (await limiter.admit("r", 1, 0.0)).admitted
        assert ops.failures == 1
    finally:
        server.resume()
        await ops.aclose()


async def test_the_local_bucket_holds_this_processs_share_when_redis_goes(redis_factory: type[RedisServer]) -> None:
    server = redis_factory()
    server.start()
    first, second = RedisFleetOps(server.url, timeout=2.0), RedisFleetOps(server.url, timeout=2.0)
    limit = RateLimit(requests_per_minute=60, burst=20.0)  # 20 requests, one more per second
    mine = RateLimiter(limit, {}, frozen, first)
    other = RateLimiter(limit, {}, frozen, second)
    try:
        for _ in range(8):  # two processes taking turns: each has half of the fleet's admissions
            assert (await mine.admit("r", 1, 0.0)).admitted
            assert (await other.admit("r", 1, 0.0)).admitted
        assert first.failures == 0
        # Half the limit locally (10 requests, 0.5 per second) once the share was known (at its 8th
        # admission), its own admissions spent on it: 9 left.
        assert mine.bucket("r").levels()[0] == pytest.approx(9.0)
        server.stop()
        admitted = [(await mine.admit("r", 1, 0.0)).admitted for _ in range(10)]
        assert admitted == [True] * 9 + [False]
        refused = await mine.admit("r", 1, 0.0)
        assert refused.retry_after == pytest.approx(2.0)  # a request at half the rate: 2 s
    finally:
        await first.aclose()
        await second.aclose()


async def test_the_first_admission_awaits_the_stores_first_connection_which_loads_the_script(
    redis_server: RedisServer,
) -> None:
    store = FleetStore(parse_fleet_url(redis_server.url), "first", op_timeout=10.0)  # never reached here
    limiter = RateLimiter(RateLimit(requests_per_minute=600), {}, time.monotonic, store)
    admin = redis.Redis.from_url(redis_server.url)
    try:
        await admin.script_flush()
        await admin.config_resetstat()
        assert store.snapshot().state == "idle"
        assert (await limiter.admit("r", 1, 0.0)).admitted  # connects, then admits through the fleet
        assert store.available
        assert await admin.hget(bucket(limiter), "n") == b"1"
        stats = await admin.info("commandstats")
        assert "cmdstat_eval" not in stats  # the script was loaded on connecting: EVALSHA found it
        assert stats["cmdstat_evalsha"]["calls"] == 2  # the admission's, and connecting's check that it is allowed
    finally:
        await store.aclose()
        await admin.aclose()


async def test_a_store_that_failed_to_connect_is_not_awaited(redis_factory: type[RedisServer]) -> None:
    down = redis_factory()  # never started: its port refuses connections
    store = FleetStore(parse_fleet_url(down.url), "down", op_timeout=30.0, connect_timeout=0.2, backoff_initial=5.0)
    limiter = RateLimiter(RateLimit(requests_per_minute=600), {}, time.monotonic, store)
    try:
        with anyio.fail_after(10.0):  # a third of the op timeout: a refused connection ends the wait at once
            assert await store.first_connection() is False
            assert store.snapshot().state == "degraded"
            assert (await limiter.admit("r", 1, 0.0)).admitted  # and a degraded store is not waited for
    finally:
        await store.aclose()


async def test_what_a_disconnected_process_admits_is_charged_to_the_fleet_when_it_is_back(
    redis_factory: type[RedisServer],
) -> None:
    server = redis_factory()
    server.start()
    store = FleetStore(parse_fleet_url(server.url), "back", op_timeout=2.0, backoff_initial=0.01, backoff_max=0.05)
    limiter = RateLimiter(RateLimit(requests_per_minute=0.6, burst=1000.0), {}, frozen, store)  # 10 requests
    try:
        assert (await limiter.admit("r", 1, 0.0)).admitted  # through the fleet
        server.stop()
        assert (await limiter.admit("r", 1, 0.0)).admitted  # the script fails: the local bucket, owed to the fleet
        assert store.snapshot().state == "degraded"
        for _ in range(2):  # the store is down: the local bucket, and owed to the fleet's
            assert (await limiter.admit("r", 1, 0.0)).admitted
        server.start()  # empty: a full bucket
        with anyio.fail_after(10.0):
            while not store.available:  # noqa: ASYNC110 (polled state has no event)
                await anyio.sleep(0.01)
        assert (await limiter.admit("r", 1, 0.0)).admitted
        admin = redis.Redis.from_url(server.url)
        try:
            raw = await admin.hget(bucket(limiter), "r")
        finally:
            await admin.aclose()
        assert raw is not None
        assert float(raw) == pytest.approx(10 - 3 - 1, abs=0.05)  # the 3 owed, then this one
    finally:
        await store.aclose()
