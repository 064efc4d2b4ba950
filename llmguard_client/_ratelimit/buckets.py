"""Provider rate limits as token-level admission: a token bucket per limit, local or fleet-wide.

A provider limits requests and tokens per minute per API key, across every caller. `RateLimiter` keeps
one bucket per limit (the Guard's `RateLimit`, or a replica's own): each dimension (requests, tokens)
refills at ``limit / 60`` per second up to ``limit x burst / 60``. An attempt is charged before it is
sent (1 request; its prompt estimate + ``max_tokens`` tokens) and the charge is corrected afterwards
from the ``usage`` the answer reports; ``x-ratelimit-remaining-*`` headers lower a bucket to what the
provider says is left.

An attempt that does not fit is either admitted with a wait (its tokens are reserved now, the level goes
negative, and the attempt is sent when the refill has covered it: later callers queue behind it, so
the wait is fair and needs no second look at the bucket) when that wait is at most ``max_wait``, or
refused with ``retry_after = missing tokens / refill rate``, charging nothing. A charge larger than the
bucket's capacity fits once the bucket is full.

Fleet-wide: with a `FleetOps` store every admission is one Lua script (`llmguard_client._ratelimit.lua`) on
the store's Redis, one round trip per attempt. Room given back (corrections, refunds) is also written in the
background by the store's writer, one write queued at a time per bucket, so the shared bucket does not look emptier
than it is to every process until this one's next admission; header recalibrations and the charges of attempts
admitted locally while the store could not decide ride on the next admission's script call. Time is the Redis
server's (``TIME``), so the hosts' clocks need not agree. When the store fails (its ``run`` returns the default) or
is unavailable, the process's own bucket decides (fail open); it is charged alongside the fleet's so it has a
history. That bucket holds this process's share of the limit, not the whole of it: the script counts the fleet's
admissions, and the share is this process's admissions over the fleet's across its last `SHARE_WINDOW` admissions
(the whole limit until it has seen `SHARE_MIN_SAMPLES`). A fleet whose store fails therefore keeps, in sum, about
the provider's limit instead of each process admitting the whole of it. The first rate-limited admission of a store
still connecting waits for that connection, at most the store's operation timeout (`FleetOps`).

Why not the ``limits`` library: it counts hits of a fixed cost in windows (moving-window storage keeps a
timestamp per unit of cost: one per token here), with no reservation that makes a caller wait its turn,
no computed retry-after from a refill rate, and no way to correct a charge after the call.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from llmguard_client._ratelimit.lua import load_script, run_script, script_args
from llmguard_client.config import RateLimit, Replica
from llmguard_client.errors import GuardConfigError

__all__ = [
    "FleetOps",
    "Grant",
    "LocalBucket",
    "RateLimiter",
    "build_rate_limiter",
    "limit_digest",
    "replica_set_digest",
]

T = TypeVar("T")

SHARE_WINDOW = 32
"""This process's share of the fleet's admissions is measured over its last this many admissions."""
SHARE_MIN_SAMPLES = 8
"""Admissions seen before the share is trusted (until then the local bucket holds the whole limit)."""


class FleetOps(Protocol):
    """What the rate limiter needs of a fleet store (``llmguard_client._fleet``)."""

    def key(self, *parts: str) -> str:
        """A namespaced Redis key for ``parts``."""
        ...

    @property
    def available(self) -> bool:
        """False while the store is known to be down (the limiter then uses the local bucket at once)."""
        ...

    async def run(self, op: Callable[[Any], Awaitable[T]], default: T) -> T:
        """``op(redis_client)`` under the store's small timeout; ``default`` on any failure, never raises."""
        ...


class _Connecting(Protocol):
    """Optional on a `FleetOps` (the Guard's `FleetStore` has it): wait for a first connection in progress."""

    async def first_connection(self) -> bool:
        """True once connected; waits at most the store's operation timeout, and only for a first connection."""
        ...


@dataclass(frozen=True, slots=True)
class Grant:
    """An admission decision: admitted after ``wait`` seconds, or refused (``retry_after`` set)."""

    wait: float = 0.0
    retry_after: float | None = None

    @property
    def admitted(self) -> bool:
        return self.retry_after is None


