"""The fleet store against a real redis-server: it answers within its bound, fails open at once, says so once
per transition, reconnects and resyncs; credentials never show."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

import anyio
import pytest
import redis.asyncio as redis

from llmguard_client._fleet import FleetStore, parse_fleet_url
from tests.redis_server import RedisServer


def make_store(url: str, **kwargs: float) -> FleetStore:
    options = {"heartbeat": 0.1, "backoff_initial": 0.05, "backoff_max": 0.2, **kwargs}
    return FleetStore(parse_fleet_url(url), "checkout", **options)


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Wait for ``condition`` (a generous bound: behaviour, not speed, is what is asserted)."""
    with anyio.fail_after(seconds):
        while not condition():  # noqa: ASYNC110 (polled state has no event)
            await anyio.sleep(0.01)


async def echo(client: redis.Redis) -> bytes | None:
    await client.set("llmguard:checkout:probe", "1")
    value: bytes | None = await client.get("llmguard:checkout:probe")
    return value


def test_keys_are_namespaced_by_the_guard_name() -> None:
    store = make_store("redis://127.0.0.1:1/0")
    assert store.key("cool", "http://r1:8000") == "llmguard:checkout:cool:http://r1:8000"
    assert store.key("rollout", "fraction") == "llmguard:checkout:rollout:fraction"


async def test_run_answers_once_connected(redis_server: RedisServer) -> None:
    store = make_store(redis_server.url)
    try:
        assert await store.run(echo, b"default") == b"default"  # not connected yet: the default, at once
        await until(lambda: store.available)
        assert await store.run(echo, b"default") == b"1"
        snap = store.snapshot()
        assert (snap.state, snap.connected, snap.degraded, snap.resyncs) == ("connected", True, False, 1)
    finally:
        await store.aclose()
    assert store.snapshot().state == "closed"


