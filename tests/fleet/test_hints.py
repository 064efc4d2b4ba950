"""Server hints through a real redis-server: one process of the fleet polls the servers' /metrics and the others
believe what it read; a poller that stops hands the polling over; without the store each process polls."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable

import anyio
import pytest

from llmguard_client import Guard
from llmguard_client._fleet import FleetStore, parse_fleet_url
from llmguard_client._fleet.hints import FleetHints
from llmguard_client._routing.health import server_kv_usage, server_waiting
from llmguard_client.server_hints import poll_vllm_metrics
from tests.fleet.guards import connected, states, until
from tests.redis_server import RedisServer
from tests.test_server_hints import Metrics

REPLICAS = ["http://a:1/v1", "http://b:1/v1"]
REPORT = "vllm:num_requests_waiting 5\nvllm:kv_cache_usage_perc 0.5\n"
EVERY = 0.5
"""The pollers' interval: the lease lasts three, so a holder renews it in time even on a busy machine."""


def guard(url: str, metrics: Metrics, replicas: list[str] = REPLICAS, report: str = REPORT) -> Guard:
    """A Guard of the ``checkout`` fleet whose replicas answer /metrics from ``metrics`` (``report``). Its store
    waits up to 2 s for Redis (not 50 ms), so that a slow answer on a busy machine does not send it polling on its
    own."""
    metrics.bodies = {r: (200, report) for r in replicas}
    store = FleetStore(parse_fleet_url(url), "checkout", op_timeout=2.0)
    return Guard(replicas, fleet=store, transport_factory=metrics.factory, instrumentation=None, hedge=None)


def hints(g: Guard) -> FleetHints:
    assert g._fleet is not None
    return g._fleet.hints


def role(g: Guard) -> str | None:
    fleet = g.snapshot().fleet
    assert fleet is not None
    return fleet.hints


def polls(metrics: Metrics) -> int:
    return sum(metrics.polls.values())


async def test_one_process_polls_for_the_fleet_and_the_others_believe_what_it_read(redis_server: RedisServer) -> None:
    seen = {"a": Metrics(), "b": Metrics()}
    a, b = guard(redis_server.url, seen["a"]), guard(redis_server.url, seen["b"])
    try:
        await connected(a, b)
        async with anyio.create_task_group() as tg:
            for g in (a, b):
                tg.start_soon(functools.partial(poll_vllm_metrics, g, every=EVERY))
            await until(lambda: polls(seen["a"]) + polls(seen["b"]) >= 3 * len(REPLICAS))
            roles = {name: role(g) for name, g in (("a", a), ("b", b))}
            tg.cancel_scope.cancel()
        pollers = [name for name, m in seen.items() if m.polls]
        assert len(pollers) == 1, {name: m.polls for name, m in seen.items()}  # three rounds, all by one process
        assert roles[pollers[0]] == "polling" and "following" in roles.values()  # what each one's snapshot says
        assert role(a) is None and role(b) is None  # no poller runs any more
        follower = b if pollers == ["a"] else a
        now = anyio.current_time()
        for state in states(follower):  # believed for three intervals from its arrival
            assert server_waiting(state.health, now) == 5.0
            assert server_kv_usage(state.health, now) == 0.5
    finally:
        for g in (a, b):
            await g.aclose()


async def test_guards_of_one_name_with_other_replicas_each_have_their_poller(redis_server: RedisServer) -> None:
    """One service, one Guard per model, one ``name``: the other model's Guard polls its own servers (nobody else
    reads them), while a second process with the same replicas still believes the first one's polls."""
    other = ["http://c:1/v1", "http://d:1/v1"]
    seen = {"a": Metrics(), "a2": Metrics(), "other": Metrics()}
    a, a2 = guard(redis_server.url, seen["a"]), guard(redis_server.url, seen["a2"])
    b = guard(redis_server.url, seen["other"], other, "vllm:num_requests_waiting 20\n")
    try:
        await connected(a, a2, b)
        async with anyio.create_task_group() as tg:
            for g in (a, a2, b):
                tg.start_soon(functools.partial(poll_vllm_metrics, g, every=EVERY))
            await until(lambda: polls(seen["a"]) + polls(seen["a2"]) >= 3 * len(REPLICAS))
            await until(lambda: all(seen["other"].polls.get(r, 0) >= 3 for r in other))
            roles = {name: role(g) for name, g in (("a", a), ("a2", a2), ("b", b))}
            tg.cancel_scope.cancel()
        assert roles["b"] == "polling"
        assert sorted([roles["a"], roles["a2"]]) == ["following", "polling"], roles  # one lease per replica set
        pollers = [name for name in ("a", "a2") if seen[name].polls]
        assert len(pollers) == 1 and roles[pollers[0]] == "polling", (pollers, roles)
        assert hints(a).lease != hints(b).lease and hints(a).lease == hints(a2).lease
        now = anyio.current_time()
        assert [server_waiting(s.health, now) for s in states(b)] == [20.0, 20.0]  # its own servers' queues
        for state in states(a) + states(a2):  # and not the other model's
            assert server_waiting(state.health, now) == 5.0
    finally:
        for g in (a, a2, b):
            await g.aclose()