class _Dimension:
    """One limit (requests or tokens): its capacity, refill rate per second and current level."""

    __slots__ = ("burst", "capacity", "full_rate", "level", "rate")

    def __init__(self, per_minute: float | None, burst: float) -> None:
        self.full_rate = self.rate = per_minute / 60.0 if per_minute is not None else 0.0
        self.burst = burst
        self.capacity = self.rate * burst
        self.level = self.capacity

    def scale(self, share: float) -> None:
        """Hold ``share`` of the limit: the rate and capacity scaled, the level kept within the capacity."""
        self.rate = self.full_rate * share
        self.capacity = self.rate * self.burst
        self.level = min(self.level, self.capacity)

    def wait_for(self, cost: float) -> float:
        """Seconds until ``cost`` fits (0 now); an unlimited dimension never waits."""
        if self.rate == 0.0:
            return 0.0
        return max(0.0, (min(cost, self.capacity) - self.level) / self.rate)


class LocalBucket:
    """A process's bucket for one `RateLimit`: exact refill on ``clock``, nothing shared."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float]) -> None:
        self.limit = limit
        self._clock = clock
        self._requests = _Dimension(limit.requests_per_minute, limit.burst)
        self._tokens = _Dimension(limit.tokens_per_minute, limit.burst)
        self._last = -math.inf

    def levels(self) -> tuple[float, float]:
        """``(requests, tokens)`` in the bucket now (negative: reserved ahead of the refill)."""
        self._refill()
        return self._requests.level, self._tokens.level

    def take(self, tokens: float, max_wait: float) -> Grant:
        """Charge one request and ``tokens`` if they fit within ``max_wait`` seconds; else refuse, charging nothing."""
        self._refill()
        wait = max(self._requests.wait_for(1.0), self._tokens.wait_for(tokens))
        if wait > max_wait:
            return Grant(retry_after=wait)
        self._requests.level -= 1.0
        self._tokens.level -= tokens
        return Grant(wait=wait)

    def adjust(self, requests: float, tokens: float) -> None:
        """Add (a refund, a correction downwards) or remove (an undercharge) room; never above capacity."""
        self._refill()
        for dim, delta in ((self._requests, requests), (self._tokens, tokens)):
            dim.level = min(dim.capacity, dim.level + delta)

    def scale(self, share: float) -> None:
        """Hold ``share`` (0 < share <= 1) of the limit from now on: this process's part of a fleet's."""
        self._refill()
        for dim in (self._requests, self._tokens):
            dim.scale(share)

    def cap(self, requests: int | None, tokens: int | None) -> None:
        """The provider says only this much is left: lower the levels to it (never raise them)."""
        self._refill()
        for dim, room in ((self._requests, requests), (self._tokens, tokens)):
            if room is not None and dim.rate > 0.0:
                dim.level = min(dim.level, float(room))

    def _refill(self) -> None:
        now = self._clock()
        if self._last == -math.inf:
            self._last = now
        elapsed = now - self._last
        self._last = now  # a clock that went back refills nothing, and the refill goes on from its new reading
        if elapsed <= 0.0:
            return
        for dim in (self._requests, self._tokens):
            dim.level = min(dim.capacity, dim.level + elapsed * dim.rate)


class _Scope:
    """One limit's buckets: the local one, and the fleet's key with what is waiting to be sent there."""

    __slots__ = ("admissions", "fleet_key", "flushing", "local", "pending", "room")

    def __init__(self, local: LocalBucket, fleet_key: str | None) -> None:
        self.local = local
        self.fleet_key = fleet_key
        self.admissions: deque[float] = deque(maxlen=SHARE_WINDOW)
        """The fleet's admission count after each of this process's last admissions."""
        self.pending = [0.0, 0.0]
        """Requests and tokens to add to the fleet's bucket with the next admission (refunds, corrections)."""
        self.room: list[int | None] = [None, None]
        """The lowest room the provider reported since the last admission."""
        self.flushing = False
        """A background write of returned room (`RateLimiter._return_soon`) is queued."""

    def admitted(self, count: float) -> None:
        """The fleet admitted this process's attempt as its ``count``-th: rescale the local bucket to the share.
        Concurrent admissions' replies may come out of order: each count takes its place in the window, which
        keeps the highest; a count below all of it, and below half the highest, is a restarted (emptied) store
        counting from 0 again."""
        seen = self.admissions
        if seen and count < seen[0] and count < seen[-1] / 2:
            seen.clear()
        if len(seen) == seen.maxlen:
            seen.popleft()
        seen.insert(bisect.bisect(seen, count), count)
        span = seen[-1] - seen[0]
        if len(seen) >= SHARE_MIN_SAMPLES and span > 0:
            self.local.scale(min(1.0, (len(seen) - 1) / span))


