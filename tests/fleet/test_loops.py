"""A Guard with ``fleet=`` used from one ``asyncio.run`` after another (a script's runs, a loop per test, a task
queue's ``asyncio.run`` per task): the store reconnects on each new loop, and a loop that ends while the store
is connecting still ends."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import anyio
import httpx
import pytest

from llmguard_client import Guard
from tests.loopback import LoopbackServer
from tests.redis_server import RedisServer

T = TypeVar("T")
BODY = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}


def run_in_turn(guard: Guard, *runs: Callable[[], Coroutine[Any, Any, T]]) -> list[T]:
    """``asyncio.run`` of each in turn, in a thread of their own: a run that never returns fails the test (60 s: a
    bound for a hang, not a timing; then the Guard cannot be closed either), else the Guard is closed."""
    results: list[T] = []
    runner = threading.Thread(target=lambda: results.extend(asyncio.run(run()) for run in runs), daemon=True)
    runner.start()
    runner.join(60)
    assert not runner.is_alive(), f"asyncio.run number {len(results) + 1} never returned"
    guard.close()
    return results


def test_the_fleet_store_reconnects_on_each_new_event_loop(
    redis_server: RedisServer, servers: list[LoopbackServer]
) -> None:
    guard = Guard([servers[0].url], fleet=redis_server.url, name="loops")

    async def run() -> tuple[str, int, int]:
        before = guard.snapshot().fleet
        assert before is not None
        async with httpx.AsyncClient(transport=guard.transport) as client:
            status = (await client.post(servers[0].url + "/v1/chat/completions", json=BODY)).status_code
        with anyio.fail_after(15):
            while not ((fleet := guard.snapshot().fleet) and fleet.connected):  # noqa: ASYNC110
                await anyio.sleep(0.01)
        return before.state, status, fleet.resyncs

    first, second = run_in_turn(guard, run, run)
    assert first[:2] == ("idle", 200) and second[:2] == ("idle", 200)  # ended with the loop before
    assert (first[2], second[2]) == (1, 2)  # connected once on each loop


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a session task's coroutine left unawaited
def test_a_loop_that_ends_while_the_store_connects_ends(
    redis_server: RedisServer, servers: list[LoopbackServer]
) -> None:
    """Ending the loop after 0, 1, 2... turns of it lands its cancellation on every step of the store's
    connection in turn; redis-py loses one that lands in some of its waits, which left ``asyncio.run`` waiting
    for ever on the store's task."""
    guard = Guard([servers[0].url], fleet=redis_server.url, name="loop-ends")

    async def start_then_end(turns: int) -> None:
        async with httpx.AsyncClient(transport=guard.transport) as client:
            assert (await client.post(servers[0].url + "/v1/chat/completions", json=BODY)).status_code == 200
        for _ in range(turns):
            await asyncio.sleep(0)

    run_in_turn(guard, *(functools.partial(start_then_end, turns) for turns in range(40)))


def test_the_fleet_store_follows_the_calls_from_the_guards_own_loop_to_async_code(
    redis_server: RedisServer, servers: list[LoopbackServer]
) -> None:
    """A sync call first (on the Guard's own loop, where the store connects), then async code takes the Guard
    over: the store stops on the Guard's loop and connects again on the async one, where the calls are."""
    guard = Guard([servers[0].url], fleet=redis_server.url, name="moves")

    def connected(resyncs: int) -> bool:
        fleet = guard.snapshot().fleet
        return fleet is not None and fleet.connected and fleet.resyncs == resyncs

    def sync_call() -> int:
        with guard.sync_http_client() as client:
            return client.post(servers[0].url + "/v1/chat/completions", json=BODY).status_code

    async def app() -> list[int]:
        statuses = [await asyncio.to_thread(sync_call)]
        with anyio.fail_after(15):
            while not connected(1):  # noqa: ASYNC110
                await anyio.sleep(0.01)
        async with httpx.AsyncClient(transport=guard.transport) as client:
            statuses.append((await client.post(servers[0].url + "/v1/chat/completions", json=BODY)).status_code)
            with anyio.fail_after(15):
                while not connected(2):
                    await anyio.sleep(0.01)
                    await client.post(servers[0].url + "/v1/chat/completions", json=BODY)  # each call starts it
        return statuses

    [statuses] = run_in_turn(guard, app)
    assert statuses == [200, 200]


def test_closing_from_sync_code_while_the_fleets_loop_is_stopped_does_not_wait_for_it(
    redis_server: RedisServer, servers: list[LoopbackServer]
) -> None:
    """A loop kept for the process and run once per invocation (a serverless handler's): at shutdown, between its
    runs, ``guard.close()`` waited 5 s for the store's task on that loop, which cannot run, past the 0.5 s a
    serverless runtime gives after SIGTERM. It no longer waits: the connections are that loop's, closed when it runs
    again."""
    guard = Guard([servers[0].url], fleet=redis_server.url, name="kept")
    loop = asyncio.new_event_loop()

    async def invocation() -> int:
        async with httpx.AsyncClient(transport=guard.transport) as client:
            status = (await client.post(servers[0].url + "/v1/chat/completions", json=BODY)).status_code
        with anyio.fail_after(15):
            while not ((fleet := guard.snapshot().fleet) and fleet.connected):  # noqa: ASYNC110
                await anyio.sleep(0.01)
        return status

    try:
        assert loop.run_until_complete(invocation()) == 200
        started = time.monotonic()
        guard.close()
        assert time.monotonic() - started < 4.5  # the old wait was 5 s, always: a bound, not a timing
    finally:  # the loop runs again: the store's clean-up, cancelled by close(), ends there and closes its sockets
        loop.run_until_complete(asyncio.gather(*asyncio.all_tasks(loop), return_exceptions=True))
        loop.close()