async def test_a_poller_that_stops_hands_the_polling_to_another_process(redis_server: RedisServer) -> None:
    seen = {"a": Metrics(), "b": Metrics()}
    a, b = guard(redis_server.url, seen["a"]), guard(redis_server.url, seen["b"])
    try:
        await connected(a, b)
        scopes: dict[str, anyio.CancelScope] = {}

        async def poll(name: str, g: Guard) -> None:
            with anyio.CancelScope() as scopes[name]:
                await poll_vllm_metrics(g, every=EVERY)

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll, "a", a)
            await until(lambda: polls(seen["a"]) > 0)
            tg.start_soon(poll, "b", b)
            await until(lambda: "b" in scopes)
            await anyio.sleep(1.2 * EVERY)  # b's first two rounds: a holds the lease
            assert polls(seen["b"]) == 0
            scopes["a"].cancel()
            await until(lambda: polls(seen["b"]) > 0)
            tg.cancel_scope.cancel()
    finally:
        for g in (a, b):
            await g.aclose()


async def test_the_lease_is_released_not_left_to_expire(redis_server: RedisServer) -> None:
    a, b = guard(redis_server.url, Metrics()), guard(redis_server.url, Metrics())
    try:
        await connected(a, b)
        assert await hints(a).lead(hold_for=60.0)
        assert await hints(a).lead(hold_for=60.0)  # renewed by its holder
        assert not await hints(b).lead(hold_for=60.0)
        hints(b).release()  # not b's to release
        hints(a).release()
        with anyio.fail_after(10):
            while not await hints(b).lead(hold_for=60.0):  # noqa: ASYNC110 (polled state has no event)
                await anyio.sleep(0.01)
        assert not await hints(a).lead(hold_for=60.0)
    finally:
        for g in (a, b):
            await g.aclose()


async def test_without_the_store_each_process_polls_for_itself(
    refused_url: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmguard_client")
    port = refused_url().rsplit(":", 1)[1]
    metrics = Metrics()
    g = guard(f"redis://127.0.0.1:{port}/0", metrics)
    try:
        async with g:
            assert await hints(g).lead(hold_for=0.3)  # unreachable: polls
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(poll_vllm_metrics, g, every=0.1))
                await until(lambda: polls(metrics) >= 2 * len(REPLICAS))
                assert role(g) == "polling"
                tg.cancel_scope.cancel()
        said = [r.getMessage() for r in caplog.records if "/metrics" in r.getMessage()]
        assert said[0].startswith("llmguard fleet 'checkout': this process polls the servers' /metrics on its own")
        assert len(said) == 1  # once, not each round
    finally:
        await g.aclose()


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b'{"o": "x", "f": 0.3, "t": 1}',
        b'{"o": "x", "f": 0, "t": 1, "r": {"http://a:1/v1": [5, 0.5]}}',
        b'{"o": "x", "f": "inf", "t": 1, "r": {"http://a:1/v1": [5, 0.5]}}',
        b'{"o": "x", "f": 0.3, "t": 1, "r": ["http://a:1/v1"]}',
    ],
)
def test_a_malformed_report_changes_nothing(payload: bytes) -> None:
    g = guard("redis://127.0.0.1:1/0", Metrics())
    hints(g).receive(payload)
    assert all(s.health.reported_at == float("-inf") for s in states(g))


def test_a_report_is_believed_for_what_its_poller_said_and_bad_gauges_are_dropped() -> None:
    g = guard("redis://127.0.0.1:1/0", Metrics())
    shared = FleetHints(hints(g).store, g._replica_set, clock=lambda: 100.0)
    report = {"http://a:1/v1": [5, -1], "http://b:1/v1": [True, 0.97], "http://elsewhere/v1": [9, 0.9]}
    shared.receive(json.dumps({"o": "another process", "f": 0.6, "t": 1.0, "r": report}).encode())
    a, b = (s.health for s in states(g))
    assert (server_waiting(a, 100.5), server_kv_usage(a, 100.5), server_waiting(a, 100.7)) == (5.0, None, None)
    assert (server_waiting(b, 100.5), server_kv_usage(b, 100.5)) == (None, 0.97)
    own = {"o": shared.store.origin, "f": 0.6, "t": 1.0, "r": {"http://a:1/v1": [1, 0.1]}}
    shared.receive(json.dumps(own).encode())  # its own report: already applied where it was read
    assert server_waiting(a, 100.5) == 5.0
