"""The retry budget, fleet-wide (``BudgetPolicy(scope="fleet")``): every process counts alone, a sync shares.

Calls never wait on Redis. Each process's `RetryBudget` counts its logical calls and extra attempts (retries,
hedges) locally as always. Every ``interval`` seconds (0.2 by default) one pipelined round trip, run by the
store's background task (`FleetStore.every`), adds what this process counted since the last sync to the
fleet's time-bucketed counters and reads the fleet's totals of the window back:

- one hash per budget and bucket of ``window / BUCKETS_PER_WINDOW`` seconds of the Redis server's time (this
  process's monotonic clock plus the offset from the server's ``TIME`` that the last sync measured, `ServerClock`),
  ``llmguard:{name}:budget:{{name}}:{budget}:{bucket}`` with the fields ``c`` (calls) and ``x`` (extra
  attempts), ``HINCRBY`` + ``PEXPIRE`` (two windows). The ``{name}`` hash tag keeps every budget key of a
  fleet in one Redis Cluster slot, so the pipeline goes to one node.
- the totals are counted like the local window, conservatively: calls from the buckets wholly inside the
  window, extra attempts from every bucket that overlaps it.

Between two syncs a budget decides on the fleet's totals as last read plus its own unsynced counts
(`FleetShare.totals`), spending only its share of the headroom it read: divided by the processes that synced
lately (a sorted set ``...:{name}:processes`` of their ids, scored by the server's ``TIME`` at their last sync and
pruned on it too, in the same round trip: `members.SCRIPT`), or, below one attempt
each, one attempt to each of the first processes by id while they last. While the store is not connected it
decides on its own window, exactly as a ``scope="process"`` budget. A process that was cut off for more than a
window drops what it counted meanwhile instead of adding it to the current bucket. The keys hold counts and
opaque process ids: nothing about a call, user or prompt.
No comparison across hosts uses their wall clocks: membership is on the server's clock, buckets on each host's
estimate of it (off by at most half a round trip), and a share's age and staleness on the process's monotonic clock
(the Guard's) only. A step of a host's wall clock moves none of them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from llmguard_client._budget.budget import BUCKETS_PER_WINDOW, FleetBudgetSnapshot, RetryBudget
from llmguard_client._budget.members import SCRIPT, SCRIPT_SHA, ServerClock, is_noscript, parse
from llmguard_client._fleet.store import FleetStore

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.client import Pipeline

__all__ = ["FleetBudgetSync", "FleetShare"]

SYNC_INTERVAL = 0.2
"""Seconds between two syncs: each is one pipelined round trip for all of a Guard's fleet-scoped budgets."""


def _count(value: object) -> int:
    try:
        return int(value) if isinstance(value, (bytes, str, int)) else 0
    except ValueError:
        return 0


