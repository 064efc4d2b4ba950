"""``Guard(fleet="redis+cluster://...")`` against a real 3-master Redis Cluster: the store connects and stays
connected, cool-downs reach the other Guards whichever node an event is published on, the fleet-wide rate-limit
bucket is one bucket (not a silent fail-open), so is a fleet-scoped retry budget, and ``llmguard rollout`` reaches
a running Guard."""

from __future__ import annotations

import json
import time

import anyio
import pytest
import redis.asyncio as redis
from redis.asyncio.cluster import RedisCluster as ClusterClient
from redis.cluster import key_slot

from llmguard_client import BudgetPolicy, Guard, RateLimit
from llmguard_tools.cli import main
from tests.fleet.guards import connected, states, store, until
from tests.redis_cluster import RedisCluster

REPLICAS = ["http://127.0.0.1:9/r0", "http://127.0.0.1:9/r1", "http://127.0.0.1:9/r2"]


def guard(url: str, **kwargs: object) -> Guard:
    g = Guard(REPLICAS, fleet=url, name="checkout", hedge=None, **kwargs)  # type: ignore[arg-type]
    # Generous bounds: on a busy machine, an admission or the first connection to three nodes (TLS handshakes
    # included) must not fail open; failing open is tested elsewhere.
    store(g).op_timeout, store(g).connect_timeout = 2.0, 5.0
    return g


def cluster_client(cluster: RedisCluster) -> ClusterClient:
    return ClusterClient(host="127.0.0.1", port=cluster.ports[0])


async def test_the_store_connects_to_a_cluster_and_stays_connected(redis_cluster: RedisCluster) -> None:
    g = guard(redis_cluster.url)
    store(g).heartbeat = 0.05
    try:
        await connected(g)
        await anyio.sleep(0.3)  # several heartbeats and the rollout flag's first reads, on every node
        fleet = g.snapshot().fleet
        assert fleet is not None
        assert (fleet.state, fleet.connected, fleet.transitions, fleet.last_error) == ("connected", True, 0, None)
        assert fleet.url == redis_cluster.url
    finally:
        await g.aclose()


async def test_a_cool_down_reaches_the_other_guard_and_a_win_clears_it(redis_cluster: RedisCluster) -> None:
    a, b = guard(redis_cluster.url), guard(redis_cluster.url)
    try:
        await connected(a, b)
        now = anyio.current_time()
        a._replica_set.cool_down(states(a)[0], now, 30.0)
        await until(lambda: states(b)[0].cooling(anyio.current_time()))
        assert now + 29.0 <= states(b)[0].cooling_until <= anyio.current_time() + 30.0  # 30 s, less the transit
        assert a._replica_set.failed(states(a)[1], now, threshold=1, cooldown=20.0)
        await until(lambda: states(b)[1].open(anyio.current_time()))
        states(a)[0].probing = True
        a._replica_set.succeeded(states(a)[0], 0.05, anyio.current_time())  # the probe won: clear everywhere
        await until(lambda: not states(b)[0].cooling(anyio.current_time()))
        client = cluster_client(redis_cluster)
        try:
            assert await client.exists(f"llmguard:checkout:cool:{REPLICAS[0]}") == 0
            assert await client.pttl(f"llmguard:checkout:open:{REPLICAS[1]}") > 10_000
        finally:
            await client.aclose()
        late = guard(redis_cluster.url)  # connects later: its resync reads the keys, wherever their slots are
        try:
            await connected(late)
            assert states(late)[1].open(anyio.current_time())
            assert not states(late)[0].cooling(anyio.current_time())
        finally:
            await late.aclose()
        for g in (a, b):
            assert g.snapshot().fleet is not None and g.snapshot().fleet.transitions == 0  # type: ignore[union-attr]
    finally:
        for g in (a, b):
            await g.aclose()


async def test_an_event_published_on_any_node_reaches_the_listener(redis_cluster: RedisCluster) -> None:
    """Cluster pub/sub: the Guard subscribes on one node; PUBLISH on every node must reach it (each event of a
    cool-down is read from its key, wherever its slot is)."""
    g = guard(redis_cluster.url)
    client = cluster_client(redis_cluster)
    try:
        await connected(g)
        for replica in REPLICAS:
            await client.set(f"llmguard:checkout:cool:{replica}", "another-process", px=30_000)
        for port, replica in zip(redis_cluster.ports, REPLICAS, strict=True):
            node = redis.Redis(host="127.0.0.1", port=port)
            try:
                event = {"o": "another-process", "r": replica, "k": "cool", "ms": 30_000, "t": time.time()}
                await node.publish("llmguard:checkout:events", json.dumps(event))
            finally:
                await node.aclose()
        await until(lambda: all(s.cooling(anyio.current_time()) for s in states(g)))
        now = anyio.current_time()  # learned elsewhere: the probes are that process's, ours a step later (2 s)
        assert all(now < s.probe_at <= now + 2.0 for s in states(g))
    finally:
        await client.aclose()
        await g.aclose()


