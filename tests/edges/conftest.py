"""Helpers for the edge tests: what a Guard leaves behind (threads, client sockets)."""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from llmguard_client import Guard, Replica, Tier
from tests.loopback import LoopbackServer

TIERS = {"interactive": Tier(ttft=2.0, total=10.0, stall=2.0)}
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
_OPEN_STATES = {"01", "08"}  # ESTABLISHED, CLOSE_WAIT: a socket some process still holds open


_SSL = ssl.create_default_context()


def pools(replica: Replica) -> httpx.AsyncBaseTransport:
    """The default per-replica pool, but with one shared SSL context: building one per replica costs
    0.3-1.7 s on this machine, most of a test's time."""
    return httpx.AsyncHTTPTransport(verify=_SSL, retries=0, limits=httpx.Limits(max_keepalive_connections=100))


def client_sockets(servers: list[LoopbackServer]) -> int:
    """Open client-side TCP connections to the servers (from /proc/net/tcp: remote port is a server's)."""
    ports = {server.port for server in servers}
    count = 0
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            remote_port = int(fields[2].split(":")[1], 16)
            if remote_port in ports and fields[3] in _OPEN_STATES:
                count += 1
    return count


def sync_threads() -> list[str]:
    """The names of live threads that serve a Guard's sync calls."""
    return [t.name for t in threading.enumerate() if t.name.startswith("llmguard-sync-")]


def eventually(predicate: Callable[[], bool], timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


async def aeventually(predicate: Callable[[], bool], timeout: float = 3.0) -> bool:
    """`eventually` for async tests: polls without blocking the event loop, which may still have to close what
    the test is waiting for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return predicate()


@pytest.fixture
def make_guard(servers: list[LoopbackServer]) -> Iterator[Callable[..., Guard]]:
    """Build Guards over the loopback servers; each is closed (from sync code) after the test."""
    built: list[Guard] = []

    def make(**kwargs: Any) -> Guard:
        kwargs.setdefault("tiers", TIERS)
        kwargs.setdefault("instrumentation", None)
        kwargs.setdefault("transport_factory", pools)
        guard = Guard([s.url for s in servers], **kwargs)
        built.append(guard)
        return guard

    yield make
    for guard in built:
        guard.close()


@pytest.fixture
async def amake_guard(servers: list[LoopbackServer]) -> AsyncIterator[Callable[..., Guard]]:
    """Build Guards for async tests; each is closed in the test's own event loop afterwards."""
    built: list[Guard] = []

    def make(**kwargs: Any) -> Guard:
        kwargs.setdefault("tiers", TIERS)
        kwargs.setdefault("instrumentation", None)
        kwargs.setdefault("transport_factory", pools)
        guard = Guard([s.url for s in servers], **kwargs)
        built.append(guard)
        return guard

    yield make
    for guard in built:
        await guard.aclose()
