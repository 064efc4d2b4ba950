"""A Redis Cluster node killed under a connected Guard, on a private 3-master cluster: the heartbeat reaches every
primary, so the loss is noticed without waiting for a command to touch that node; while the cluster is down, each
failed reconnection closes every node it opened (no ``Unclosed ClusterNode object`` warning: the suite turns
resource warnings into errors)."""

from __future__ import annotations

import gc
import signal
from collections.abc import Iterator

import anyio
import pytest

from llmguard_client import Guard
from tests.fleet.guards import connected, store, until
from tests.redis_cluster import RedisCluster, _require_cluster_tools


@pytest.fixture
def private_cluster() -> Iterator[RedisCluster]:
    _require_cluster_tools()
    cluster = RedisCluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.parametrize("node", [0, 2], ids=["the_url_node", "another_node"])
async def test_a_killed_node_is_noticed_by_the_heartbeat_and_reconnections_leave_nothing_open(
    private_cluster: RedisCluster, node: int
) -> None:
    # No fleet budget, no rate limit and the flag read once a minute: only the heartbeat asks the nodes.
    g = Guard(["http://127.0.0.1:9/r0"], fleet=private_cluster.url, name="x", hedge=None, rollout_poll_interval=60)
    s = store(g)
    s.heartbeat, s.backoff_initial, s.backoff_max = 0.05, 0.02, 0.05
    s.connect_timeout = 5.0  # three nodes' first connections on a busy machine
    try:
        await connected(g)
        await anyio.sleep(0.2)
        before = g.snapshot().fleet
        assert before is not None and before.state == "connected"
        private_cluster.processes[node].send_signal(signal.SIGKILL)
        await until(lambda: bool(g.snapshot().fleet and g.snapshot().fleet.degraded))
        attempts = s.transitions
        await anyio.sleep(0.5)  # reconnection attempts against a cluster with a node down: each one fails
        fleet = g.snapshot().fleet
        assert fleet is not None and fleet.degraded and fleet.transitions >= attempts
    finally:
        await g.aclose()
    gc.collect()  # a node left connected warns when collected: an error in this suite
