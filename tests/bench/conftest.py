from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.bench.fakeserver import FakeCluster, fake_cluster


@pytest.fixture(scope="session")
def _cluster() -> Iterator[FakeCluster]:
    with fake_cluster(2) as c:
        yield c


@pytest.fixture
def cluster(_cluster: FakeCluster) -> Iterator[FakeCluster]:
    """Two loopback replicas, counters and behaviour reset for each test."""
    _cluster.reset()
    yield _cluster
    _cluster.reset()
