"""Cool-downs and open circuits learned by one Guard reach the others through a real redis-server; a Guard
that connects later finds them; a probe's win clears them everywhere."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import anyio
import pytest
import redis.asyncio as redis

from llmguard_client import Guard
from llmguard_client._routing.caller import calling_as
from tests.fleet.guards import connected, states, until
from tests.redis_server import RedisServer

REPLICAS = ["http://127.0.0.1:9/r0", "http://127.0.0.1:9/r1"]


def guard(url: str, name: str = "checkout") -> Guard:
    return Guard(REPLICAS, fleet=url, name=name, hedge=None)


async def test_a_cool_down_learned_by_one_guard_reaches_the_others(redis_server: RedisServer) -> None:
    a, b, other = guard(redis_server.url), guard(redis_server.url), guard(redis_server.url, name="search")
    try:
        await connected(a, b, other)
        now = anyio.current_time()
        a._replica_set.cool_down(states(a)[0], now, 30.0)
        await until(lambda: states(b)[0].cooling(anyio.current_time()))
        mirrored = states(b)[0]
        assert now + 29.0 <= mirrored.cooling_until <= anyio.current_time() + 30.0  # 30 s from now, less the transit
        # the probes are the learning guard's (1 s in); this one's a step later (2 s), should that one send none
        assert states(a)[0].probe_at == pytest.approx(now + 1.0)
        assert now + 2.0 <= mirrored.probe_at <= anyio.current_time() + 2.0
        assert not states(b)[1].cooling(anyio.current_time())
        fleet = b.snapshot().fleet
        assert fleet is not None and fleet.lag is not None and fleet.lag < 5.0
        await anyio.sleep(0.2)
        assert not states(other)[0].cooling(anyio.current_time())  # another name: another namespace
    finally:
        for g in (a, b, other):
            await g.aclose()


@pytest.mark.parametrize(
    "stamped",
    [-30.0, 0.0, 30.0],
    ids=["held-up", "clocks-agree", "publisher-clock-ahead"],
)
async def test_an_event_gives_the_time_its_key_has_left_whatever_it_is_stamped(
    redis_server: RedisServer, stamped: float
) -> None:
    """An event's own length and time are not taken at their word: its key's time left is read. One read long after it
    was sent (this process frozen between a serverless runtime's invocations, or its loop stopped) applied a 20 s
    cool-down that had ended meanwhile for 20 s from the thaw; and a host whose clock is behind the publisher's by about
    as long as the event was held up read it as fresh (10 s behind, frozen 10 s: its calls refused
    `all_replicas_cooling`)."""
    b = guard(redis_server.url)
    client = redis.Redis.from_url(redis_server.url)
    try:
        await connected(b)
        channel = "llmguard:checkout:events"
        sent = time.time() + stamped  # the event says 20 s; its key is gone for one, has 5 s left for the other
        ended = {"o": "another-process", "r": REPLICAS[0], "k": "cool", "ms": 20_000, "t": sent}
        await client.set("llmguard:checkout:open:" + REPLICAS[1], "another-process", px=5_000)
        opened = {"o": "another-process", "r": REPLICAS[1], "k": "open", "ms": 20_000, "t": sent}
        await client.publish(channel, json.dumps(ended))
        await client.publish(channel, json.dumps(opened))
        await until(lambda: states(b)[1].open(anyio.current_time()))
        assert states(b)[1].open_until <= anyio.current_time() + 5.0
        assert not states(b)[0].cooling(anyio.current_time())
    finally:
        await client.aclose()
        await b.aclose()


async def test_a_burst_of_events_is_mirrored_whole_and_writes_nothing_out(redis_server: RedisServer) -> None:
    """A burst of events (another process cooling many replicas at once) is read back in few round trips: each was a
    read queued behind this process's own writes, and past the writer's queue the oldest were dropped, its own
    cool-downs' keys with them (400 events: 320-348 mirrored)."""
    replicas = [f"http://127.0.0.1:9/r{i}" for i in range(300)]
    b = Guard(replicas, fleet=redis_server.url, name="checkout", hedge=None)
    client = redis.Redis.from_url(redis_server.url)
    try:
        await connected(b)
        pipe = client.pipeline(transaction=False)
        for replica in replicas:
            pipe.set("llmguard:checkout:cool:" + replica, "another-process", px=30_000)
            event = {"o": "another-process", "r": replica, "k": "cool", "ms": 30_000, "t": time.time()}
            pipe.publish("llmguard:checkout:events", json.dumps(event))
        await pipe.execute()
        b._replica_set.cool_down(states(b)[0], anyio.current_time(), 60.0)  # its own, written meanwhile
        await until(lambda: all(s.cooling(anyio.current_time()) for s in states(b)))
        with anyio.fail_after(10):
            while await client.pttl("llmguard:checkout:cool:" + replicas[0]) <= 30_000:  # noqa: ASYNC110
                await anyio.sleep(0.01)
    finally:
        await client.aclose()
        await b.aclose()


@pytest.mark.parametrize(
    ("overload_ms", "key_ms", "held_for_another_key"),
    [(5_000, 2_000, True), (300, 5_000, False)],
    ids=["overload-in-force", "overload-ended"],
)
async def test_an_event_for_every_caller_keeps_the_cool_down_every_callers_while_it_may_be_in_force(
    redis_server: RedisServer, overload_ms: int, key_ms: int, held_for_another_key: bool
) -> None:
    """A replica's own overload (an event with no scope) and a key's 429 written over its key by another process: the
    cool-down mirrored holds for every caller while the overload's may still be in force (the key has no more time
    left than it announced: 4.7 s for every caller had shrunk to 1.7 s for one key); one the key outlasts, read
    late, had ended before the 429 was written (its 5 s held back every key's calls for 1.6 s)."""
    b = guard(redis_server.url)
    client = redis.Redis.from_url(redis_server.url)
    try:
        await connected(b)
        await client.set("llmguard:checkout:cool:" + REPLICAS[0], "process-b k-one", px=key_ms)  # the 429 wrote last
        overload = {"o": "process-a", "r": REPLICAS[0], "k": "cool", "ms": overload_ms, "t": time.time()}
        scoped = {"o": "process-b", "r": REPLICAS[0], "k": "cool", "ms": key_ms, "t": time.time(), "c": "k-one"}
        await client.publish("llmguard:checkout:events", json.dumps(overload))
        await client.publish("llmguard:checkout:events", json.dumps(scoped))
        await until(lambda: states(b)[0].cooling_until > anyio.current_time())
        with calling_as("k-two"):
            assert states(b)[0].cooling(anyio.current_time()) is held_for_another_key
        with calling_as("k-one"):
            assert states(b)[0].cooling(anyio.current_time())
    finally:
        await client.aclose()
        await b.aclose()


async def test_another_keys_cool_down_mirrored_joins_a_keys_own_which_keeps_its_end(redis_server: RedisServer) -> None:
    """A key's 2 s cool-down here, another key's 20 s one from another process: one cool-down holds both keys'
    calls back, each until its own end (the 2 s key waited for the other's 20 s: 9.8 s where it was served at
    once), and no other key's."""
    b = guard(redis_server.url)
    client = redis.Redis.from_url(redis_server.url)
    try:
        await connected(b)
        with calling_as("k-two"):
            b._replica_set.cool_down(states(b)[0], anyio.current_time(), 2.0, holder="k-two")
        await client.set("llmguard:checkout:cool:" + REPLICAS[0], "process-a k-one", px=20_000)
        scoped = {"o": "process-a", "r": REPLICAS[0], "k": "cool", "ms": 20_000, "t": time.time(), "c": "k-one"}
        await client.publish("llmguard:checkout:events", json.dumps(scoped))
        await until(lambda: states(b)[0].cooling_until > anyio.current_time() + 10.0)
        now = anyio.current_time()
        with calling_as("k-two"):
            assert now < states(b)[0].cooling_end() <= now + 2.0
        with calling_as("k-one"):
            assert states(b)[0].cooling_end() > now + 10.0
        with calling_as("k-three"):
            assert not states(b)[0].cooling(now)
    finally:
        await client.aclose()
        await b.aclose()


async def test_a_probe_served_elsewhere_for_one_key_ends_a_cool_down_held_here_for_it_and_another(
    redis_server: RedisServer,
) -> None:
    """A cool-down here held for two keys; another process's probe, of one of them, served: it ends here too, as a
    probe served here would (its clear named the other process's keys, not this one's, and was dropped: the key's
    calls were refused here for 17 s)."""
    b = guard(redis_server.url)
    client = redis.Redis.from_url(redis_server.url)
    try:
        await connected(b)
        now = anyio.current_time()
        for key in ("k-one", "k-two"):
            with calling_as(key):
                b._replica_set.cool_down(states(b)[0], now, 20.0, holder=key)
        assert states(b)[0].holder == "k-one,k-two"
        cleared = {"o": "process-a", "r": REPLICAS[0], "k": "clear", "ms": 0, "t": time.time(), "c": "k-one"}
        await client.publish("llmguard:checkout:events", json.dumps(cleared))
        await until(lambda: not states(b)[0].cooling(anyio.current_time()))
    finally:
        await client.aclose()
        await b.aclose()


async def test_an_opened_circuit_reaches_the_others(redis_server: RedisServer) -> None:
    a, b = guard(redis_server.url), guard(redis_server.url)
    try:
        await connected(a, b)
        now = anyio.current_time()
        assert a._replica_set.failed(states(a)[1], now, threshold=1, cooldown=20.0)
        await until(lambda: states(b)[1].open(anyio.current_time()))
        assert states(b)[1].tripped
    finally:
        for g in (a, b):
            await g.aclose()


async def test_a_probe_that_wins_clears_the_cool_down_everywhere(redis_server: RedisServer) -> None:
    a, b = guard(redis_server.url), guard(redis_server.url)
    try:
        await connected(a, b)
        now = anyio.current_time()
        a._replica_set.cool_down(states(a)[0], now, 30.0)
        await until(lambda: states(b)[0].cooling(anyio.current_time()))
        states(a)[0].probing = True
        a._replica_set.succeeded(states(a)[0], 0.05, anyio.current_time())
        await until(lambda: not states(b)[0].cooling(anyio.current_time()))
        client = redis.Redis.from_url(redis_server.url)
        try:
            assert await client.exists("llmguard:checkout:cool:http://127.0.0.1:9/r0") == 0
        finally:
            await client.aclose()
    finally:
        for g in (a, b):
            await g.aclose()


async def test_a_cool_down_renewed_or_ended_elsewhere_wakes_the_calls_waiting_here(redis_server: RedisServer) -> None:
    """A call waiting in b for a cool-down (b's `Wakeup`, as a single-replica call waits for its probe) is woken
    when another process's probe ends it, and when another process renews it (it decides again then); before,
    it slept on to the end of its own wait (30 s here, past the bound of `until`)."""
    a, b = guard(redis_server.url), guard(redis_server.url)
    woken: list[str] = []

    async def wait_in_b(label: str) -> None:
        await b._replica_set.cooling_changed.wait(30.0)
        woken.append(label)

    try:
        await connected(a, b)
        a._replica_set.cool_down(states(a)[0], anyio.current_time(), 30.0)
        await until(lambda: states(b)[0].cooling(anyio.current_time()))
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_in_b, "renewed")
            await anyio.sleep(0.05)
            a._replica_set.cool_down(states(a)[0], anyio.current_time(), 60.0)  # renewed, longer
            await until(lambda: woken == ["renewed"])
            tg.start_soon(wait_in_b, "ended")
            await anyio.sleep(0.05)
            states(a)[0].probing = True
            a._replica_set.succeeded(states(a)[0], 0.05, anyio.current_time())  # a's probe served
            await until(lambda: woken == ["renewed", "ended"])
        assert not states(b)[0].cooling(anyio.current_time())
    finally:
        for g in (a, b):
            await g.aclose()


