"""The fleet tests' own fixtures: a real Redis Cluster and a TLS redis-server (`tests.redis_cluster`)."""

from __future__ import annotations

from tests.redis_cluster import _shared_cluster, _tls_files, redis_cluster, redis_tls

__all__ = ["_shared_cluster", "_tls_files", "redis_cluster", "redis_tls"]
