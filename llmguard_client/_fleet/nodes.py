"""What a Redis Cluster client needs beyond a plain one: a heartbeat that reaches every node, and a close that
closes every node whatever state the client is in.

redis-py's cluster client sends ``PING`` to its default node only, so a node lost elsewhere was noticed when a
command next touched it (the rollout flag's poll, seconds later). And its ``aclose`` does nothing for a client
whose initialization failed (a node down: the slots are not all covered), which leaves the startup node it
queried connected: an ``Unclosed ClusterNode object`` warning per reconnection attempt when it is collected.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["close_client", "ping"]


def _cluster_nodes(client: object) -> Any:
    """The client's `NodesManager` when it is a Redis Cluster client, else None."""
    from redis.asyncio.cluster import RedisCluster

    return client.nodes_manager if isinstance(client, RedisCluster) else None


async def ping(client: Redis) -> None:
    """``PING`` the server; on a Redis Cluster, every primary (any one failing raises)."""
    from redis.asyncio.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        await client.ping(target_nodes=RedisCluster.PRIMARIES)
    else:
        await client.ping()


async def close_client(client: Redis) -> None:
    """Close ``client`` and, for a cluster client, every node it knows, initialized or not."""
    manager = _cluster_nodes(client)
    if manager is None:
        await client.aclose()
        return
    with contextlib.suppress(Exception):  # it raises the first node's error and leaves the others connected
        await client.aclose()
    nodes = {id(n): n for attr in ("nodes_cache", "startup_nodes") for n in getattr(manager, attr, {}).values()}
    await asyncio.gather(*(node.disconnect() for node in nodes.values()), return_exceptions=True)  # each, whatever