async def test_a_circuit_closing_elsewhere_ends_the_circuit_but_not_a_cool_down(redis_server: RedisServer) -> None:
    a, b = guard(redis_server.url), guard(redis_server.url)
    try:
        await connected(a, b)
        now = anyio.current_time()
        assert b._replica_set.failed(states(b)[0], now, threshold=1, cooldown=20.0)  # b's circuit, shared
        await until(lambda: states(a)[0].open(anyio.current_time()))
        a._replica_set.cool_down(states(a)[0], anyio.current_time(), 30.0)  # a's Retry-After, shared
        await until(lambda: states(b)[0].cooling(anyio.current_time()))
        b._replica_set.succeeded(states(b)[0], 0.05, anyio.current_time())  # b's circuit closes: not a probe
        await until(lambda: not states(a)[0].open(anyio.current_time()))
        assert not states(a)[0].tripped
        assert states(a)[0].cooling(anyio.current_time())  # a's cool-down and its probe stay a's
        assert states(a)[0].probe_at < math.inf
        assert states(b)[0].cooling(anyio.current_time())
        client = redis.Redis.from_url(redis_server.url)
        try:
            assert await client.exists("llmguard:checkout:open:http://127.0.0.1:9/r0") == 0
            assert await client.exists("llmguard:checkout:cool:http://127.0.0.1:9/r0") == 1
        finally:
            await client.aclose()
    finally:
        for g in (a, b):
            await g.aclose()


