"""A Redis Cluster node killed under a connected Guard, on a private 3-master cluster: the heartbeat reaches every
primary, so the loss is noticed without waiting for a command to touch that node; while the cluster is down, each
failed reconnection closes every node it opened (no ``Unclosed ClusterNode object`` warning: the suite turns
resource warnings into errors)."""

from __future__ import annotations

import gc
import signal
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from llmguard_client import Guard, RateLimit
from llmguard_client._fleet.url import FleetURL
from tests.fleet.guards import store, until
from tests.loopback import LoopbackServer
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
    private_cluster: RedisCluster, node: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    clients: list[object] = []
    make = FleetURL.client

    def counted(self: FleetURL, **kwargs: float) -> Any:
        clients.append(made := make(self, **kwargs))
        return made

    monkeypatch.setattr(FleetURL, "client", counted)
    # No fleet budget, no rate limit and the flag read every 10 minutes: only the heartbeat asks the nodes.
    g = Guard(["http://127.0.0.1:9/r0"], fleet=private_cluster.url, name="x", hedge=None, rollout_poll_interval=600)
    s = store(g)
    s.heartbeat, s.backoff_initial, s.backoff_max = 0.05, 0.02, 0.05
    s.connect_timeout = 5.0  # three nodes' first connections on a busy machine
    try:
        await g.__aenter__()
        await until(lambda: s.available, seconds=60)  # behaviour, not speed: generous on a starved machine
        private_cluster.processes[node].send_signal(signal.SIGKILL)
        await until(lambda: bool(g.snapshot().fleet and g.snapshot().fleet.degraded), seconds=20)
        after_loss = len(clients)
        await until(lambda: len(clients) >= after_loss + 3, seconds=60)  # reconnections, each failing
        fleet = g.snapshot().fleet
        assert fleet is not None and fleet.degraded
    finally:
        await g.aclose()
    gc.collect()  # a node left connected warns when collected: an error in this suite


async def test_calls_go_on_while_a_cluster_node_dies(
    private_cluster: RedisCluster, servers: list[LoopbackServer]
) -> None:
    """The fleet fails open: a node killed while calls run fails none of them, though each attempt asks the
    cluster (a rate limit that never binds: one script call per attempt, on the node of its bucket's slot)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    limit = RateLimit(requests_per_minute=6_000_000, tokens_per_minute=6_000_000_000)
    g = Guard([servers[0].url], fleet=private_cluster.url, name="calls", hedge=None, rate_limit=limit)
    s = store(g)
    s.connect_timeout = 5.0  # three nodes' first connections on a busy machine
    statuses: list[int] = []

    async def calls(client: httpx.AsyncClient) -> None:
        for _ in range(40):
            async with client.stream("POST", servers[0].url + "/v1/chat/completions", json=body) as response:
                await response.aread()
                statuses.append(response.status_code)
            await anyio.sleep(0.02)

    async with g, g.http_client() as client:
        await until(lambda: s.available, seconds=60)
        async with anyio.create_task_group() as tg:
            tg.start_soon(calls, client)
            await anyio.sleep(0.2)
            private_cluster.processes[2].send_signal(signal.SIGKILL)
            await until(lambda: bool(g.snapshot().fleet and g.snapshot().fleet.degraded), seconds=20)
    assert statuses == [200] * 40
    gc.collect()
