"""Shared fixtures: three real loopback servers, reset before each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.leaks import no_leaks
from tests.loopback import LoopbackServer, stop_all

__all__ = ["no_leaks"]


@pytest.fixture(scope="session")
def _servers() -> Iterator[list[LoopbackServer]]:
    servers = [LoopbackServer(f"s{i}") for i in range(3)]
    for server in servers:
        server.start()
    yield servers
    stop_all(servers)


@pytest.fixture
def servers(_servers: list[LoopbackServer]) -> list[LoopbackServer]:
    for server in _servers:
        server.reset()
    return _servers