class RateLimiter:
    """The Guard's rate limits: one bucket per `RateLimit` (the Guard's, and each replica's own)."""

    def __init__(
        self,
        guard_limit: RateLimit | None,
        replica_limits: Mapping[str, RateLimit],
        clock: Callable[[], float],
        fleet: FleetOps | None = None,
        replica_names: Iterable[str] = (),
    ) -> None:
        """``replica_names``: the Guard's replicas (their URLs without credentials), which name the fleet's bucket
        of ``guard_limit`` with the limit itself (`fleet_key`)."""
        self._fleet = fleet
        self._clock = clock
        on_connect = getattr(fleet, "on_connect", None)
        if on_connect is not None:  # the Guard's FleetStore: cache the script before any call needs it
            on_connect(load_script)

        def scope(limit: RateLimit, *names: str) -> _Scope:
            key = fleet.key("ratelimit", *names, limit_digest(limit)) if fleet is not None else None
            return _Scope(LocalBucket(limit, clock), key)

        replica_set = replica_set_digest(replica_names)
        self._guard = scope(guard_limit, "guard", replica_set) if guard_limit is not None else None
        self._replicas = {name: scope(limit, "replica", name) for name, limit in replica_limits.items()}

    def fleet_key(self, replica: str) -> str | None:
        """The fleet's bucket that ``replica``'s attempts are charged to (None without a fleet)."""
        return self._scope(replica).fleet_key

    def applies(self, replica: str) -> bool:
        """Whether attempts to ``replica`` are rate limited."""
        return replica in self._replicas or self._guard is not None

    def bucket(self, replica: str) -> LocalBucket:
        """The local bucket that ``replica``'s attempts are charged to."""
        return self._scope(replica).local

    async def admit(self, replica: str, tokens: float, max_wait: float) -> Grant:
        """Charge one attempt to ``replica`` (1 request, ``tokens``): at most one round trip to the fleet."""
        scope = self._scope(replica)
        fleet = self._fleet
        if fleet is None or scope.fleet_key is None:
            return scope.local.take(tokens, max_wait)
        if not await _connected(fleet):
            return self._take_locally(scope, tokens, max_wait)
        pending, room = scope.pending, scope.room
        scope.pending, scope.room = [0.0, 0.0], [None, None]
        limit = scope.local.limit
        args = script_args(limit, tokens, max_wait, pending, room)
        key = scope.fleet_key

        async def op(redis: Any) -> tuple[bool, float, float] | None:
            reply = await run_script(redis, key, args)
            return bool(int(reply[0])), float(reply[1]), float(reply[2])

        sent = self._clock()
        decided = await fleet.run(op, None)
        if decided is None:
            # The store failed or did not answer in time: the local bucket decides. Whether the script ran is
            # unknown (a reply too late for a starved event loop, or never sent), so the conservative side is
            # taken: charges go again with the next admission, refunds do not, and this attempt is owed too.
            scope.pending = [now + min(0.0, before) for now, before in zip(scope.pending, pending, strict=True)]
            scope.room = [_lower(a, b) for a, b in zip(scope.room, room, strict=True)]
            return self._take_locally(scope, tokens, max_wait)
        admitted, wait, count = decided
        if not admitted:
            return Grant(retry_after=wait)
        scope.admitted(count)
        scope.local.adjust(-1.0, -tokens)  # the local history, for when the store fails
        # The wait runs from the script's instant, about halfway through the round trip: what is left of it.
        return Grant(wait=max(0.0, wait - (self._clock() - sent) / 2))

    @staticmethod
    def _take_locally(scope: _Scope, tokens: float, max_wait: float) -> Grant:
        """The fleet cannot decide: this process's share decides, and what it admits is charged to the fleet's
        bucket with the next admission there (so the fleet makes up for it once the store is back)."""
        grant = scope.local.take(tokens, max_wait)
        if grant.admitted:
            scope.pending[0] -= 1.0
            scope.pending[1] -= tokens
        return grant

    def refund(self, replica: str, tokens: float) -> None:
        """An admitted attempt was never sent (cancelled while it waited): give its charge back."""
        self._adjust(self._scope(replica), 1.0, tokens)

    def correct(self, replica: str, charged: float, used: float) -> None:
        """The answer reported ``used`` tokens for a charge of ``charged``: settle the difference."""
        self._adjust(self._scope(replica), 0.0, charged - used)

    def observe(self, replica: str, requests: int | None, tokens: int | None) -> None:
        """The provider reported this much room left (``x-ratelimit-remaining-*``)."""
        if requests is None and tokens is None:
            return
        scope = self._scope(replica)
        scope.local.cap(requests, tokens)
        if scope.fleet_key is not None:
            scope.room = [_lower(scope.room[0], requests), _lower(scope.room[1], tokens)]

    def _adjust(self, scope: _Scope, requests: float, tokens: float) -> None:
        scope.local.adjust(requests, tokens)
        if scope.fleet_key is not None:
            scope.pending[0] += requests
            scope.pending[1] += tokens
            self._return_soon(scope)

    def _return_soon(self, scope: _Scope) -> None:
        """Give room back to the fleet's bucket in the background (one write queued at a time per bucket), not
        only with this process's next admission: a charge is an over-estimate until the answer's usage corrects
        it, and while corrections wait, every process of the fleet sees the shared bucket emptier than it is.
        Only room given back goes this way; what this process owes the fleet (admitted alone while the store
        was down) stays for its next admission, which settles it on the conservative side."""
        submit = getattr(self._fleet, "submit", None)
        if submit is None or scope.flushing or not cast("FleetOps", self._fleet).available:
            return
        scope.flushing = True
        key = scope.fleet_key

        async def give_back(redis: Any) -> None:
            scope.flushing = False
            pending = scope.pending
            if min(pending) < 0.0 or max(pending) <= 0.0:
                return
            scope.pending = [0.0, 0.0]
            args = script_args(scope.local.limit, 0.0, -1.0, pending, [None, None])  # -1: never admits
            await run_script(redis, key, args)

        submit(give_back)

    def _scope(self, replica: str) -> _Scope:
        scope = self._replicas.get(replica, self._guard)
        assert scope is not None, "applies(replica) is checked first"
        return scope


