"""Server hints, shared: one process of the fleet polls the replicas' ``/metrics``, and every process believes
what it read.

Without a fleet, each process running `llmguard_client.server_hints.poll_vllm_metrics` polls every replica
itself: N processes, N times the polls on each server. With ``fleet=``, the pollers of one replica set take turns
through a lease (``llmguard:{name}:hints:{set}:poller``, held for three polling intervals and renewed each round):
the holder polls and publishes what each replica reported on ``llmguard:{name}:hints:{set}``; the others poll
nothing and hand the published reports to their routers as if they had read them (stamped on their own clock when
they arrive). A holder that stops releases the lease, so another poller takes over at its next round; one that dies
holds it until it expires. While the store is unreachable, each process polls for itself. A report names the replica
(its URL without credentials) and two numbers; nothing about a user or a prompt is stored.

``{set}`` is `replica_set_digest` of the Guard's replicas (as for the rate limit's bucket): Guards of one
``name`` with other replicas (one service, one Guard per model) each have their own poller, as only a poller of
the same replicas reads what they would read.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal

from llmguard_client._fleet.store import FleetStore
from llmguard_client._ratelimit.buckets import replica_set_digest
from llmguard_client._routing.replicas import ReplicaSet

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["FleetHints", "Reading"]

logger = logging.getLogger("llmguard_client")

Reading = tuple[float | None, float | None]
"""What one replica's server reported: requests waiting, KV-cache use (0-1); None where it said nothing."""

_TAKE = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
"""Take the lease if it is free, or renew it if this process holds it. KEYS[1]: the lease; ARGV: the
process's id, the lease's time in ms."""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class FleetHints:
    """The lease of the fleet's poller, and the channel its reports reach the other processes on."""

    def __init__(self, store: FleetStore, replicas: ReplicaSet, clock: Callable[[], float]) -> None:
        self.store = store
        self.replicas = replicas
        self._by_name = {s.name: s for s in replicas.states}
        self._clock = clock
        replica_set = replica_set_digest(s.name for s in replicas.states)
        self.channel = store.channel("hints", replica_set)
        self.lease = store.key("hints", replica_set, "poller")
        self._last: tuple[bool, bool] | None = None
        """This process's poller's last round: whether it polled, whether the store was connected (None: no
        poller runs here)."""
        store.subscribe(store.key("hints", replica_set), self.receive)

    @property
    def role(self) -> Literal["polling", "following"] | None:
        """What this process's poller did in its last round (None: no poller runs here)."""
        return None if self._last is None else "polling" if self._last[0] else "following"

    async def lead(self, hold_for: float) -> bool:
        """Whether this process polls this round: it holds the lease (taken or renewed for ``hold_for`` s), or
        the store cannot say (not connected: each process polls for itself)."""
        ms = max(1, math.ceil(hold_for * 1000))

        async def take(client: Redis) -> bool:
            return bool(await client.eval(_TAKE, 1, self.lease, self.store.origin, str(ms)))

        connected = await self.store.first_connection()  # at a poller's start, the store may be connecting
        polls = await self.store.run(take, True) if connected else True
        if (polls, connected) != self._last:
            if not polls:
                how = "believes another process's polls of the servers' /metrics"
            elif connected:
                how = "polls the servers' /metrics for the fleet"
            else:
                how = f"polls the servers' /metrics on its own (the fleet store is {self.store.snapshot().state})"
            logger.info("llmguard fleet %r: this process %s", self.store.name, how)
        self._last = (polls, connected)
        return polls

    def publish(self, readings: Mapping[str, Reading], fresh_for: float) -> None:
        """Send what this round read (replicas without a report left out) to the other processes."""
        reported = {name: list(r) for name, r in readings.items() if r != (None, None)}
        if not reported or not self.store.available:
            return
        payload = json.dumps({"o": self.store.origin, "t": time.time(), "f": fresh_for, "r": reported})
        channel = self.channel

        async def write(client: Redis) -> None:
            await client.publish(channel, payload)

        self.store.submit(write)

    def release(self) -> None:
        """Give the lease up (if this process holds it), so that another process's poller takes over."""
        self._last = None
        lease, origin = self.lease, self.store.origin

        async def drop(client: Redis) -> None:
            await client.eval(_RELEASE, 1, lease, origin)

        self.store.submit(drop)

    def receive(self, data: bytes) -> None:
        """One report from the channel (the store's listener calls it): each replica's, to the router."""
        try:
            event = json.loads(data)
            origin, fresh_for, reported, sent = event["o"], float(event["f"]), event["r"], float(event["t"])
        except (ValueError, KeyError, TypeError):
            return
        if origin == self.store.origin or not isinstance(reported, dict) or not 0 < fresh_for < math.inf:
            return
        self.store.lag = max(0.0, time.time() - sent)
        now = self._clock()
        for name, reading in reported.items():
            state = self._by_name.get(name)
            if state is None or not isinstance(reading, list) or len(reading) != 2:
                continue
            waiting, kv_usage = (_gauge(v) for v in reading)
            self.replicas.router.server_load(state, now, waiting=waiting, kv_usage=kv_usage, fresh_for=fresh_for)


def _gauge(value: object) -> float | None:
    """A reported gauge: a finite number >= 0, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None
