from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.loopback import LoopbackCluster, loopback_cluster


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
