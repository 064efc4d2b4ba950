"""What the router knows about one replica, and the small pure rules it reads that knowledge with."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "KV_FULL",
    "RECENT_HALF_LIFE",
    "REJECTIONS",
    "ReplicaHealth",
    "Routable",
    "ms",
    "no_room",
    "recent_calls",
    "sent",
    "server_kv_usage",
    "server_waiting",
    "silent",
    "worse",
]

KV_FULL = 0.95
"""KV-cache use (0-1) from which a server's report ranks its replica with those that have no room."""
RECENT_HALF_LIFE = 30.0
"""Seconds over which `ReplicaHealth.recent` (attempts sent to a replica) fades by half."""
REJECTIONS = frozenset({401, 403, 404})
"""The statuses by which a replica rejects a generation call (`ReplicaHealth.rejection`): a server without the model
(a rollout renaming it), an ingress whose pod is gone, a replica with a wrong key; or the caller's own fault."""


@dataclass(slots=True)
class ReplicaHealth:
    """The router's view of one replica (read it; the router writes it)."""

    ttft: float | None = None
    """Estimated seconds to the first content token (None: no call reached one yet)."""
    tpot: float | None = None
    """Estimated seconds per output token after the first (None: no stream finished yet)."""
    ttft_first: list[float] = field(default_factory=list)
    """The first TTFT samples, up to `llmguard_client._routing.router.Router.MIN_SAMPLES`: until there are
    that many, ``ttft`` is their lower median and speed drains nothing. An attempt that lost a race (or that a
    first-token deadline ended) before its first token, after longer than the median replica's TTFT, adds the
    time it waited (a lower bound)."""
    tpot_first: list[float] = field(default_factory=list)
    """The same for ``tpot``."""
    failure: float = 0.0
    """Failure rate at ``failure_at`` (it fades from then on); a failure after the first token counts
    `llmguard_client._routing.router.Router.MID_STREAM_WEIGHT` times."""
    failure_at: float = 0.0
    rejection: float = 0.0
    """Rate of generation calls answered with one of `REJECTIONS` at ``rejection_at`` (it fades from then on, as
    ``failure`` does), decayed by the replica's successes; a rejection counts
    `llmguard_client._routing.router.Router.MID_STREAM_WEIGHT` times (the caller gets it: it is not retried, but for
    a drained replica's probe)."""
    rejection_at: float = 0.0
    rejected_status: int = 0
    """The status of the last rejection (0: none yet)."""
    rejected_in_a_row: int = 0
    """Rejections since the replica last served a call (a first token, or a whole answer)."""
    drained: bool = False
    drained_at: float = -math.inf
    probes: int = 0
    """Probes sent here since it was drained: the wait before the next one doubles with each."""
    last_pick: float = -math.inf
    """When an attempt was last sent here."""
    last_first: float = -math.inf
    """When a first attempt or a retry was last sent here (a hedge is not counted): a drained replica's next probe
    waits from it. A hedge that loses its race before its request is even written tells nothing of the replica,
    and in a cluster of two the drained replica is where every hedge goes, so counting hedges put its probe off for
    as long as the hedges came."""
    recent: float = 0.0
    """Attempts sent here, fading with a half-life of `RECENT_HALF_LIFE`, as of ``last_pick`` (read it with
    `recent_calls`): the share of recent calls a new affinity key is placed by."""
    bounded: bool = False
    """``ttft`` was last raised by a lower bound (a lost race, a first-token timeout), with no first token since:
    only the replica's own calls can correct it."""
    checking: bool = False
    """The last first attempt sent here was a probe of a replica the costs had left out
    (`llmguard_client._routing.router.Router`): its success counts as a drained replica's probe's does."""
    unanswered_since: float | None = None
    """When the first attempt sent here since its last first token (or failure) went out: while
    calls are in flight, a replica silent for longer than its TTFT estimate is costed as that slow."""
    limited_until: float = -math.inf
    """A rate-limit header said there is no room here before this time."""
    waiting: float = 0.0
    """Requests the server reported queued (from every client), believed until ``waiting_until``."""
    waiting_until: float = -math.inf
    kv_usage: float = 0.0
    """The share of its KV cache the server reported in use (0-1), believed until ``kv_until``."""
    kv_until: float = -math.inf
    reported_at: float = -math.inf
    """When the server's last report (``/metrics`` polled, or vLLM's ORCA header on an answer) was read."""


