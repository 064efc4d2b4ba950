"""Shared fixtures: three real loopback servers and a two-replica loopback cluster, reset before each test."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bytecode import precompile
from tests.leaks import no_leaks
from tests.loopback import LoopbackCluster, LoopbackServer, loopback_cluster, running
from tests.redis_server import _shared_redis, redis_factory, redis_server
from tests.scheduling import OneAtATime, rank

__all__ = ["_shared_redis", "no_leaks", "redis_factory", "redis_server"]


@pytest.fixture(scope="session")
def _servers() -> Iterator[list[LoopbackServer]]:
    with running([LoopbackServer(f"s{i}") for i in range(3)]) as servers:
        yield servers


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


def _logging_state() -> tuple[object, ...]:
    """What decides whether the library's warnings reach a handler: global disable, levels, filters, handlers."""
    library = logging.getLogger("llmguard_client")
    return (
        logging.root.manager.disable,
        logging.root.level,
        library.level,
        library.disabled,
        library.propagate,
        tuple(library.filters),
        tuple(library.handlers),
    )


@pytest.fixture
def refused_url() -> Iterator[Callable[[], str]]:
    """Makes loopback URLs that refuse connections for the whole test: each holds its port bound without listening,
    so that no other test's server is given it meanwhile (a port closed at once may be)."""
    held: list[socket.socket] = []

    def make() -> str:
        sock = socket.socket()
        held.append(sock)
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield make
    for sock in held:
        sock.close()


@pytest.fixture(autouse=True)
def logging_left_as_found() -> Iterator[None]:
    """A test that changes the logging configuration and leaves it changed fails here, not in whichever test
    later shares its worker and waits for a warning that no longer reaches anyone."""
    before = _logging_state()
    yield
    assert _logging_state() == before, "this test left the logging configuration changed"


ROOT = Path(__file__).resolve().parents[1]
CHECKOUT_PATH = os.pathsep.join([str(ROOT), str(ROOT / "tools")])
"""The checkout's runtime and tools (``tools/llmguard_tools``), as pytest's ``pythonpath`` puts them first in the
test processes: the Python subprocesses the tests start (the CLI, the simulated clusters, Locust, the fleet's
processes) import them from here too, not from whatever is installed."""


def pytest_configure(config: pytest.Config) -> None:
    """The checkout first on every subprocess's path; the package's bytecode, once, before any xdist worker or test
    subprocess imports it (tests/bytecode.py)."""
    inherited = os.environ.get("PYTHONPATH", "")
    if not inherited.startswith(CHECKOUT_PATH):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (CHECKOUT_PATH, inherited) if p)
    if not hasattr(config, "workerinput"):  # the controller (or a serial run), before it starts the workers
        precompile()


WORKERS_PER_CORE = 2
"""The tests wait on sockets and timers about half their time: one worker per core leaves the cores half idle."""
MAX_WORKERS = 8
"""Past this, each worker's fixed cost (its loopback servers, its redis-server, collecting every module) outweighs
what one more worker adds."""


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject.toml): two workers per usable core, at most `MAX_WORKERS`."""
    return min(MAX_WORKERS, WORKERS_PER_CORE * usable_cores())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first (tests/scheduling.py); the rest keep their order."""
    items.sort(key=lambda item: rank(item.nodeid))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> OneAtATime | None:
    """``--dist load`` (pyproject.toml) deals the tests one at a time (tests/scheduling.py)."""
    return OneAtATime(config, log) if config.getvalue("dist") == "load" else None
