"""Shared fixtures: three real loopback servers and a two-replica loopback cluster, reset before each test."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.leaks import no_leaks
from tests.loopback import LoopbackCluster, LoopbackServer, loopback_cluster, stop_all

__all__ = ["no_leaks"]

THIRD_PARTY_NOT_REWRITTEN = ("hypothesis",)
"""Packages pytest would assertion-rewrite only because they ship a pytest plugin. Rewriting all of
hypothesis costs ~1.2 s of CPU in every process that imports it (nothing caches the result when
bytecode writing is off), including the xdist controller, whose hypothesis plugin imports it for the
terminal summary after the last test; its own asserts need no introspection."""


def _skip_third_party_rewrite() -> None:
    # pytest has no public switch for this: drop the names from its import hook's set (a no-op if a
    # pytest version keeps it elsewhere, or with --assert=plain).
    for finder in sys.meta_path:
        marked = getattr(finder, "_must_rewrite", None)
        if isinstance(marked, set) and "hypothesis" not in sys.modules:
            marked.difference_update(THIRD_PARTY_NOT_REWRITTEN)
            getattr(finder, "_marked_for_rewrite_cache", {}).clear()


_skip_third_party_rewrite()


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


@pytest.fixture(scope="session")
def _cluster() -> Iterator[LoopbackCluster]:
    with loopback_cluster(2) as c:
        yield c


@pytest.fixture
def cluster(_cluster: LoopbackCluster) -> Iterator[LoopbackCluster]:
    """Two loopback replicas streaming ``max_tokens`` chunks, counters and scripts reset for each test."""
    _cluster.reset()
    yield _cluster
    _cluster.reset()


FIRST = ("tests/test_stress.py",)
"""Modules of the longest tests (4-6 s each): run first, so that xdist does not deal one of them last
and leave the other worker idle while it runs."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in FIRST)  # stable: the rest keep their order