async def test_two_guards_share_one_rate_limit_bucket(redis_cluster: RedisCluster) -> None:
    limit = RateLimit(requests_per_minute=0.6, burst=300.0)  # 3 requests, one more every 100 s
    first, second = guard(redis_cluster.url, rate_limit=limit), guard(redis_cluster.url, rate_limit=limit)
    try:
        await connected(first, second)
        assert first.rate_limiter is not None and second.rate_limiter is not None
        started = time.monotonic()  # the bucket refills from its first admission, when it fell below full
        assert (await first.rate_limiter.admit(REPLICAS[0], 10, 0.0)).admitted
        assert (await second.rate_limiter.admit(REPLICAS[0], 10, 0.0)).admitted
        assert (await first.rate_limiter.admit(REPLICAS[0], 10, 0.0)).admitted
        refused = await second.rate_limiter.admit(REPLICAS[0], 10, 0.0)
        # Refused by the fleet's bucket: alone, this Guard's local bucket (2 requests left) would have admitted it.
        # A whole request / 0.01 per second, less what the bucket refilled since its first admission.
        assert refused.retry_after is not None
        assert 100.0 - (time.monotonic() - started) - 0.01 <= refused.retry_after <= 100.0 + 0.01
        assert second.rate_limiter.bucket(REPLICAS[0]).levels()[0] == pytest.approx(2.0, abs=0.05)
        for g in (first, second):
            fleet = g.snapshot().fleet
            assert fleet is not None and (fleet.connected, fleet.transitions, fleet.last_error) == (True, 0, None)
        key = first.rate_limiter.fleet_key(REPLICAS[0])
        assert key is not None and key == second.rate_limiter.fleet_key(REPLICAS[0])
        client = cluster_client(redis_cluster)
        try:
            assert float(await client.hget(key, "r")) == pytest.approx(0.0, abs=0.05)  # type: ignore[arg-type]
        finally:
            await client.aclose()
        assert key_slot(key.encode()) >= 0  # one key per bucket: one slot, no CROSSSLOT possible
    finally:
        for g in (first, second):
            await g.aclose()


async def test_the_rollout_command_reaches_a_running_guard(
    redis_cluster: RedisCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    g = guard(redis_cluster.url, rollout=0.0, rollout_poll_interval=30.0)  # only the announcement can be in time
    url = redis_cluster.url

    def rollout(*words: str) -> str:
        assert main(["rollout", *words, "--fleet", url, "--name", "checkout"]) == 0
        return capsys.readouterr().out.strip()

    try:
        await connected(g)
        assert await anyio.to_thread.run_sync(rollout, "set", "0.25") == (
            "checkout: 0.25 of calls guarded on every process (fraction 0.25, kill switch off)"
        )
        await until(lambda: g._rollout.override == 0.25)
        assert "kill switch ON" in await anyio.to_thread.run_sync(rollout, "kill")
        await until(lambda: g._rollout.override == 0.0)
        await anyio.to_thread.run_sync(rollout, "clear")
        await until(lambda: g._rollout.override is None)
        assert "no fleet-wide rollout set" in await anyio.to_thread.run_sync(rollout, "get")
    finally:
        await g.aclose()


async def test_a_tls_cluster_shares_a_cool_down_and_a_bucket(redis_cluster: RedisCluster) -> None:
    """``rediss+cluster://`` with the CA in the URL: the client discovers the other nodes' TLS ports."""
    if redis_cluster.tls is None:
        pytest.skip("this redis-server build has no TLS support (or openssl is missing)")
    limit = RateLimit(requests_per_minute=0.6, burst=100.0)  # 1 request, one more every 100 s
    a, b = guard(redis_cluster.tls_url, rate_limit=limit), guard(redis_cluster.tls_url, rate_limit=limit)
    try:
        await connected(a, b)
        a._replica_set.cool_down(states(a)[2], anyio.current_time(), 30.0)
        await until(lambda: states(b)[2].cooling(anyio.current_time()))
        assert a.rate_limiter is not None and b.rate_limiter is not None
        emptied = time.monotonic()
        assert (await a.rate_limiter.admit(REPLICAS[0], 1, 0.0)).admitted
        retry_after = (await b.rate_limiter.admit(REPLICAS[0], 1, 0.0)).retry_after
        assert retry_after is not None
        assert 100.0 - (time.monotonic() - emptied) - 0.01 <= retry_after <= 100.0 + 0.01
        fleet = b.snapshot().fleet
        assert fleet is not None and (fleet.connected, fleet.transitions, fleet.last_error) == (True, 0, None)
        assert fleet.url == redis_cluster.tls_url
        assert {n.port for n in store(b)._client.get_nodes()} == set(redis_cluster.tls_ports)  # type: ignore[union-attr]
    finally:
        for g in (a, b):
            await g.aclose()


async def test_two_guards_share_one_retry_budget(redis_cluster: RedisCluster) -> None:
    policy = BudgetPolicy(ratio=0.1, floor=0, window=60.0, scope="fleet")
    a, b = guard(redis_cluster.url, budget=policy), guard(redis_cluster.url, budget=policy)
    try:
        await connected(a, b)
        assert a.budget is not None and b.budget is not None
        for _ in range(100):
            a.budget.record_request()

        def fleet_calls() -> int:
            shown = b.snapshot().budget
            return shown.fleet.window_requests if shown is not None and shown.fleet is not None else -1

        await until(lambda: fleet_calls() == 100)  # the background syncs, every 0.2 s, through the cluster

        def processes(g: Guard) -> int:
            shown = g.snapshot().budget
            return shown.fleet.processes if shown is not None and shown.fleet is not None else -1

        await until(lambda: processes(a) == processes(b) == 2)  # membership, on the slot's node's clock
        assert b.budget.try_acquire() is not None  # B made no call: only the fleet's allow it
        for g in (a, b):
            fleet = g.snapshot().fleet
            assert fleet is not None and (fleet.connected, fleet.transitions, fleet.last_error) == (True, 0, None)
        client = cluster_client(redis_cluster)
        try:
            keys = [k async for k in client.scan_iter(match="llmguard:checkout:budget:*")]
        finally:
            await client.aclose()
        assert len({key_slot(k) for k in keys}) == 1 and len(keys) >= 2  # the {checkout} hash tag: one slot
    finally:
        for g in (a, b):
            await g.aclose()
