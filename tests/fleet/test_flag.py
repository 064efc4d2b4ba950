"""The fleet-wide rollout flag survives the store losing it (a restart, FLUSHALL, an eviction, a failover to an
empty primary): the processes write back what they last read, so a kill switch is lifted only by ``set`` or
``clear``, never by the keys vanishing."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio
import pytest
import redis.asyncio as redis

from llmguard_client import Guard
from llmguard_client.fleet_cli import main
from tests.fleet.guards import connected, until
from tests.loopback import LoopbackServer
from tests.redis_server import RedisServer

REPLICAS = ["http://127.0.0.1:9/r0"]
BODY = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
KILL = "llmguard:checkout:rollout:kill"


def guard(url: str) -> Guard:
    g = Guard(REPLICAS, fleet=url, name="checkout", rollout=1.0, rollout_poll_interval=0.05)
    g._fleet.store.heartbeat = 0.1  # type: ignore[union-attr]  # notice the restart quickly
    return g


async def rollout(server: RedisServer, *command: str) -> None:
    assert await anyio.to_thread.run_sync(main, [*command, "--fleet", server.url, "--name", "checkout"]) == 0


async def restart(server: RedisServer, *guards: Guard) -> None:
    server.stop()
    await until(lambda: all(g.snapshot().fleet.degraded for g in guards))  # type: ignore[union-attr]
    server.start()  # empty: a restart loses every key
    await until(lambda: all(g.snapshot().fleet.connected for g in guards))  # type: ignore[union-attr]


async def test_a_kill_switch_stays_on_through_a_restart(redis_factory: type[RedisServer]) -> None:
    server = redis_factory()
    server.start()
    a, b = guard(server.url), guard(server.url)
    try:
        await killed(server, a, b)
        await restart(server, a, b)
        await anyio.sleep(0.3)  # several polls of the restarted store
        assert a._rollout.override == b._rollout.override == 0.0
        client = redis.Redis.from_url(server.url)
        try:
            assert await client.get(KILL) is not None
        finally:
            await client.aclose()
        await rollout(server, "clear")  # the command still lifts it
        await until(lambda: a._rollout.override is None and b._rollout.override is None)
    finally:
        for g in (a, b):
            await g.aclose()


async def test_a_cleared_flag_stays_cleared_through_a_restart(redis_factory: type[RedisServer]) -> None:
    server = redis_factory()
    server.start()
    a = guard(server.url)
    try:
        await killed(server, a)
        await rollout(server, "clear")
        await until(lambda: a._rollout.override is None)
        await restart(server, a)
        await anyio.sleep(0.3)
        assert a._rollout.override is None
    finally:
        await a.aclose()


@pytest.mark.parametrize("command", [("clear",), ("set", "1.0")])
async def test_a_command_run_while_a_process_was_cut_off_is_not_undone_when_it_reconnects(
    redis_server: RedisServer, command: tuple[str, ...]
) -> None:
    """A process that read the kill switch, then lost the store while the operator lifted it, must not write
    the kill switch back when it reconnects: the command writes its values, it deletes none."""
    a = guard(redis_server.url)
    store = a._fleet.store  # type: ignore[union-attr]
    try:
        await killed(redis_server, a)
        store.backoff_initial = 4.0  # cut off for 2-4 s
        store.degrade(RuntimeError("cut off by the test"))
        await rollout(redis_server, *command)
        assert a.snapshot().fleet.degraded  # type: ignore[union-attr]  # the command ran while it was cut off
        await until(lambda: a.snapshot().fleet.connected)  # type: ignore[union-attr]
        expected = None if command == ("clear",) else 1.0
        await until(lambda: a._rollout.override == expected)
        client = redis.Redis.from_url(redis_server.url)
        try:
            assert await client.get(KILL) == b"0"
        finally:
            await client.aclose()
    finally:
        await a.aclose()


async def test_a_new_process_follows_the_kill_switch_from_its_first_call(
    redis_server: RedisServer, servers: list[LoopbackServer]
) -> None:
    """A process started while the kill switch is on: its first call waits for the store's first connection
    (at most 50 ms), whose resync reads the flag, so no call of it is guarded."""
    await rollout(redis_server, "kill")
    g = Guard([servers[0].url], fleet=redis_server.url, name="checkout", rollout=1.0)
    g._fleet.store.op_timeout = 10.0  # type: ignore[union-attr]  # a busy machine's connection may take > 50 ms
    try:
        async with g.http_client() as client:
            with g.capture() as calls:
                for _ in range(3):
                    assert (await client.post(servers[0].url + "/v1/chat/completions", json=BODY)).status_code == 200
        assert [c.cohort for c in calls] == ["control"] * 3
    finally:
        await g.aclose()


def test_a_new_sync_process_follows_the_kill_switch_from_its_first_call(
    redis_server: RedisServer, servers: list[LoopbackServer]
) -> None:
    main(["kill", "--fleet", redis_server.url, "--name", "checkout"])
    with Guard([servers[0].url], fleet=redis_server.url, name="checkout", rollout=1.0) as g:
        g._fleet.store.op_timeout = 10.0  # type: ignore[union-attr]
        with g.sync_http_client() as client, g.capture() as calls:
            for _ in range(3):
                assert client.post(servers[0].url + "/v1/chat/completions", json=BODY).status_code == 200
        assert [c.cohort for c in calls] == ["control"] * 3


async def killed(server: RedisServer, *guards: Guard) -> None:
    """``guards`` connected, then the kill switch set and in force in each."""
    await connected(*guards)
    await rollout(server, "kill")
    await until(lambda: all(g._rollout.override == 0.0 for g in guards))


async def written_back(client: redis.Redis) -> None:
    """Wait (10 s at most) until a process's next read writes the lost kill switch back."""
    with anyio.fail_after(10):
        while await client.get(KILL) != b"1":  # noqa: ASYNC110 (written back by a process's next read)
            await anyio.sleep(0.01)


