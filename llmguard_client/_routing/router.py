"""Which replica gets a call: a choice that follows load and health, drains a degraded replica
to a trickle of probes, and brings it back once it recovers.

What the router knows about each replica (`ReplicaHealth`), learned from the guard's own calls:

- ``ttft``: seconds to the first content token, and ``tpot``: seconds per token after the first
  (the seconds the caller's body waited on the stream after the first token / (tokens - 1): the time a caller
  takes between its reads is its own, not the replica's). Until `Router.MIN_SAMPLES` samples arrived, each
  is the lower median of its samples and the cost reads the median replica's instead (one straggler among
  a replica's first calls is not its speed, and the replica keeps getting calls to be measured by);
  from then on an EWMA whose samples are clipped to `Router.CLIP` x the current estimate, so one
  straggler nudges the estimate instead of multiplying it, while a replica that stays slow gets there
  within a few calls. An attempt that
  lost a hedge race before its first token, or that a streamed call's first-token deadline ended, is a
  lower bound on that replica's TTFT: above the estimate the replica is costed with (the median replica's
  until it has `Router.MIN_SAMPLES` samples) it counts as a sample (a first one, or the EWMA's), and it is
  ignored otherwise. A replica whose calls keep losing races or timing out (a long queue) is thus judged by
  them within `Router.MIN_SAMPLES` calls instead of staying unknown and taking its share.
- ``failure``: an EWMA of failures over finished attempts and streams, fading with a half-life of
  `Router.FAILURE_HALF_LIFE` seconds. A failure is an error before the first token (5xx, 408,
  connect error, reset) or after it (reset, stall or total timeout, a malformed or truncated stream).
  A failure after the first token counts `Router.MID_STREAM_WEIGHT` (3) times: the caller sees it,
  while one before the first token costs a retry or a hedge. An overload answer (429/503 with
  Retry-After) is not a failure: it cools the replica instead.
- ``rejection``: the same fading rate of generation calls answered 401, 403 or 404
  (`llmguard_client._routing.health.REJECTIONS`: a server without the model while a rollout renames it, an
  ingress whose pod is gone, a replica with a wrong key), decayed by the replica's successes (first tokens,
  answers). A rejection counts `Router.MID_STREAM_WEIGHT` times: the caller gets it (it is not retried). It is
  judged relatively, since a rejection may be the caller's fault (a bad key, a wrong model name), and then every
  replica rejects alike: it drains a replica only while the lower median of all the replicas' rates is under
  `Router.RECOVER_FAILURE` and its last `Router.REJECTIONS_IN_A_ROW` calls were all rejected (it rejects what the
  others serve). It weighs in no cost: calls kept away from a replica for a bad tenant's rejections left it no call
  to serve between them. It never counts toward a circuit: where every replica rejects, the caller gets the
  server's own answer, as without the guard.
- ``unanswered_since``: while a replica has calls in flight and has produced no first token (nor
  failed) for longer than its TTFT estimate, that silence counts as its TTFT in its cost, so a
  replica that stalls all at once loses new calls within one TTFT, before any sample arrives.
- ``limited_until``: a hosted API's rate-limit headers said the replica has no room until then
  (`llmguard_client._ratelimit.headers`).
- ``waiting`` and ``kv_usage`` (optional): a vLLM server's own queue length and KV-cache use, when
  `llmguard_client.server_hints.poll_vllm_metrics` runs or an answer carries vLLM's load header (asked for by
  `Admission`); `server_load` keeps that one report per replica, which admission reads too.

The cost of sending a new call to a replica is its expected time (``ttft + tpot x typical
tokens``) x (calls in flight + requests the server reports queued + 1) x (1 +
`Router.FAILURE_WEIGHT` x failure): the least-cost
replica wins, among all of them for up to ``full_scan_up_to`` replicas, else between two drawn at
random (power of two choices, which keeps several guards sharing replicas from herding). Unknown
estimates (fewer than `Router.MIN_SAMPLES` samples, lost races and first-token timeouts included) take
the median replica's, so a fresh guard balances by load alone. A replica without
rate-limit room (or whose server reports its KV cache full) ranks after every one with room, and one
whose server reports a queue after every one reporting none (a new call would wait behind that queue,
however few of the guard's own calls are there); a cooling one (Retry-After) only loses ties
(the replica set offers one for a first attempt only as its probe, or when every replica is cooling:
`llmguard_client._routing.cooldown`).

Draining: a replica whose TTFT or TPOT is at least `Router.DRAIN_RATIO` x the median replica's
(and `Router.TTFT_FLOOR` above it for TTFT; for TPOT, `Router.TPOT_FLOOR` and enough to add more than a first
token takes over a typical answer, `Router._tpot_floor`: a busy client's late reads of short streams are not a slow
replica; judged only once it has `Router.MIN_SAMPLES` samples of it), or whose failure rate reaches
`Router.DRAIN_FAILURE` (or its rejection rate, while the median replica's is under `Router.RECOVER_FAILURE`),
is drained: it gets no first attempts except probes, at most one call in ``probe_every`` (or, when fewer calls
come, one per ``probe_interval``, unless its time per token keeps it drained: its probe is then a whole answer at
that pace), the first `Router.FIRST_PROBE` seconds after the drain and each next one twice
as long after the last, up to ``probe_interval`` seconds. Speed drains a replica only while no replica signals
overload with a Retry-After: then slowness is load, and draining one replica would pile its share onto others
that are overloaded too. While drained its estimates move faster
(`Router.DRAINED_EWMA`; a probe's first token within `Router.RECOVER_RATIO` of the median's replaces its TTFT
estimate, and its time per token so its TPOT estimate), and it is brought back once its estimates are under
`Router.RECOVER_RATIO` x the median and its failure rate under `Router.RECOVER_FAILURE` (its rejection rate too,
unless the median replica's has reached it), with its
speed estimates forgotten (it starts again as a replica never measured). At most a minority of
replicas (one of 2 or 3, two of 5) is drained at a time, so a cluster-wide slowdown is never
answered by piling everything onto one replica. The median is that of the replicas that are
succeeding (failure rate under `Router.RECOVER_FAILURE`): a replica that answers its first token at
once and then breaks the stream is no yardstick for the others' speed.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

from llmguard_client._core.randomness import process_random
from llmguard_client._ratelimit.headers import parse_rate_limits
from llmguard_client._routing.health import (
    KV_FULL,
    ReplicaHealth,
    Routable,
    ms,
    no_room,
    sent,
    server_waiting,
    silent,
    straggling,
    worse,
)
from llmguard_client._routing.quantile import lower_median

if TYPE_CHECKING:
    from llmguard_client._routing.affinity.routing import Prefer

__all__ = ["ReplicaHealth", "Routable", "Router"]

logger = logging.getLogger("llmguard_client")


S = TypeVar("S", bound=Routable)


class Router(Generic[S]):
    """Chooses replicas for attempts and learns from how they went. All times are the caller's ``now``."""

    EWMA = 0.2
    DRAINED_EWMA = 0.7
    FIRST_PROBE = 0.5
    """Seconds from a drain to its first probe; each later probe waits twice as long, up to ``probe_interval``."""
    CLIP = 4.0
    FAILURE_EWMA = 0.1
    FAILURE_HALF_LIFE = 10.0
    FAILURE_WEIGHT = 10.0
    MID_STREAM_WEIGHT = 3.0
    """A failure after the first token reaches the caller; one before it is retried or hedged away. A rejection
    (401/403/404) reaches the caller too, and counts as much."""
    FAILURE_FORGOTTEN = 0.01
    """A failure rate that has faded below this counts as none (so old failures stop breaking ties)."""
    DRAIN_RATIO = 4.0
    RECOVER_RATIO = 2.5
    TTFT_FLOOR = 0.05
    TPOT_FLOOR = 0.005
    DRAIN_FAILURE = 0.5
    RECOVER_FAILURE = 0.25
    REJECTIONS_IN_A_ROW = 3
    """Rejections with no call served between them before a replica can be drained for rejecting (`_rejecting`): a
    tenant's bad key spread over healthy replicas rejects two in a row on one now and then (measured: 5 of 6 runs
    drained a healthy replica for about 1 s at two)."""
    DEFAULT_TOKENS = 16.0
    MIN_SAMPLES = 3
    """Samples of a replica's TTFT (or TPOT) before its speed counts: until then it is costed as the median
    replica and drained for failures only (a fresh guard drained a healthy replica after one 516 ms straggler
    among its first calls); the lower median of three is one straggler-proof."""
    TIE = 0.15
    TIE_SECONDS = 0.02
    HEDGE_QUEUE = 4.0
    """Requests queued at a server from which a call waiting there is hedged at once (`watch_queue`): a
    healthy engine shows 1-3 for a moment between its steps (hedging on those cost 0.4-2 % more requests on a
    healthy cluster, for nothing)."""

    def __init__(
        self,
        states: Sequence[S],
        *,
        full_scan_up_to: int = 3,
        probe_interval: float = 2.0,
        probe_every: int = 50,
        rng: random.Random | None = None,
    ) -> None:
        if isinstance(full_scan_up_to, bool) or not isinstance(full_scan_up_to, int) or full_scan_up_to < 2:
            raise ValueError(f"full_scan_up_to must be an int >= 2, got {full_scan_up_to!r}")
        if not isinstance(probe_interval, (int, float)) or not probe_interval > 0:
            raise ValueError(f"probe_interval must be a positive number of seconds, got {probe_interval!r}")
        if isinstance(probe_every, bool) or not isinstance(probe_every, int) or probe_every < 1:
            raise ValueError(f"probe_every must be an int >= 1, got {probe_every!r}")
        self.states = list(states)
        self._by_name = {s.name: s for s in self.states}
        self.full_scan_up_to = full_scan_up_to
        self.probe_interval = float(probe_interval)
        self.probe_every = probe_every
        self.max_drained = max(1, (len(self.states) - 1) // 2) if len(self.states) >= 2 else 0
        self._rng = rng if rng is not None else process_random()
        self._turn = itertools.count()
        self._since_probe = 0
        """First attempts since the last probe of a drained replica."""
        self._last_probe = -math.inf
        """When the last probe of a drained replica was sent."""
        self._tokens: float | None = None
        self._ref_ttft: float | None = None
        self._ref_tpot: float | None = None
        self._stale = False
        """An estimate changed since the reference medians were computed."""
        self._drained = 0
        """How many replicas are drained (0 keeps the common path free of the drain logic)."""
        self.epoch = 0
        """Changes whenever a replica is drained or brought back."""
        self._limited_until = -math.inf
        """The latest rate-limit reset any replica reported (before it, some replica may have no room)."""
        self._judged_refs: tuple[float | None, float | None] = (None, None)
        """The reference medians when every replica was last judged for draining."""
        self._queue_watchers: dict[str, set[Callable[[], None]]] = {}
        """Per replica name, what to tell when its server reports a queue (the hedge rounds waiting there)."""
        self.queues_reported_until = -math.inf
        """Until when some server's report of its queue is believed (before it, no rule reads one: the path of a
        guard without server reports stays free of them)."""

    # --- choosing -------------------------------------------------------------------------

    def pick(self, now: float, candidates: list[S], prefer: Prefer[S] | None = None) -> S | None:
        """The replica for a call's first attempt (a probe of a drained replica when one is due);
        ``prefer`` (cache affinity) chooses among the healthy ones when it can; else ties go round-robin."""
        if not candidates:
            return None
        chosen = self._probe_due(now, candidates) if self._drained else None
        if chosen is None:
            self._since_probe += 1
            healthy = candidates
            if self._drained:
                healthy = [s for s in candidates if not s.health.drained] or candidates
            chosen = prefer(healthy) if prefer is not None else None  # cache affinity (_routing.affinity.routing)
            if chosen is None:
                if len(healthy) > self.full_scan_up_to:
                    chosen = self._least_cost(self._rng.sample(healthy, 2), now, rotate=True)
                else:
                    chosen = self._left_out(now, healthy) or self._least_cost(healthy, now, rotate=True)
        else:
            self._since_probe, self._last_probe = 0, now
            chosen.health.probes += 1
        sent(chosen.health, now)
        return chosen

    def pick_ready(self, now: float, candidates: list[S], prefer: Prefer[S] | None = None) -> S | None:
        """The replica for a retry: ``prefer``'s choice (cache affinity), else healthy first, then the least cost."""
        if not candidates:
            return None
        healthy = [s for s in candidates if not s.health.drained] or candidates if self._drained else candidates
        chosen = (prefer(healthy) if prefer is not None else None) or self._least_cost(healthy, now, rotate=False)
        sent(chosen.health, now)
        return chosen

    def pick_hedge(self, now: float, candidates: list[S], prefer: Prefer[S] | None = None) -> S | None:
        """The replica for a hedge: ``prefer``'s choice (cache affinity), else healthy first, with room, without a
        queue its server reports, then the best TTFT (unknown counts as 0, so a replica never tried is tried),
        then the fewest in flight."""
        if not candidates:
            return None
        chosen = prefer(candidates) if prefer is not None else None  # cache affinity (_routing.affinity.routing)
        if chosen is not None:
            sent(chosen.health, now, hedge=True)
            return chosen

        def key(s: S) -> tuple[bool, bool, bool, float, int]:
            h = s.health
            speed = silent(s, now, h.ttft or 0.0) * (1.0 + self.FAILURE_WEIGHT * self._failure(h, now))
            return (h.drained, no_room(h, now), bool(server_waiting(h, now)), speed, s.in_flight)

        chosen = min(candidates, key=key)
        sent(chosen.health, now, hedge=True)
        return chosen

    def degraded(self, name: str) -> bool:
        """True while the replica named ``name`` is drained (unknown names: False)."""
        state = self._by_name.get(name)
        return state is not None and state.health.drained

    def _probe_due(self, now: float, candidates: list[S]) -> S | None:
        """A drained replica whose probe is due (`_probe_wait`), if probes are not too frequent: one in
        ``probe_every`` calls at most, unless ``probe_interval`` s passed since the last (few calls come) and the
        replica is not slow per token (`_slow_per_token`)."""
        counted = self._since_probe + 1 >= self.probe_every
        if not counted and now - self._last_probe < self.probe_interval:
            return None
        if self._stale:
            self._refresh_references(now)
        due = [
            s
            for s in candidates
            if s.health.drained
            and now - max(s.health.last_first, s.health.drained_at) >= self._probe_wait(s.health)
            and (counted or not self._slow_per_token(s.health))
        ]
        return min(due, key=lambda s: s.health.last_first) if due else None

    def _slow_per_token(self, h: ReplicaHealth, tpot: float | None = None) -> bool:
        """``h``'s time per token (or ``tpot``, a probe's) keeps it from coming back. Such a replica's probe is a
        whole answer at that pace, which no hedge cuts short, so it is probed once in ``probe_every`` calls however
        few come (one every ``probe_interval`` s was a third of the calls of a caller calling in sequence, and most
        of its time). A probe of a replica drained for its first token, failures or rejections tells at its first
        token or error."""
        return worse(h.tpot if tpot is None else tpot, self._ref_tpot, self.RECOVER_RATIO, self._tpot_floor(h))

    def _left_out(self, now: float, states: list[S]) -> S | None:
        """A replica the costs kept from every first attempt for ``probe_interval`` s while another took them,
        costed on what only its own calls can correct (a failure rate, or a lost race's lower bound on its TTFT):
        it gets this call, as a probe whose success counts as fast as a drained replica's probe's. Without it, one
        caller's sequential calls never went back to a replica healed from a short outage until its failures had
        faded (~45 s). Only where every replica is costed (a full scan): two drawn at random explore by
        themselves."""
        interval = self.probe_interval
        if len(states) < 2 or not any(now - s.health.last_first < interval for s in states):
            return None  # an idle client: nothing was left out
        left = [
            s
            for s in states
            if now - s.health.last_first >= interval
            and (s.health.bounded or self._failure(s.health, now) > 0.0)
            and not s.cooling(now)
            and not no_room(s.health, now)
            and not server_waiting(s.health, now)
        ]
        if not left:
            return None
        chosen = min(left, key=lambda s: s.health.last_first)
        chosen.health.checking = True
        return chosen

    def _probe_wait(self, h: ReplicaHealth) -> float:
        """Seconds from a drained replica's last call to its next probe: `FIRST_PROBE` after the drain, doubling
        with each probe up to ``probe_interval`` (a queue that held it back for a moment is seen gone soon, a
        replica slow for good costs a few probes more)."""
        return min(self.probe_interval, self.FIRST_PROBE * 2.0**h.probes)

    def cheapest(self, states: list[S], now: float) -> list[S]:
        """The replicas tied for the least cost, in the order given: those with rate-limit room first; then
        those whose cost is within `TIE` (relative) or `TIE_SECONDS` of the least. Empty only for no states."""
        if not states:
            return []
        if self._stale:
            self._refresh_references(now)
        if self._limited_until > now:  # rate-limit headers or a server said some replica has no room
            room = [s for s in states if not no_room(s.health, now)]
            states = room or states
        answering = [s for s in states if not straggling(s, now, self._ttft(s))]
        states = answering or states  # a replica queueing its calls ranks after every one answering
        if self.queues_reported_until > now:
            unqueued = [s for s in states if not server_waiting(s.health, now)]
            states = unqueued or states  # a new call would wait behind a queue its server reports
        costs = [self._cost(s, now) for s in states]
        bound = min(costs) * (1.0 + self.TIE) + self.TIE_SECONDS
        return [s for s, cost in zip(states, costs, strict=True) if cost <= bound]

    def _least_cost(self, states: list[S], now: float, *, rotate: bool) -> S:
        """Among the `cheapest`, the ones not cooling, in turns."""
        near = self.cheapest(states, now)
        equals = [s for s in near if not s.cooling(now)] or near if len(near) > 1 else near
        return equals[next(self._turn) % len(equals)] if rotate else equals[0]

    def _ttft(self, s: S) -> float | None:
        """``s``'s TTFT estimate; with fewer than `MIN_SAMPLES` samples the median replica's, so that it gets
        calls to be judged by."""
        h = s.health
        return h.ttft if len(h.ttft_first) >= self.MIN_SAMPLES else self._ref_ttft

    def _cost(self, s: S, now: float) -> float:
        h = s.health
        ttft = self._ttft(s)
        if h.unanswered_since is not None and ttft is not None:
            ttft = silent(s, now, ttft)
        tpot = h.tpot if len(h.tpot_first) >= self.MIN_SAMPLES else self._ref_tpot
        if ttft is None and tpot is None:
            expected = 1.0  # nothing known anywhere: balance by load alone
        else:
            expected = (ttft or 0.0) + (tpot or 0.0) * (self._tokens or self.DEFAULT_TOKENS)
        load = s.in_flight + 1 + (server_waiting(h, now) or 0.0)
        # Rejections do not weigh here: a replica whose rejections kept calls away would serve none between a bad
        # tenant's calls, and be drained for them (`_rejecting` reads the calls it served in between).
        return expected * load * (1.0 + self.FAILURE_WEIGHT * self._failure(h, now))

    def _failure(self, h: ReplicaHealth, now: float) -> float:
        return self._faded(h.failure, h.failure_at, now)

    def _rejection(self, h: ReplicaHealth, now: float) -> float:
        return self._faded(h.rejection, h.rejection_at, now)

    def _faded(self, rate: float, at: float, now: float) -> float:
        """A rate counted at ``at``, faded by `FAILURE_HALF_LIFE` to ``now`` (under `FAILURE_FORGOTTEN`: 0)."""
        if rate == 0.0:
            return 0.0
        rate *= math.pow(0.5, max(0.0, now - at) / self.FAILURE_HALF_LIFE)
        return rate if rate >= self.FAILURE_FORGOTTEN else 0.0

    def _rejecting(self, h: ReplicaHealth, now: float, at_least: float) -> bool:
        """``h``'s rejection rate is ``at_least`` or more, its last `REJECTIONS_IN_A_ROW` calls were all rejected,
        and the lower median of the replicas' rates is under `RECOVER_FAILURE`: it rejects what the others serve
        (where all reject alike, the fault is the caller's; a replica serving calls between a tenant's bad ones is
        not rejecting them because of itself)."""
        if h.rejected_in_a_row < self.REJECTIONS_IN_A_ROW or self._rejection(h, now) < at_least:
            return False
        median = lower_median([self._rejection(s.health, now) for s in self.states])
        return (median or 0.0) < self.RECOVER_FAILURE

    # --- learning -------------------------------------------------------------------------

    def first_token(self, state: S, now: float, ttft: float) -> None:
        """An attempt on ``state`` reached its first content token ``ttft`` seconds after it started (a drained
        replica's probe within `RECOVER_RATIO` of the median replica's is its estimate at once)."""
        h = state.health
        if h.drained and h.ttft is not None and not worse(ttft, self._ref_ttft, self.RECOVER_RATIO, self.TTFT_FLOOR):
            h.ttft = max(0.0, ttft)
        elif h.checking and h.bounded and len(h.ttft_first) >= self.MIN_SAMPLES:
            h.ttft = max(0.0, ttft)  # a first token where only lower bounds were: a measurement replaces them
        else:
            h.ttft = self._learn(h.ttft, h.ttft_first, max(0.0, ttft), h.drained)
        h.unanswered_since, h.bounded, h.rejected_in_a_row = None, False, 0
        if h.rejection:
            self._count_rejection(h, now, rejected=False)
        self._reassess(state, now)

    def answered(self, state: S, now: float) -> None:
        """An attempt on ``state`` won without a first-token time worth learning from (a
        non-streaming body): the replica is not silent, and served what it may have rejected before."""
        h = state.health
        h.unanswered_since, h.rejected_in_a_row = None, 0
        if h.rejection:
            self._count_rejection(h, now, rejected=False)
            self._reassess(state, now)

    def rejected(self, state: S, now: float, status: int) -> None:
        """A generation call on ``state`` was answered ``status`` (one of `REJECTIONS`): its rejection rate rises
        (``status`` is named in the log line if that drains it). It counts toward no circuit."""
        h = state.health
        h.unanswered_since, h.rejected_status = None, status
        h.rejected_in_a_row += 1
        self._count_rejection(h, now, rejected=True)
        h.checking = False
        self._reassess(state, now)

    def outran(self, state: S, now: float, waited: float) -> None:
        """An attempt on ``state`` ended after ``waited`` seconds with no first token (it lost a race, or the call's
        first-token deadline ended it): a lower bound on its TTFT. Above the estimate the replica is costed with
        (`_ttft`: the median replica's until it has `MIN_SAMPLES` samples) it is evidence, and counts as a
        sample: a replica whose calls keep losing is judged by them within `MIN_SAMPLES` calls instead of
        staying unknown, costed as the median replica; otherwise it says nothing new."""
        h = state.health
        h.unanswered_since = None
        if self._stale:
            self._refresh_references(now)
        costed = self._ttft(state)
        if costed is None or waited > costed:
            h.ttft = self._learn(h.ttft, h.ttft_first, max(0.0, waited), h.drained)
            h.bounded, h.checking = True, False
            self._reassess(state, now)

    def failed(self, state: S, now: float) -> None:
        """An attempt on ``state`` failed before its first token (error status, transport error)."""
        state.health.unanswered_since = None
        self._count(state.health, now, failed=True)
        self._reassess(state, now)

    def stream_finished(
        self, state: S, now: float, *, ok: bool | None, tokens: int | None, duration: float | None
    ) -> None:
        """The body of a call won by ``state`` ended: ``ok`` False for a mid-stream failure, None when the
        caller left early (timing only); ``tokens`` output tokens over ``duration`` s the body waited on the stream
        after the first (a drained replica's probe within `RECOVER_RATIO` of the median replica's is its estimate at
        once, as its first token is: such a probe comes once in ``probe_every`` calls, `_slow_per_token`)."""
        h = state.health
        if tokens is not None and tokens >= 2 and duration is not None and duration >= 0:
            tpot = duration / (tokens - 1)
            if h.drained and h.tpot is not None and not self._slow_per_token(h, tpot):
                h.tpot = tpot
            else:
                h.tpot = self._learn(h.tpot, h.tpot_first, tpot, h.drained)
        if ok and tokens is not None and tokens >= 1:
            self._tokens = float(tokens) if self._tokens is None else self._tokens + self.EWMA * (tokens - self._tokens)
        if ok is not None:
            self._count(h, now, failed=not ok, weight=self.MID_STREAM_WEIGHT)
        self._reassess(state, now)

    def saw_headers(self, state: S, now: float, headers: Mapping[str, str]) -> None:
        """Read a response's rate-limit headers, if any (absent: nothing changes)."""
        hint = parse_rate_limits(headers)
        if hint is not None:
            until = now + hint.no_room_for if hint.no_room_for > 0 else -math.inf
            state.health.limited_until = until
            self._limited_until = max(self._limited_until, until)

    def server_load(
        self, state: S, now: float, *, waiting: float | None, kv_usage: float | None, fresh_for: float
    ) -> None:
        """A server's own report, believed for ``fresh_for`` seconds: ``waiting`` requests queued there (a
        replica reporting a queue ranks after those reporting none, since a new call would wait behind it;
        among replicas that all queue, counted as load beside the guard's own calls in flight), ``kv_usage``
        of its KV cache (0-1; from `llmguard_client._routing.health.KV_FULL` on it ranks with the replicas
        without room). A queue of `HEDGE_QUEUE` or more while another replica reports none tells the
        `watch_queue` watchers."""
        h = state.health
        if waiting is not None and waiting >= 0:
            h.waiting, h.waiting_until = waiting, now + fresh_for
            self.queues_reported_until = max(self.queues_reported_until, h.waiting_until)
        if kv_usage is not None:
            h.kv_usage, h.kv_until = kv_usage, now + fresh_for
            if kv_usage >= KV_FULL:
                self._limited_until = max(self._limited_until, h.kv_until)
        if waiting is not None or kv_usage is not None:
            h.reported_at = now
        watchers = self._queue_watchers.get(state.name)
        if watchers and waiting is not None and waiting >= self.HEDGE_QUEUE and self._unqueued_elsewhere(state, now):
            for watcher in list(watchers):  # a watcher may stop watching as it is told
                try:
                    watcher()
                except Exception:  # one call's failure must not end the poller or the call that reported
                    logger.exception("llmguard: a call told of %s's queue failed to act on it", state.name)

    def watch_queue(self, state: S, watcher: Callable[[], None]) -> None:
        """Call ``watcher`` whenever ``state``'s server reports `HEDGE_QUEUE` or more requests queued while
        another replica's reports none (a call waiting there for its first token is better hedged at once);
        until `unwatch_queue`."""
        self._queue_watchers.setdefault(state.name, set()).add(watcher)

    def unwatch_queue(self, state: S, watcher: Callable[[], None]) -> None:
        """Stop telling ``watcher`` (no effect if it was not watching)."""
        watchers = self._queue_watchers.get(state.name)
        if watchers is not None:
            watchers.discard(watcher)
            if not watchers:
                del self._queue_watchers[state.name]

    def _unqueued_elsewhere(self, state: S, now: float) -> bool:
        return any(s is not state and server_waiting(s.health, now) == 0.0 for s in self.states)

    def _learn(self, current: float | None, first: list[float], sample: float, drained: bool) -> float:
        """The next estimate: the lower median of the ``first`` samples while there are fewer than
        `MIN_SAMPLES` (``sample`` joins them), then the EWMA."""
        if len(first) < self.MIN_SAMPLES:
            first.append(sample)
            median = lower_median(first)
            return sample if median is None else median
        return self._ewma(current, sample, drained)

    def _ewma(self, current: float | None, sample: float, drained: bool) -> float:
        if current is None:
            return sample
        sample = min(sample, self.CLIP * max(current, 1e-3))
        return current + (self.DRAINED_EWMA if drained else self.EWMA) * (sample - current)

    def _count(self, h: ReplicaHealth, now: float, *, failed: bool, weight: float = 1.0) -> None:
        h.failure = self._counted(h, self._failure(h, now), failed, weight)
        h.failure_at = now
        h.checking = False

    def _count_rejection(self, h: ReplicaHealth, now: float, *, rejected: bool) -> None:
        h.rejection = self._counted(h, self._rejection(h, now), rejected, self.MID_STREAM_WEIGHT)
        h.rejection_at = now

    def _counted(self, h: ReplicaHealth, current: float, failed: bool, weight: float) -> float:
        """A rate (``current``, faded to now) after one more outcome: ``failed`` counts ``weight``, else 0."""
        # A left-out replica's probe that succeeds is the news its costs waited for (it healed): it counts as a
        # drained replica's; one that fails counts as any failure, so that one probe does not drain it.
        alpha = self.DRAINED_EWMA if h.drained or (h.checking and not failed) else self.FAILURE_EWMA
        return current + alpha * ((weight if failed else 0.0) - current)

    def _reassess(self, state: S, now: float) -> None:
        """Refresh the reference medians; bring ``state`` back if it is drained and its own calls
        show it recovered; drain any replica (``state`` first) whose estimates are now beyond the
        limits: a replica the costs already keep away gets no calls of its own to judge it by."""
        self._refresh_references(now)
        self._stale = False
        h = state.health
        if h.drained and not self._beyond(h, now, self.RECOVER_RATIO, self.RECOVER_FAILURE):
            # A clean slate: it gets its share at once and is measured afresh, instead of waiting
            # behind the others until calls happen to wash the drained-time estimates out.
            h.drained, h.ttft, h.tpot = False, None, None
            h.ttft_first.clear()
            h.tpot_first.clear()
            self._drained -= 1
            self.epoch += 1
            self._stale = True
            logger.info("llmguard: replica %s recovered; it takes new calls again", state.name)
            return
        # The others' estimates only change with their own calls; their standing changes with the
        # medians, so they are judged again when those moved by a tenth since they last were.
        others: Sequence[S] = ()
        if _moved(self._judged_refs, (self._ref_ttft, self._ref_tpot)):
            others, self._judged_refs = self.states, (self._ref_ttft, self._ref_tpot)
        for candidate in (state, *others):
            if self._drained >= self.max_drained:
                return
            if not candidate.health.drained and self._drainable(candidate.health, now):
                self._drain(candidate, now)

    def _drainable(self, h: ReplicaHealth, now: float) -> bool:
        if self._failure(h, now) >= self.DRAIN_FAILURE or self._rejecting(h, now, self.DRAIN_FAILURE):
            return True
        enough = self.MIN_SAMPLES
        slow = (len(h.ttft_first) >= enough and worse(h.ttft, self._ref_ttft, self.DRAIN_RATIO, self.TTFT_FLOOR)) or (
            len(h.tpot_first) >= enough and worse(h.tpot, self._ref_tpot, self.DRAIN_RATIO, self._tpot_floor(h))
        )
        # While some replica signals overload (a Retry-After cool-down), slowness is load, not a degraded
        # replica: draining one for speed would pile its share onto replicas that are overloaded too.
        return slow and not any(s.cooling(now) for s in self.states)

    def _drain(self, state: S, now: float) -> None:
        h = state.health
        h.drained, h.drained_at, h.probes = True, now, 0
        self._drained += 1
        self.epoch += 1
        probed = (min(self.FIRST_PROBE, self.probe_interval), self.probe_interval)
        if self._rejecting(h, now, self.DRAIN_FAILURE):
            logger.warning(
                "llmguard: replica %s answers %d to what the others serve (rejection rate %.2f, median replica's "
                "%.2f); drained for rejecting: probed in %g s, then at most once per %g s",
                state.name,
                h.rejected_status,
                self._rejection(h, now),
                lower_median([self._rejection(s.health, now) for s in self.states]) or 0.0,
                *probed,
            )
            return
        logger.warning(
            "llmguard: replica %s is degraded (ttft %s, per token %s, failures %.0f%%; median replica "
            "ttft %s, per token %s); drained: probed in %g s, then at most once per %g s",
            state.name,
            ms(h.ttft),
            ms(h.tpot),
            100 * self._failure(h, now),
            ms(self._ref_ttft),
            ms(self._ref_tpot),
            *probed,
        )

    def _refresh_references(self, now: float) -> None:
        """The median succeeding replica's TTFT and TPOT: what "slow" and "unknown" are measured against.
        A replica failing at `RECOVER_FAILURE` or more is left out (unless every one is): one that answers
        its first token in 1 ms and then breaks the stream must not make the healthy ones look slow."""
        states = [s for s in self.states if self._failure(s.health, now) < self.RECOVER_FAILURE] or self.states
        self._ref_ttft = lower_median([s.health.ttft for s in states if s.health.ttft is not None])
        self._ref_tpot = lower_median([s.health.tpot for s in states if s.health.tpot is not None])

    def _tpot_floor(self, h: ReplicaHealth) -> float:
        """How far above the median replica's a TPOT estimate must be to count as slow: `TPOT_FLOOR`, and far enough
        that over a typical answer (its tokens after the first) it adds more than a first token takes, the
        replica's own or the median replica's (and `TTFT_FLOOR`). A busy client reads a stream's end late, by a
        pass of its event loop, as it reads first tokens late: over a short answer's few tokens that delay reads
        as a slow replica (3-token streams of two identical replicas measured 6-37 ms per token against the
        median's 0-2 ms on a CPU-bound client), while the first-token times of the same calls hold it too."""
        after_first = (self._tokens if self._tokens is not None else self.DEFAULT_TOKENS) - 1.0
        first_token = max(self.TTFT_FLOOR, self._ref_ttft or 0.0, h.ttft or 0.0)
        return max(self.TPOT_FLOOR, first_token / max(1.0, after_first))

    def _beyond(self, h: ReplicaHealth, now: float, ratio: float, failure: float) -> bool:
        return (
            worse(h.ttft, self._ref_ttft, ratio, self.TTFT_FLOOR)
            or worse(h.tpot, self._ref_tpot, ratio, self._tpot_floor(h))
            or self._failure(h, now) >= failure
            or self._rejecting(h, now, failure)
        )


def _moved(before: tuple[float | None, float | None], now: tuple[float | None, float | None]) -> bool:
    """Whether either median appeared or moved by more than a tenth."""
    return any(
        (a is None) != (b is None) or (a is not None and b is not None and abs(b - a) > 0.1 * a)
        for a, b in zip(before, now, strict=True)
    )
