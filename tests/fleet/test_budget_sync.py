"""``BudgetPolicy(scope="fleet")``: the Guards of one fleet share one retry budget through a real redis-server,
fall back to their own window while Redis is down, and stop syncing when closed. The syncs are driven
explicitly (the background one, every 0.2 s, only adds to what the test drives)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

import anyio
import pytest
import redis.asyncio as redis

from llmguard_client import BudgetPolicy, ContinuationPolicy, Guard, GuardConfigError
from llmguard_client._budget.budget import RetryBudget
from llmguard_client._budget.fleet_sync import FleetBudgetSync
from tests.fleet.guards import connected, until
from tests.redis_server import RedisServer

REPLICAS = ["http://127.0.0.1:9/r0", "http://127.0.0.1:9/r1"]
FLEET = BudgetPolicy(ratio=0.1, floor=0, window=60.0, scope="fleet")
"""No floor and a minute's window: every allowance comes from calls, none ages out during a test."""


def guard(url: str, budget: BudgetPolicy = FLEET, name: str = "checkout") -> Guard:
    g = Guard(REPLICAS, fleet=url, name=name, hedge=None, budget=budget)
    assert g._fleet is not None
    # Seconds, not 50 ms, for each Redis operation (the heartbeat's and the syncs' bounds follow): on a loaded
    # machine a late answer would fail the store open, which these tests do not ask about (a killed Redis still
    # refuses at once).
    g._fleet.store.op_timeout = 10.0
    return g


async def sync(url: str, *guards: Guard) -> None:
    """One sync of each Guard's fleet budgets, in order, on a connection of the test's own."""
    client = redis.Redis.from_url(url)
    try:
        for g in guards:
            assert g._fleet is not None and g._fleet.budgets is not None
            await g._fleet.budgets.sync(client)
    finally:
        await client.aclose()


def budget(g: Guard) -> RetryBudget:
    assert g.budget is not None
    return g.budget


def acquired(b: RetryBudget, n: int) -> int:
    """How many of ``n`` acquisitions the budget grants (each one settled: the attempt was sent)."""
    granted = 0
    for _ in range(n):
        ticket = b.try_acquire()
        if ticket is not None:
            ticket.settle()
            granted += 1
    return granted


async def test_two_guards_share_one_budget(redis_server: RedisServer) -> None:
    a, b = guard(redis_server.url), guard(redis_server.url)
    alone = guard(redis_server.url, name="search")  # another fleet on the same Redis: its own budget
    try:
        await connected(a, b, alone)
        for _ in range(60):
            budget(a).record_request()
        for _ in range(40):
            budget(b).record_request()
        assert acquired(budget(a), 4) == 4  # 0.1 x its own 60 calls allows 6
        await sync(redis_server.url, a, b, a)
        # The fleet made 100 calls and spent 4, so 6 are left; B may spend its share at once: half, for two
        # processes. What A leaves unspent comes to B over the next syncs, down to the last one, which goes to
        # the first process by id: 5 or 6 in all, although B's own 40 calls earn only 4.
        assert acquired(budget(b), 10) == 3
        granted = 3
        for _ in range(8):
            await sync(redis_server.url, b)
            granted += acquired(budget(b), 10)
        await sync(redis_server.url, a)
        last = acquired(budget(a), 10)  # A's own window would still allow 2
        assert granted + last == 6 and granted >= 5
        await sync(redis_server.url, a, b)
        assert acquired(budget(a), 1) == 0 and acquired(budget(b), 1) == 0
        shown = b.snapshot().budget
        assert shown is not None and shown.scope == "fleet" and shown.fleet is not None
        assert shown.fleet.in_force and shown.fleet.window_requests == 100 and shown.fleet.window_extras == 10
        assert shown.fleet.processes == 2
        assert shown.level < 1 and shown.window_requests == 40  # its own window stays in the snapshot
        await sync(redis_server.url, alone)
        other = alone.snapshot().budget
        assert other is not None and other.fleet is not None and other.fleet.window_requests == 0
    finally:
        for g in (a, b, alone):
            await g.aclose()


async def test_calls_made_between_two_syncs_count_at_once(redis_server: RedisServer) -> None:
    a = guard(redis_server.url)
    try:
        await connected(a)
        await sync(redis_server.url, a)
        for _ in range(20):
            budget(a).record_request()  # not synced yet: the budget adds them to the fleet's totals it read
        assert acquired(budget(a), 5) == 2
        await sync(redis_server.url, a)
        assert acquired(budget(a), 1) == 0
        shown = a.snapshot().budget
        assert shown is not None and shown.fleet is not None
        assert (shown.fleet.window_requests, shown.fleet.window_extras) == (20, 2)
    finally:
        await a.aclose()