async def test_a_guard_that_connects_later_finds_what_is_in_force(redis_server: RedisServer) -> None:
    a = guard(redis_server.url)
    try:
        await connected(a)
        now = anyio.current_time()
        a._replica_set.cool_down(states(a)[1], now, 30.0)
        client = redis.Redis.from_url(redis_server.url)
        try:
            key = "llmguard:checkout:cool:http://127.0.0.1:9/r1"
            with anyio.fail_after(10):
                while await client.pttl(key) <= 0:  # noqa: ASYNC110 (polled state has no event)
                    await anyio.sleep(0.01)
            assert 25_000 < await client.pttl(key) <= 30_000
            assert (await client.get(key)) not in (None, b"")  # an opaque process id: nothing about a caller
        finally:
            await client.aclose()
        late = guard(redis_server.url)
        try:
            await connected(late)
            assert states(late)[1].cooling(anyio.current_time())
            assert not states(late)[0].cooling(anyio.current_time())
        finally:
            await late.aclose()
    finally:
        await a.aclose()


async def test_after_a_restart_the_store_is_refilled_from_local_state(redis_factory: type[RedisServer]) -> None:
    server = redis_factory()
    server.start()
    a = Guard(REPLICAS, fleet=server.url, name="checkout", hedge=None)
    a._fleet.store.heartbeat = 0.1  # type: ignore[union-attr]
    try:
        await connected(a)
        a._replica_set.cool_down(states(a)[0], anyio.current_time(), 60.0)
        server.stop()
        await until(lambda: bool(a.snapshot().fleet and a.snapshot().fleet.degraded))
        server.start()  # empty: a restart loses every key
        await until(lambda: bool(a.snapshot().fleet and a.snapshot().fleet.connected))
        client = redis.Redis.from_url(server.url)
        try:
            assert await client.pttl("llmguard:checkout:cool:http://127.0.0.1:9/r0") > 50_000
        finally:
            await client.aclose()
    finally:
        await a.aclose()


