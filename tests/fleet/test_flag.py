"""The fleet-wide rollout flag survives a Redis restart: the processes write back what they last read, so a kill
switch is lifted only by ``set`` or ``clear``, never by the store coming back empty."""

from __future__ import annotations

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
        await connected(a, b)
        await rollout(server, "kill")
        await until(lambda: a._rollout.override == b._rollout.override == 0.0)
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
        await connected(a)
        await rollout(server, "kill")
        await until(lambda: a._rollout.override == 0.0)
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
        await connected(a)
        await rollout(redis_server, "kill")
        await until(lambda: a._rollout.override == 0.0)
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