class FleetShare:
    """One budget's link to the fleet: what it sent so far, and the totals it read last."""

    __slots__ = (
        "budget",
        "clock",
        "extras",
        "granularity",
        "prefix",
        "processes",
        "rank",
        "read_at",
        "requests",
        "sent",
        "store",
        "syncs",
    )

    def __init__(self, budget: RetryBudget, store: FleetStore, label: str, clock: Callable[[], float]) -> None:
        self.budget = budget
        self.store = store
        self.clock = clock
        """The monotonic clock (the Guard's) that `read_at` is on."""
        self.prefix = store.key("budget", "{" + store.name + "}", label) + ":"
        self.granularity = budget.window / BUCKETS_PER_WINDOW
        self.sent = (budget.requests, budget.spent)
        """The budget's lifetime (requests, extras) already added to the fleet's counters."""
        self.requests = self.extras = 0
        self.processes = 1
        """Processes of the fleet that synced a budget lately (this one included), as last read."""
        self.rank = 0
        """This process's place among them, by id."""
        self.read_at: float | None = None
        self.syncs = 0
        budget.share(self)

    # --- read by the budget on every decision (the hot path: no I/O) ------------------------

    def totals(self) -> tuple[float, float] | None:
        if self.read_at is None or not self.store.available:
            return None
        budget, (sent_requests, sent_extras) = self.budget, self.sent
        requests, extras = self.requests, self.extras
        headroom = budget.ratio * requests + budget.floor - extras  # what the fleet had left at the read
        if headroom >= self.processes:
            share = headroom / self.processes
        else:  # less than one each: one to each of the first processes (by id) while they last
            share = 1.0 if self.rank < math.floor(headroom) else 0.0
        held = max(0.0, headroom - share)  # the other processes' shares: spent as extras here
        return requests + budget.requests - sent_requests, extras + held + budget.spent - sent_extras

    def view(self) -> FleetBudgetSnapshot:
        age = None if self.read_at is None else max(0.0, self.clock() - self.read_at)
        return FleetBudgetSnapshot(
            in_force=self.read_at is not None and self.store.available,
            window_requests=self.requests,
            window_extras=self.extras,
            age=age,
            syncs=self.syncs,
            processes=self.processes,
        )

    # --- the sync, in the store's background task ------------------------------------------

    def queue(self, pipe: Pipeline, now: float, server: float) -> int:
        """Add this process's counts since the last sync to ``pipe`` and the reads of the window; return the
        number of replies the adds take. ``now``: the monotonic clock's reading; ``server``: the server's time, as
        estimated here (the buckets' clock, shared by the fleet)."""
        budget = self.budget
        current = (budget.requests, budget.spent)
        calls, extras = current[0] - self.sent[0], current[1] - self.sent[1]
        stale = self.read_at is not None and now - self.read_at > budget.window  # cut off for over a window
        self.sent = current  # taken: a failed round trip loses them rather than counting them twice
        bucket = math.floor(server / self.granularity)
        added = 0
        if (calls or extras) and not stale:
            key = self.prefix + str(bucket)
            pipe.hincrby(key, "c", calls)
            pipe.hincrby(key, "x", extras)
            pipe.pexpire(key, math.ceil(2 * budget.window * 1000))
            added = 3
        for b in range(bucket - BUCKETS_PER_WINDOW, bucket + 1):
            pipe.hmget(self.prefix + str(b), ["c", "x"])
        return added

    def read(self, replies: Sequence[object], now: float, processes: int, rank: int) -> None:
        """Take the window's totals from the replies of the reads `queue` added (oldest bucket first)."""
        requests = extras = 0
        for i, reply in enumerate(replies):
            c, x = reply if isinstance(reply, (list, tuple)) and len(reply) == 2 else (None, None)
            extras += _count(x)
            if i > 0:  # the oldest bucket may have started before the window: its calls are not credited
                requests += _count(c)
        # Counted since `queue` ran are still unsynced: `totals` adds them on top of these.
        self.requests, self.extras = max(0, requests), max(0, extras)
        self.processes, self.rank = max(1, processes), rank
        self.read_at = now
        self.syncs += 1


class FleetBudgetSync:
    """Syncs a Guard's fleet-scoped budgets (see the module docstring), every ``interval`` seconds."""

    def __init__(
        self,
        store: FleetStore,
        *,
        clock: Callable[[], float] = time.monotonic,
        interval: float = SYNC_INTERVAL,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: the Guard's monotonic clock; ``wall``: the host's wall clock, the guess of the server's time
        before the first sync has measured it."""
        self.store = store
        self.shares: list[FleetShare] = []
        self.clock = clock
        self.interval = interval
        self.members = store.key("budget", "{" + store.name + "}", "processes")
        """A sorted set: each process's id, scored with the server's time of its last sync."""
        self.server = ServerClock(wall)
        store.every(interval, self.sync)

    def add(self, budget: RetryBudget, label: str) -> FleetShare:
        """Share ``budget`` with the fleet under ``label`` (the Guard's budget, or a tier's)."""
        share = FleetShare(budget, self.store, label, self.clock)
        self.shares.append(share)
        return share

    async def sync(self, client: Redis) -> None:
        """One round trip: add every budget's counts since the last sync, read the fleet's totals back."""
        now = self.clock()
        server = self.server.at(now)
        pipe = client.pipeline(transaction=False)
        gone = max(1.0, 5 * self.interval)
        args = (self.store.origin, repr(gone), str(math.ceil(gone * 1000)))
        pipe.evalsha(SCRIPT_SHA, 1, self.members, *args)
        spans = []
        for share in self.shares:
            added = share.queue(pipe, now, server)
            spans.append((added, added + BUCKETS_PER_WINDOW + 1))
        replies = await pipe.execute(raise_on_error=False)
        received = self.clock()
        first = replies[0]
        for reply in replies[1:] if is_noscript(first) else replies:
            if isinstance(reply, Exception):
                raise reply
        if is_noscript(first):  # Redis lacks the script (first use, a restart): once more, by its text
            first = await client.eval(SCRIPT, 1, self.members, *args)
            received = self.clock()
        parsed = parse(first)
        ids = [self.store.origin]
        if parsed is not None:
            self.server.measured(parsed[0], now, received)
            ids = parsed[1] if self.store.origin in parsed[1] else sorted([*parsed[1], self.store.origin])
        rank = ids.index(self.store.origin)
        offset = 1
        for share, (start, end) in zip(self.shares, spans, strict=True):
            share.read(replies[offset + start : offset + end], now, len(ids), rank)
            offset += end