async def test_with_redis_down_the_budget_is_the_process_own(redis_factory: type[RedisServer]) -> None:
    store = redis_factory()
    store.start()
    a, b = guard(store.url), guard(store.url)
    try:
        await connected(a, b)
        for _ in range(100):
            budget(a).record_request()
        await sync(store.url, a, b)
        assert budget(b).level == pytest.approx(5.0)  # its share of the fleet's 100 calls' 10
        store.stop()
        await until(lambda: bool(b.snapshot().fleet and not b.snapshot().fleet.connected))
        shown = b.snapshot().budget
        assert shown is not None and shown.fleet is not None and not shown.fleet.in_force
        assert acquired(budget(b), 1) == 0  # its own window: no call, no floor
        assert acquired(budget(a), 20) == 10  # its own 100 calls
    finally:
        for g in (a, b):
            await g.aclose()


async def test_a_process_cut_off_for_over_a_window_drops_what_it_counted(redis_server: RedisServer) -> None:
    a = guard(redis_server.url)
    assert a._fleet is not None
    now = [1000.0]
    client = redis.Redis.from_url(redis_server.url)
    try:
        sync_ = FleetBudgetSync(a._fleet.store, clock=lambda: now[0])
        share = sync_.add(RetryBudget(0.1, 0, 60.0), "x")
        for _ in range(7):
            share.budget.record_request()
        await sync_.sync(client)
        assert share.requests == 7
        for _ in range(5):
            share.budget.record_request()
        now[0] += 61.0  # no sync for over a window: those 5 calls are older than the window may be
        await sync_.sync(client)
        assert share.requests == 0 and share.sent == (12, 0)
    finally:
        await client.aclose()
        await a.aclose()


async def test_closing_the_guard_stops_the_sync(redis_server: RedisServer) -> None:
    a = guard(redis_server.url)
    await connected(a)
    assert a._fleet is not None
    await until(lambda: bool(a._fleet and a._fleet.budgets and a._fleet.budgets.shares[0].syncs >= 2))
    task = a._fleet.store._task
    await a.aclose()
    assert task is not None and task.done() and a._fleet.store.closed
    syncs = a._fleet.budgets.shares[0].syncs if a._fleet.budgets else -1
    await anyio.sleep(0.3)  # more than one sync interval: a sync still running would have counted
    assert a._fleet.budgets is not None and a._fleet.budgets.shares[0].syncs == syncs


def test_scope_is_checked() -> None:
    with pytest.raises(GuardConfigError, match=r"scope must be 'process' or 'fleet', got 'cluster'"):
        BudgetPolicy(scope="cluster")  # type: ignore[arg-type]
    with pytest.raises(GuardConfigError, match=r"needs Guard\(fleet="):
        Guard(REPLICAS, budget=BudgetPolicy(scope="fleet"))
    with pytest.raises(GuardConfigError, match=r"needs Guard\(fleet="):
        Guard(REPLICAS, tier_budgets={"interactive": BudgetPolicy(scope="fleet")})
    with pytest.raises(GuardConfigError, match=r"scope='process'"):
        ContinuationPolicy(budget=BudgetPolicy(scope="fleet"))
    local = Guard(REPLICAS).snapshot().budget
    assert local is not None and local.scope == "process" and local.fleet is None


async def test_a_tier_budget_is_shared_apart_from_the_guard_s(redis_server: RedisServer) -> None:
    tiers_policy = {"interactive": FLEET}
    a = Guard(REPLICAS, fleet=redis_server.url, name="checkout", hedge=None, budget=FLEET, tier_budgets=tiers_policy)
    b = Guard(REPLICAS, fleet=redis_server.url, name="checkout", hedge=None, budget=FLEET, tier_budgets=tiers_policy)
    try:
        await connected(a, b)
        for _ in range(50):
            a.tier_budgets["interactive"].record_request()
        await sync(redis_server.url, a, b)
        assert acquired(b.tier_budgets["interactive"], 10) == 2  # its share: half of 5
        assert acquired(budget(b), 1) == 0  # the Guard's budget saw none of the tier's calls
    finally:
        for g in (a, b):
            await g.aclose()


def skewed_sync(g: Guard, skew: float) -> FleetBudgetSync:
    """A budget sync of ``g``'s process (its own id; the Guard never connects, so only the test syncs it) whose
    host's wall clock is ``skew`` seconds off (its monotonic clock is off the server's by any amount anyway)."""
    assert g._fleet is not None
    sync_ = FleetBudgetSync(g._fleet.store, wall=lambda: time.time() + skew)
    sync_.add(RetryBudget(0.1, 0, 60.0), "guard")
    return sync_


