"""A password-protected redis-server: the right password (URL-encoded, as redis-py reads it) connects; a wrong
one fails open: calls are served, one warning for the whole outage, and the password shows nowhere (the
snapshot, its error, the logs)."""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable

import anyio
import pytest
import redis.asyncio as redis

from llmguard_client import Guard
from tests.loopback import LoopbackServer
from tests.redis_server import RedisServer

PASSWORD = "p@ss:w/rd%1"
"""Characters that must be percent-encoded in a URL's userinfo."""
BODY = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}


def url(server: RedisServer, password: str) -> str:
    return f"redis://:{urllib.parse.quote(password, safe='')}@127.0.0.1:{server.port}/0"


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    with anyio.fail_after(seconds):
        while not condition():  # noqa: ASYNC110 (polled state has no event)
            await anyio.sleep(0.01)


async def connections(server: RedisServer) -> int:
    """Connections the server has accepted so far (INFO stats), less this one."""
    admin = redis.Redis(host="127.0.0.1", port=server.port, password=PASSWORD)
    try:
        return int((await admin.info("stats"))["total_connections_received"]) - 1
    finally:
        await admin.aclose()


async def test_the_right_password_connects(redis_factory: type[RedisServer]) -> None:
    server = redis_factory(password=PASSWORD)
    server.start()
    guard = Guard(["http://127.0.0.1:9"], fleet=url(server, PASSWORD), name="checkout")
    async with guard:
        await until(lambda: bool(guard.snapshot().fleet and guard.snapshot().fleet.connected))
        fleet = guard.snapshot().fleet
    assert fleet is not None and fleet.url == f"redis://:***@127.0.0.1:{server.port}/0" and fleet.last_error is None


async def test_a_wrong_password_fails_open_with_one_warning_and_no_password_shown(
    redis_factory: type[RedisServer], servers: list[LoopbackServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "llmguard_client")
    server = redis_factory(password=PASSWORD)
    server.start()
    wrong = "wr0ng:pass@word"
    guard = Guard([servers[0].url], fleet=url(server, wrong), name="checkout", hedge=None)
    store = guard._fleet.store  # type: ignore[union-attr]
    store.backoff_initial, store.backoff_max = 0.01, 0.02
    async with guard, guard.http_client() as client:
        response = await client.post(servers[0].url + "/v1/chat/completions", json=BODY)
        assert response.status_code == 200  # the call never waited on the store
        await until(lambda: bool(guard.snapshot().fleet and guard.snapshot().fleet.degraded))
        start = await connections(server)
        with anyio.fail_after(10):
            while await connections(server) < start + 3:  # noqa: ASYNC110 (three more refused reconnections)
                await anyio.sleep(0.01)
        assert (await client.post(servers[0].url + "/v1/chat/completions", json=BODY)).status_code == 200
        fleet = guard.snapshot().fleet
    assert fleet is not None and fleet.url == f"redis://:***@127.0.0.1:{server.port}/0"
    assert fleet.last_error is not None and "AuthenticationError" in fleet.last_error, fleet.last_error
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "degraded" in warnings[0], warnings
    shown = [repr(guard.snapshot()), *(r.getMessage() for r in caplog.records)]
    for form in (wrong, urllib.parse.quote(wrong, safe=""), PASSWORD, urllib.parse.quote(PASSWORD, safe="")):
        assert all(form not in text for text in shown), form