class Routable(Protocol):
    """What the router needs of a replica (`llmguard_client._routing.replicas.ReplicaState` has it)."""

    @property
    def name(self) -> str: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def health(self) -> ReplicaHealth: ...

    def cooling(self, now: float) -> bool: ...


def shift(h: ReplicaHealth, by: float) -> None:
    """Move every instant of ``h`` by ``by`` seconds (its clock went back: `ReplicaState.settle`)."""
    h.failure_at += by
    h.rejection_at += by
    h.drained_at += by
    h.last_pick += by
    h.last_first += by
    if h.unanswered_since is not None:
        h.unanswered_since += by
    h.limited_until += by
    h.waiting_until += by
    h.kv_until += by
    h.reported_at += by


def sent(h: ReplicaHealth, now: float, *, hedge: bool = False) -> None:
    """An attempt goes to this replica now (a ``hedge``: another attempt of the same call is already waiting)."""
    h.recent = recent_calls(h, now) + 1.0
    h.last_pick = now
    if not hedge:
        h.last_first = now
    if h.unanswered_since is None:
        h.unanswered_since = now


def recent_calls(h: ReplicaHealth, now: float) -> float:
    """Attempts sent to this replica lately: each counts 1 when sent, halving every `RECENT_HALF_LIFE` s."""
    if not h.recent:
        return 0.0
    return h.recent * math.pow(0.5, max(0.0, now - h.last_pick) / RECENT_HALF_LIFE)


def silent(s: Routable, now: float, ttft: float) -> float:
    """``ttft``, or longer if the replica has calls in flight and no first token for longer than that."""
    since = s.health.unanswered_since
    if since is None or s.in_flight == 0:
        return ttft
    return max(ttft, now - since)


STRAGGLER_RATIO = 3.0
STRAGGLER_FLOOR = 0.1


def straggling(s: Routable, now: float, ttft: float | None) -> bool:
    """``s`` has attempts in flight and no first token for `STRAGGLER_RATIO` x ``ttft`` (its TTFT estimate; None:
    unknown, never straggling), and `STRAGGLER_FLOOR` s more than it: its engine is queueing them (another
    client's burst, a long prefill), and a new call sent there would wait behind them."""
    return ttft is not None and silent(s, now, ttft) > max(STRAGGLER_RATIO * ttft, ttft + STRAGGLER_FLOOR)


def server_waiting(h: ReplicaHealth, now: float) -> float | None:
    """The queue the server last reported, while believed (None: no report, or a stale one)."""
    return h.waiting if h.waiting_until > now else None


def server_kv_usage(h: ReplicaHealth, now: float) -> float | None:
    """The KV-cache use the server last reported (0-1), while believed."""
    return h.kv_usage if h.kv_until > now else None


def no_room(h: ReplicaHealth, now: float) -> bool:
    """Rate-limit headers or the server's KV-cache report (`KV_FULL` or more in use) say there is no room now."""
    return h.limited_until > now or (h.kv_until > now and h.kv_usage >= KV_FULL)


def worse(value: float | None, reference: float | None, ratio: float, floor: float) -> bool:
    """``value`` is at least ``ratio`` x ``reference`` and at least ``floor`` above it."""
    return value is not None and reference is not None and value >= ratio * reference and value - reference >= floor


def ms(seconds: float | None) -> str:
    """Seconds as whole milliseconds for a log line."""
    return "unknown" if seconds is None else f"{seconds * 1000:.0f} ms"