async def _connected(fleet: FleetOps) -> bool:
    """Whether the fleet decides now; a first connection in progress is awaited (bounded by the store)."""
    if fleet.available:
        return True
    first = getattr(fleet, "first_connection", None)
    return first is not None and await cast(_Connecting, fleet).first_connection()


def _lower(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def build_rate_limiter(
    rate_limit: RateLimit | None, replicas: Sequence[Replica], clock: Callable[[], float], fleet: FleetOps | None
) -> RateLimiter | None:
    """``Guard(rate_limit=..., fleet=...)`` checked: the limiter, or None when neither the Guard nor a replica
    has a `RateLimit`."""
    if rate_limit is not None and not isinstance(rate_limit, RateLimit):
        raise GuardConfigError(
            f"rate_limit must be a RateLimit (e.g. RateLimit(requests_per_minute=500, tokens_per_minute=200_000)) "
            f"or None, got {rate_limit!r}"
        )
    own = {replica.name: replica.rate_limit for replica in replicas if replica.rate_limit is not None}
    if rate_limit is None and not own:
        return None
    return RateLimiter(rate_limit, own, clock, fleet, [replica.name for replica in replicas])


def limit_digest(limit: RateLimit) -> str:
    """12 hex digits naming a `RateLimit`'s numbers: the same in every process given the same limit."""
    numbers = (limit.requests_per_minute, limit.tokens_per_minute, limit.burst)
    text = json.dumps([None if n is None else float(n) for n in numbers])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def replica_set_digest(names: Iterable[str]) -> str:
    """12 hex digits naming a set of replicas (their URLs without credentials), whatever their order (the same
    digest as the fleet's server hints use)."""
    joined = "\n".join(sorted(set(names)))
    return hashlib.sha256(joined.encode()).hexdigest()[:12]