async def test_what_a_late_resync_writes_reaches_the_guards_that_resynced_before(redis_server: RedisServer) -> None:
    """A Guard cut off from the store learns a cool-down; the others reconnected (and read the store) first. When
    it reconnects, its resync writes the cool-down and publishes it, so the others see it at once, not at their
    own next reconnection."""
    early, late = guard(redis_server.url), guard(redis_server.url)
    try:
        await connected(early)
        late._replica_set.cool_down(states(late)[1], anyio.current_time(), 30.0)  # not connected: nothing sent
        await anyio.sleep(0.2)
        assert not states(early)[1].cooling(anyio.current_time())
        await connected(late)
        await until(lambda: states(early)[1].cooling(anyio.current_time()))
        assert states(early)[1].cooling_until > anyio.current_time() + 25.0
        assert not states(early)[0].cooling(anyio.current_time())
    finally:
        for g in (early, late):
            await g.aclose()


async def test_fleets_of_one_name_on_two_databases_do_not_share(redis_server: RedisServer) -> None:
    """Staging on database 1, production on 0, one Redis, one name: the keys were apart, but pub/sub ignores the
    database, and a 429 seen on /0 cooled the replica on /1 for 4.7 s. The channels now name the database."""
    on0, also0 = guard(redis_server.url), guard(redis_server.url)
    on1, also1 = guard(redis_server.url.replace("/0", "/1")), guard(redis_server.url.replace("/0", "/1"))
    try:
        await connected(on0, also0, on1, also1)
        on0._replica_set.cool_down(states(on0)[0], anyio.current_time(), 30.0)
        await until(lambda: states(also0)[0].cooling(anyio.current_time()))
        on1._replica_set.cool_down(states(on1)[1], anyio.current_time(), 30.0)
        # Published after /0's event reached also0: had also1 heard that one, it would have come first.
        await until(lambda: states(also1)[1].cooling(anyio.current_time()))
        assert not states(also1)[0].cooling(anyio.current_time())
        assert not states(on1)[0].cooling(anyio.current_time())
        assert also0._replica_set.failed(states(also0)[0], anyio.current_time(), threshold=1, cooldown=20.0)
        await until(lambda: states(on0)[0].open(anyio.current_time()))  # on0 has read all published before
        assert not any(states(g)[1].cooling(anyio.current_time()) for g in (on0, also0))
    finally:
        for g in (on0, also0, on1, also1):
            await g.aclose()