async def test_an_unreachable_store_fails_open_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "llmguard_client")
    store = make_store("redis://:hunter2@127.0.0.1:1/0")
    try:
        store.start()
        await until(lambda: store.snapshot().degraded)
        await anyio.sleep(0.5)  # several reconnect attempts fail meanwhile
        assert await store.run(echo, None) is None
        snap = store.snapshot()
        assert snap.last_error is not None and "hunter2" not in snap.last_error
        assert snap.url == "redis://:***@127.0.0.1:1/0"
        warnings = [r.getMessage() for r in caplog.records if "degraded" in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert all("hunter2" not in r.getMessage() for r in caplog.records)
    finally:
        await store.aclose()


async def test_a_wrong_password_fails_open_without_showing_it(
    redis_factory: type[RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "llmguard_client")
    server = redis_factory(password="right-one")
    server.start()
    store = make_store(f"redis://:wrong-one@127.0.0.1:{server.port}/0")
    try:
        store.start()
        await until(lambda: store.snapshot().degraded)
        error = store.snapshot().last_error or ""
        assert "wrong-one" not in error and ("password" in error.lower() or "auth" in error.lower()), error
        assert all("wrong-one" not in r.getMessage() for r in caplog.records)
    finally:
        await store.aclose()


async def test_a_failing_op_returns_the_default_and_reconnects(redis_server: RedisServer) -> None:
    store = make_store(redis_server.url)
    try:
        store.start()
        await until(lambda: store.available)

        async def broken(client: redis.Redis) -> int:
            await client.execute_command("NO-SUCH-COMMAND")
            return 1

        assert await store.run(broken, 0) == 0
        assert not store.available
        await until(lambda: store.available)
        snap = store.snapshot()
        assert snap.transitions == 2 and snap.resyncs == 2
        assert snap.last_error is not None and "NO-SUCH-COMMAND" in snap.last_error.upper()
    finally:
        await store.aclose()


async def slow(client: redis.Redis) -> int:
    await anyio.sleep(1.0)
    return 1


async def test_an_op_slower_than_the_bound_returns_the_default_and_the_next_calls_decide_at_once(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A timeout is no outage (a Redis one region away answers, only too late for a call): no reconnection,
    no resync; the calls that follow get their default without a round trip, and one warning says why."""
    store = make_store(redis_server.url, heartbeat=30.0)  # no heartbeat during the test
    sent: list[int] = []

    async def counted(client: redis.Redis) -> int:
        sent.append(1)
        return 1

    try:
        store.start()
        await until(lambda: store.available)
        with caplog.at_level(logging.WARNING, logger="llmguard_client"):
            assert await store.run(slow, -1) == -1
            assert [await store.run(counted, -1) for _ in range(3)] == [-1] * 3
            assert await store.run(slow, -1) == -1
        assert sent == []
        snap = store.snapshot()
        assert (snap.state, snap.slow, snap.transitions, snap.resyncs) == ("connected", True, 0, 1)
        assert "Timeout" in (snap.last_error or "")
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "slower than a call may wait" in warnings[0]
    finally:
        await store.aclose()


async def test_a_heartbeat_answered_in_time_lets_calls_ask_the_store_again(redis_server: RedisServer) -> None:
    store = make_store(redis_server.url, heartbeat=0.1)
    try:
        store.start()
        await until(lambda: store.available)
        assert await store.run(slow, -1) == -1
        await until(lambda: not store.snapshot().slow)
        assert await store.run(echo, None) == b"1"
        assert (store.snapshot().transitions, store.snapshot().resyncs) == (0, 1)
    finally:
        await store.aclose()


async def test_a_store_that_never_answers_its_first_connection_is_waited_for_once() -> None:
    """A Redis that accepts connections and never answers (a black hole): the first call waits for the first
    connection at most ``op_timeout``; the calls after it, while that connection is still under way, do not."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # connections complete in the backlog; nothing ever answers
    port = listener.getsockname()[1]
    store = make_store(f"redis://127.0.0.1:{port}/0", op_timeout=0.05, connect_timeout=30.0)
    try:
        waiting = store.settling()
        assert waiting is not None
        assert await waiting is False
        assert store.snapshot().state == "connecting"
        assert store.settling() is None and await store.first_connection() is False  # no second wait
    finally:
        await store.aclose()
        listener.close()


Fault = Callable[[RedisServer], None]


@pytest.mark.parametrize(
    ("fault", "repair"),
    [
        (RedisServer.pause, RedisServer.resume),
        (RedisServer.stop, RedisServer.start),
    ],
    ids=["paused", "killed"],
)
async def test_a_paused_or_killed_server_degrades_then_resyncs(
    redis_factory: type[RedisServer], fault: Fault, repair: Fault
) -> None:
    server = redis_factory()
    server.start()
    store = make_store(server.url)
    resynced: list[int] = []

    async def hook(client: redis.Redis) -> None:
        resynced.append(1)

    store.on_connect(hook)
    try:
        store.start()
        await until(lambda: store.available)
        fault(server)
        await until(lambda: store.snapshot().degraded)  # the heartbeat finds a paused server too
        assert await store.run(echo, None) is None  # at once: no round trip while degraded
        repair(server)
        await until(lambda: store.available)
        assert len(resynced) == 2
        assert await store.run(echo, None) == b"1"
        assert store.snapshot().transitions == 2
    finally:
        await store.aclose()


async def test_calls_from_many_tasks_share_one_store(redis_server: RedisServer) -> None:
    store = make_store(redis_server.url, op_timeout=1.0)
    results: list[int] = []

    async def incr(client: redis.Redis) -> int:
        return int(await client.incr(store.key("n")))

    async def one() -> None:
        results.append(await store.run(incr, 0))

    try:
        store.start()
        await until(lambda: store.available)
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(one)
        assert sorted(results) == list(range(1, 21))
    finally:
        await store.aclose()


async def test_closing_the_store_lets_a_connection_close_finish(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`aclose()` during the supervisor's shielded closing of a client waits for it to finish: cancelling the
    task itself would cut through the shield and leave the client's sockets open (a ResourceWarning at GC)."""
    started, finished = anyio.Event(), anyio.Event()
    original = redis.Redis.aclose

    async def slow_aclose(self: redis.Redis, close_connection_pool: bool | None = None) -> None:
        started.set()
        await anyio.sleep(0.2)
        await original(self, close_connection_pool)
        finished.set()

    monkeypatch.setattr(redis.Redis, "aclose", slow_aclose)
    store = make_store(redis_server.url, backoff_initial=30.0)  # no reconnection during the test
    store.start()
    try:
        await until(lambda: store.available)
        store.degrade(RuntimeError("ended by the test"))  # the session ends; the supervisor closes its client
        with anyio.fail_after(10.0):
            await started.wait()
    finally:
        await store.aclose()
    assert finished.is_set()
    assert store.snapshot().state == "closed"


def record_pauses(store: FleetStore) -> list[float]:
    """The backoff before each reconnection, recorded (without its jitter) instead of waited: rounds are counted,
    not timed."""
    delays: list[float] = []

    async def pause(delay: float) -> None:
        delays.append(delay)
        await anyio.sleep(0.001)

    store._pause = pause  # type: ignore[method-assign]
    return delays


async def broken(client: redis.Redis) -> int:
    await client.execute_command("NO-SUCH-COMMAND")
    return 1


@pytest.mark.parametrize("quoting", [None, "a count"])
async def test_a_session_that_fails_again_the_same_way_backs_off_and_is_told_once(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture, quoting: str | None
) -> None:
    """Sessions that connect, then fail at once the same way (a command the server refuses, as on each call):
    each backs off as a failed connection does, and the log says it once, also when each failure's text quotes
    another number (an OOM error quotes memory figures). Before, each reconnected after the initial backoff (~10 a
    second), and each said "degraded" then "connected again"."""
    caplog.set_level(logging.INFO, "llmguard_client")
    store = make_store(redis_server.url, heartbeat=30.0, backoff_initial=0.1, backoff_max=1.0)  # no session works
    delays = record_pauses(store)

    async def failing(client: redis.Redis, n: int) -> int:
        await client.execute_command("NO-SUCH-COMMAND", *([] if quoting is None else [str(1000 + n)]))
        return 1

    try:
        store.start()
        for n in range(6):
            await until(lambda: store.available)
            assert await store.run(lambda client, n=n: failing(client, n), 0) == 0
        told = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(told) == 1 and "degraded" in told[0] and "NO-SUCH-COMMAND" in told[0].upper(), told
        await until(lambda: len(delays) == 6)
        assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
        assert "NO-SUCH-COMMAND" in (store.snapshot().last_error or "").upper()
    finally:
        await store.aclose()


async def test_a_session_that_works_resets_the_backoff_and_says_it_is_back(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Once a session's heartbeat is answered it works: its failure is an outage of its own (told, and retried
    after the initial backoff), and the log said it was back."""
    caplog.set_level(logging.INFO, "llmguard_client")
    store = make_store(redis_server.url, heartbeat=0.01, backoff_initial=0.1, backoff_max=1.0)
    delays = record_pauses(store)
    try:
        store.start()
        for _ in range(3):
            await until(lambda: store.available and store._working)
            assert await store.run(broken, 0) == 0
        await until(lambda: store.available and store._working)
        assert delays == [0.1, 0.1, 0.1]
        told = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert [("degraded" in m, "connected again" in m) for m in told] == [(True, False), (False, True)] * 3, told
    finally:
        await store.aclose()


async def test_every_channel_of_the_fleet_names_its_database_unless_it_is_0(redis_server: RedisServer) -> None:
    """Pub/sub ignores the database: the cool-downs' and circuits' events, the servers' hints and the rollout
    flag's notices of two fleets of one name on databases 0 and 3 must travel on channels of their own."""
    from llmguard_client import Guard
    from tests.fleet.guards import connected

    guards = [
        Guard(["http://127.0.0.1:9"], fleet=redis_server.url.replace("/0", "/" + db), name="checkout") for db in "03"
    ]
    admin = redis.Redis(port=redis_server.port)
    try:
        await connected(*guards)
        channels = {c.decode() for c in await admin.pubsub_channels("llmguard:checkout:*")}
        assert guards[0]._fleet is not None
        hints = guards[0]._fleet.hints.channel.removeprefix("llmguard:checkout:")  # per replica set
        assert hints.startswith("hints:")
        parts = ("events", hints, "rollout")
        assert channels == {f"llmguard:checkout:{p}" for p in parts} | {f"llmguard:checkout:{p}@db3" for p in parts}
        assert (
            guards[1]._fleet is not None and guards[1]._fleet.store.channel("events") == "llmguard:checkout:events@db3"
        )
    finally:
        for g in guards:
            await g.aclose()
        await admin.aclose()


def _read_as_before_redis_py_8_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the installed redis-py's blocking pub/sub read give up at the client's socket timeout, as every release
    before 8.1 does (the ``[fleet]`` extra allows 5.0.1 on): ``listen()`` and ``get_message(timeout=None)`` then
    raise TimeoutError after ``socket_timeout`` without a message. A read with a timeout of its own is untouched."""
    from redis.asyncio.client import PubSub
    from redis.exceptions import TimeoutError as RedisTimeoutError

    original = PubSub.parse_response

    async def parse_response(self: PubSub, block: bool = True, timeout: float = 0) -> object:  # noqa: ASYNC109
        if not block:
            return await original(self, block=False, timeout=timeout)
        connection = self.connection
        assert connection is not None
        response = await original(self, block=False, timeout=connection.socket_timeout)
        if response is None:
            raise RedisTimeoutError(f"Timeout reading from {connection.host}:{connection.port}")
        return response

    monkeypatch.setattr(PubSub, "parse_response", parse_response)


async def test_an_idle_subscription_stays_connected_past_the_socket_timeout(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No message for many socket timeouts is no failure: the store stays connected (and hears the next message).
    Before, the listener's blocking read raised TimeoutError each ``connect_timeout`` with redis-py < 8.1, and
    the store degraded and reconnected against a healthy, idle Redis."""
    from llmguard_client._fleet import store as store_module
    from llmguard_client._fleet.nodes import ping

    _read_as_before_redis_py_8_1(monkeypatch)
    # connect_timeout is the client's socket timeout too; a heartbeat's PING may take up to 0.5 s on a busy machine
    store = make_store(redis_server.url, connect_timeout=0.3, heartbeat=0.5)
    received: list[bytes] = []
    store.subscribe(store.key("events"), received.append)
    beats = 0

    async def counted_ping(client: redis.Redis) -> None:
        nonlocal beats
        await ping(client)
        beats += 1

    monkeypatch.setattr(store_module, "ping", counted_ping)
    admin = redis.Redis(port=redis_server.port)
    try:
        store.start()
        await until(lambda: store.available)
        connected, beaten = store.snapshot(), beats  # (a first connection slowed by a busy machine may have failed)
        # 3 heartbeats 0.5 s apart: idle for 5 socket timeouts at least (or degraded before)
        await until(lambda: beats >= beaten + 3 or store.snapshot().transitions != connected.transitions)
        snap = store.snapshot()
        assert snap.state == "connected"
        assert (snap.transitions, snap.resyncs) == (connected.transitions, connected.resyncs), snap.last_error
        await admin.publish(store.channel("events"), b"still listening")
        await until(lambda: received == [b"still listening"])
    finally:
        await store.aclose()
        await admin.aclose()