async def _lose_by_flushall(server: RedisServer, client: redis.Redis) -> None:
    await client.flushall()


async def _lose_by_eviction(server: RedisServer, client: redis.Redis) -> None:
    """``allkeys-lru`` under memory pressure: fill the store until Redis evicts the kill switch."""
    await client.config_set("maxmemory-policy", "allkeys-lru")
    await client.config_set("maxmemory", str(int((await client.info("memory"))["used_memory"]) + 2_000_000))
    for batch in range(200):
        if not await client.exists(KILL):
            await client.config_set("maxmemory", "0")  # one loss: no later write evicts the key again
            return
        async with client.pipeline(transaction=False) as pipe:
            for i in range(100):
                pipe.set(f"junk:{batch}:{i}", "x" * 1000)
            await pipe.execute()
    raise AssertionError("Redis never evicted the kill switch")


@pytest.mark.parametrize("lose", [_lose_by_flushall, _lose_by_eviction])
async def test_a_kill_switch_lost_without_a_restart_is_written_back(
    redis_factory: type[RedisServer],
    lose: Callable[[RedisServer, redis.Redis], Awaitable[None]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store stays connected while its keys vanish (FLUSHALL, an ``allkeys-lru`` eviction): the
    next read finds them missing, writes back what it last read and keeps it, with one warning per process. A
    process started afterwards then follows the kill switch too, and only the command lifts it."""
    caplog.set_level(logging.WARNING, "llmguard_client")
    server = redis_factory()
    server.start()
    a, b = guard(server.url), guard(server.url)
    client = redis.Redis.from_url(server.url)
    try:
        await killed(server, a, b)
        transitions = a.snapshot().fleet.transitions  # type: ignore[union-attr]
        await lose(server, client)
        await written_back(client)
        await until(lambda: sum("lost the rollout flag" in r.getMessage() for r in caplog.records) >= 1)
        assert a._rollout.override == b._rollout.override == 0.0
        assert a.snapshot().fleet.transitions == transitions  # type: ignore[union-attr]  # never disconnected
        warned = [r for r in caplog.records if "lost the rollout flag" in r.getMessage()]
        assert 1 <= len(warned) <= 2 and all(r.levelno == logging.WARNING for r in warned), warned
        c = guard(server.url)
        try:
            await connected(c)
            assert c._rollout.override == 0.0
        finally:
            await c.aclose()
        await rollout(server, "clear")  # the command still lifts it
        await until(lambda: a._rollout.override is None and b._rollout.override is None)
    finally:
        await client.aclose()
        for g in (a, b):
            await g.aclose()


async def test_a_flag_lost_again_and_again_is_warned_of_once_then_logged_at_info(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A store that loses the kill switch four times in a row (an ``allkeys-lru`` store under steady memory
    pressure evicts it again and again): each loss is written back, but one warning is given, the later losses
    logged at INFO (each warned before: one warning per eviction per process)."""
    caplog.set_level(logging.INFO, "llmguard_client")
    a = guard(redis_server.url)
    client = redis.Redis.from_url(redis_server.url)
    try:
        await killed(redis_server, a)
        for _ in range(4):
            await client.flushall()
            await written_back(client)
        await until(lambda: sum("lost the rollout flag" in r.getMessage() for r in caplog.records) == 4)
        lost = [r.levelno for r in caplog.records if "lost the rollout flag" in r.getMessage()]
        assert lost == [logging.WARNING] + [logging.INFO] * 3
        assert a._rollout.override == 0.0
    finally:
        await client.aclose()
        await a.aclose()


async def test_a_failover_to_an_empty_primary_keeps_the_kill_switch(
    redis_factory: type[RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    """The store is made a replica of an empty primary: it drops the flag and refuses the write-back (read
    only), so the processes keep the kill switch in force and say so; once it is a primary again, they write it
    back."""
    caplog.set_level(logging.INFO, "llmguard_client")
    server, empty = redis_factory(), redis_factory()
    server.start()
    empty.start()
    a = guard(server.url)
    client = redis.Redis.from_url(server.url)
    try:
        await killed(server, a)
        await client.config_set("repl-diskless-load", "swapdb")  # the synced data set never touches the disk
        primary = redis.Redis(port=empty.port)
        await primary.config_set("repl-diskless-sync-delay", "0")
        await primary.aclose()
        await client.replicaof("127.0.0.1", str(empty.port))
        await until(lambda: any("could not write it back: ReadOnlyError" in r.getMessage() for r in caplog.records))
        assert a._rollout.override == 0.0 and await client.get(KILL) is None
        await client.replicaof("no", "one")
        await written_back(client)
        await until(lambda: any("wrote the lost rollout flag back" in r.getMessage() for r in caplog.records))
        assert a._rollout.override == 0.0
        assert sum("lost the rollout flag" in r.getMessage() for r in caplog.records) == 1
    finally:
        await client.aclose()
        await a.aclose()


@pytest.mark.parametrize("db", [0, 1])
async def test_a_process_started_after_the_loss_follows_the_write_back_at_once(
    redis_server: RedisServer, db: int
) -> None:
    """A process that started after the store lost the flag has nothing to write back; the process that writes
    it back announces it, so the newcomer follows long before its own next poll (an hour here). The command's
    change and the write-back are announced on the channel of the fleet's database: on database 1 as on 0."""
    url = redis_server.url.removesuffix("/0") + f"/{db}"
    a, c = (Guard(REPLICAS, fleet=url, name="checkout", rollout_poll_interval=3600) for _ in "ac")
    client = redis.Redis.from_url(url)
    try:
        await connected(a)
        assert await anyio.to_thread.run_sync(main, ["kill", "--fleet", url, "--name", "checkout"]) == 0
        await until(lambda: a._rollout.override == 0.0)
        await client.flushdb()
        await connected(c)
        assert c._rollout.override is None  # nothing stored, nothing known
        a._fleet.store.submit(a._fleet.flag.read)  # type: ignore[union-attr]  # a's next poll, now
        await until(lambda: c._rollout.override == 0.0)
    finally:
        await client.aclose()
        for g in (a, c):
            await g.aclose()


async def test_a_process_that_never_read_a_flag_has_nothing_to_write_back(redis_server: RedisServer) -> None:
    """Missing keys with no value read before: the process uses its own fraction and writes nothing."""
    a = guard(redis_server.url)
    client = redis.Redis.from_url(redis_server.url)
    try:
        await connected(a)
        await until(lambda: a._fleet.flag.reads >= 3)  # type: ignore[union-attr]
        assert a._rollout.override is None
        assert await client.keys("llmguard:checkout:rollout:*") == []
    finally:
        await client.aclose()
        await a.aclose()