async def test_a_unix_socket_address_picks_its_database_with_a_query(
    redis_factory: type[RedisServer], tmp_path: Path
) -> None:
    """``unix:///path.sock?db=2`` is database 2, as ``redis://host:port/2`` is: the two share a cool-down."""
    server = redis_factory(unixsocket=str(tmp_path / "redis.sock"))
    server.start()
    by_socket = guard(f"unix://{tmp_path}/redis.sock?db=2")
    by_port = guard(server.url.replace("/0", "/2"))
    try:
        await connected(by_socket, by_port)
        by_socket._replica_set.cool_down(states(by_socket)[0], anyio.current_time(), 30.0)
        await until(lambda: states(by_port)[0].cooling(anyio.current_time()))
        client = redis.Redis(port=server.port, db=2)
        try:
            assert await client.exists("llmguard:checkout:cool:http://127.0.0.1:9/r0") == 1
        finally:
            await client.aclose()
    finally:
        for g in (by_socket, by_port):
            await g.aclose()


async def test_a_429s_cool_down_reaches_the_others_and_late_joiners_for_its_credential_alone(
    redis_server: RedisServer,
) -> None:
    """A cool-down a key's 429 set holds, in every process, for that key's calls alone: the event carries its
    credential's hash, and so does the key a process that connects later reads, and the key a held-up event is read
    again from; another key's calls are not held back anywhere."""
    a, b = guard(redis_server.url), guard(redis_server.url)
    client = redis.Redis.from_url(redis_server.url)
    late: Guard | None = None

    def held_for(g: Guard, replica: int) -> tuple[bool, bool]:
        now = anyio.current_time()
        with calling_as("k-one"):
            own = states(g)[replica].cooling(now)
        with calling_as("k-two"):
            other = states(g)[replica].cooling(now)
        return own, other

    try:
        await connected(a, b)
        a._replica_set.cool_down(states(a)[0], anyio.current_time(), 30.0, holder="k-one")
        await until(lambda: states(b)[0].cooling_until > anyio.current_time())
        assert held_for(b, 0) == (True, False)
        value = await client.get("llmguard:checkout:cool:" + REPLICAS[0])
        assert value is not None and value.endswith(b" k-one")  # the hash, never the key
        late = guard(redis_server.url)
        await connected(late)
        assert held_for(late, 0) == (True, False)
        # held up (sent 30 s ago): the time left is read from its key, for the credential the event names
        await client.set("llmguard:checkout:cool:" + REPLICAS[1], "another-process k-one", px=5_000)
        held_up = {"o": "another-process", "r": REPLICAS[1], "k": "cool", "ms": 20_000, "t": time.time() - 30.0}
        await client.publish("llmguard:checkout:events", json.dumps({**held_up, "c": "k-one"}))
        await until(lambda: states(b)[1].cooling_until > anyio.current_time())
        assert held_for(b, 1) == (True, False)
        assert states(b)[1].cooling_until <= anyio.current_time() + 5.0
    finally:
        await client.aclose()
        for g in (a, b, late):
            if g is not None:
                await g.aclose()