@contextlib.asynccontextmanager
async def two_processes(redis_server: RedisServer) -> AsyncIterator[tuple[Guard, Guard, redis.Redis]]:
    """Two Guards of one fleet (two processes' worth) and a client of their Redis, all closed after."""
    a, b = guard(redis_server.url), guard(redis_server.url)
    client = redis.Redis.from_url(redis_server.url)
    try:
        yield a, b, client
    finally:
        await client.aclose()
        for g in (a, b):
            await g.aclose()


@pytest.mark.parametrize("skew", [-2.0, -30.0, 15.0])
async def test_a_process_whose_clock_is_off_is_counted(redis_server: RedisServer, skew: float) -> None:
    async with two_processes(redis_server) as (a, b, client):
        off, right = skewed_sync(a, skew), skewed_sync(b, 0.0)
        await off.sync(client)  # the first sync also measures the server's clock: the count never depends on it
        for _ in range(3):
            await right.sync(client)
            assert right.shares[0].processes == 2
            await off.sync(client)
            assert off.shares[0].processes == 2


@pytest.mark.parametrize("skew", [-2.0, 0.0, 60.0])
async def test_a_process_that_stopped_syncing_is_dropped_whatever_its_clock(
    redis_server: RedisServer, skew: float
) -> None:
    async with two_processes(redis_server) as (a, b, client):
        gone, right = skewed_sync(a, skew), skewed_sync(b, 0.0)
        await gone.sync(client)
        await right.sync(client)
        assert right.shares[0].processes == 2
        # A exits; B goes on syncing (which keeps the set alive). A member is dropped once it has not synced for
        # five sync intervals (at least a second) of the Redis server's time: its clock runs in real time, so the
        # test waits that out.
        gone_after = max(1.0, 5 * right.interval)
        deadline = time.monotonic() + gone_after + 0.1
        while time.monotonic() < deadline:
            await anyio.sleep(right.interval)
            await right.sync(client)
        assert right.shares[0].processes == 1


async def test_calls_of_a_process_whose_clock_is_off_count_in_the_fleet_s_window(redis_server: RedisServer) -> None:
    async with two_processes(redis_server) as (a, b, client):
        ahead, right = skewed_sync(a, 120.0), skewed_sync(b, 0.0)  # two windows ahead
        await ahead.sync(client)  # its first sync measures the server's clock
        for _ in range(50):
            ahead.shares[0].budget.record_request()
        await ahead.sync(client)
        await right.sync(client)
        assert right.shares[0].requests == 50  # in the bucket of the server's time, not two windows ahead


async def test_a_sync_loads_the_membership_script_redis_lacks(redis_server: RedisServer) -> None:
    async with two_processes(redis_server) as (a, b, client):
        first, second = skewed_sync(a, 0.0), skewed_sync(b, 0.0)
        await first.sync(client)
        await client.script_flush()  # as after a restart of Redis, or an operator's SCRIPT FLUSH
        await second.sync(client)
        await first.sync(client)
        assert first.shares[0].processes == 2 and second.shares[0].processes == 2


@pytest.mark.parametrize("step", [600.0, -600.0])
async def test_a_step_of_the_host_s_wall_clock_loses_no_count(redis_server: RedisServer, step: float) -> None:
    async with two_processes(redis_server) as (a, b, client):
        assert b._fleet is not None
        wall = [0.0]
        other = skewed_sync(a, 0.0)
        stepped = FleetBudgetSync(b._fleet.store, wall=lambda: time.time() + wall[0])
        share = stepped.add(RetryBudget(0.1, 0, 60.0), "guard")
        for _ in range(30):
            other.shares[0].budget.record_request()
        await other.sync(client)
        for _ in range(10):
            share.budget.record_request()
        await stepped.sync(client)  # measures the server's clock
        assert share.requests == 40
        wall[0] = step  # NTP steps the host's clock, or a VM resumes: its monotonic clock goes on
        for _ in range(5):
            share.budget.record_request()
        await stepped.sync(client)
        assert share.requests == 45  # the fleet's window, with the calls made around the step
        age = share.view().age
        assert age is not None and age < 60.0  # seconds since that read, not the step's 600
        await other.sync(client)
        assert other.shares[0].requests == 45  # filed in the fleet's current bucket


async def test_the_age_of_the_fleet_s_totals_is_on_the_guard_s_clock(redis_server: RedisServer) -> None:
    now = [1000.0]
    g = Guard(REPLICAS, fleet=redis_server.url, name="checkout", hedge=None, budget=FLEET, clock=lambda: now[0])
    try:
        await sync(redis_server.url, g)
        now[0] += 7.0
        shown = g.snapshot().budget
        assert shown is not None and shown.fleet is not None and shown.fleet.age == 7.0
    finally:
        await g.aclose()
