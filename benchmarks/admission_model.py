"""Client-side adaptive admission on the ``collapse`` scenario, in virtual time: no load generator that can fall
behind, so policies can be compared over many seeds.

    python -m benchmarks.admission_model [--seeds 8] [--policy adaptive,oracle,fixed:12,tokens:2600,plain]
        [--profile spike|0.8x] [--batch 0.3] [--set target=0.5,growth=1,margin=2] [--calls N]

Each seed replays the bench's traffic (``--profile spike``: the 30 -> 140 -> 30 rps spike, 700 calls, as
``llmguard bench --sim collapse --seed N``; ``0.8x``: Poisson 40 rps, 400 calls, as ``--profile 40:10 --requests
400``) against the scenario's three engines (`benchmarks._virtual_cluster`: the simulator's own engine, which
queues without limit, stepped every 40 ms). The interactive tier has a 1 s first-token deadline and 10 s in all;
``--batch F`` puts that share of the calls on the bench's batch tier (30 s, 600 s), the same calls as
``--tier-mix batch:F``. Policies:

- ``plain``: the raw client: round-robin, one attempt, given up after the tier's ``total``.
- ``adaptive``: the guard's admission: the real `LimitController` and `ReplicaGate` (slots, line, rate, margin,
  judging the line again as slots free up) on the virtual clock, the guard's own `ReplicaSet` choosing each
  call's replica, and a model of the admission layer's rules (a full replica's call goes to the replica with the
  most room, else waits in line until ``min(deadline - recent TTFT, start + max_queue_wait x ttft)`` (a paced or
  batch call: until ``deadline - recent TTFT``) if the predicted wait fits, else is refused; a batch call takes a slot
  only under ``1 - reserve`` of the limit; the limit learns from each first token, and from a first-token deadline
  that fired). A call without its first token at its deadline is abandoned: the engine stops its work
  (wasted work).
- ``fixed:N``: the same gate with its limit pinned at N attempts per replica (nothing learned).
- ``tokens:B`` and ``calls:N``: not the guard's: a fixed budget per replica of what the calls in flight there
  may add up to, in tokens (prompt + ``max_tokens``) or in calls, without a line; a call goes to the replica
  with the most room left and is refused at once if it fits on none. ``tokens:learned`` and ``calls:learned``:
  the same budget learned by the guard's `LimitController` (from ``--set``'s `Admission`). They show what
  counting tokens instead of calls is worth.
- ``oracle``: clairvoyant and greedy in arrival order: a call is sent to the least busy replica whose engine,
  simulated forward with the calls already admitted there and this one (no later arrivals), gives it its first
  token within 1 s and a TPOT within 80 ms without making an admitted call miss either; otherwise it is refused.
  Every call it admits is good, so its goodput is what an admission that knew the engines' future could reach
  by refusing calls in arrival order (not a proof of optimality: it never prefers short calls to long ones).

Left out: hedges and retries (with admission a hedge needs a free slot, rare in the spike; a refused call is not
retried), the guard's and the load generator's own CPU (the bench's machine stalls), the engines' load reports
(streamed answers carry none), and a refused caller coming back.

Per seed it prints goodput (interactive calls meeting TTFT <= 1 s and TPOT <= 80 ms), where the other calls went
(refused before sending; sent but no first token by 1 s; first token in time but TPOT over 80 ms; cut by the
total deadline), the wasted share of the engines' work (work for calls abandoned mid-way), completions per second,
and with ``--batch`` the batch calls completed within their 30 s; then the mean over the seeds.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import logging
import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import httpx

import llmguard_client._admission.controller as controller_module
import llmguard_client._admission.queue as queue_module
from benchmarks._virtual_cluster import (
    HALF_RTT,
    TPOT_SLO,
    EventHeap,
    engine_request,
    make_engines,
    meets_slo,
    poisson_plan,
    spike_plan,
)
from llmguard_client import Admission, Replica
from llmguard_client._admission.controller import LimitController
from llmguard_client._admission.queue import ReplicaGate, Slot, Waiter
from llmguard_client._admission.signal import LoadSignal
from llmguard_client._admission.size import CallSizes
from llmguard_client._core.request import prompt_chars
from llmguard_client._routing.replicas import ReplicaSet
from llmguard_tools.bench.tiermix import BATCH, assign
from llmguard_tools.bench.traffic import PlannedRequest, TrafficPlan, request_body
from llmguard_tools.sim.engine import Engine, EngineRequest, Sequence

SCENARIO = "collapse"
TIERS = {"interactive": (1.0, 10.0), "batch": (BATCH.ttft, BATCH.total)}
URGENT_TTFT = min(ttft for ttft, _ in TIERS.values())
"""The guard's most urgent tier's ``ttft``: calls of a longer one leave `Admission.reserve` of a limit to it."""
"""Per tier: (first-token deadline, total deadline), seconds: the bench's interactive tier and its batch tier."""
OUTCOMES = ("good", "refused", "late", "slow", "cut")
"""Where a call ends: met the SLO; refused before it was sent; sent but no first token within its tier's ttft
(abandoned by a guard, late for the raw client); first token in time but TPOT over 80 ms; cut by ``total``."""
CALL_TOKENS = 88
"""The bench's mean call on the simulated scenarios, in tokens (prompt + ``max_tokens``): ``tokens:learned``
counts its limits and growth in such calls."""
CONSTANTS = {"margin": (queue_module, "MARGIN"), "used": (controller_module, "USED")}
"""Module constants ``--set`` may change for a run (patched, then restored)."""


@dataclass(eq=False)
class Call:
    request: PlannedRequest
    tier: str
    start: float
    work: EngineRequest
    replica: int | None = None
    seq: Sequence | None = None
    slot: Slot | None = None
    waiter: Waiter | None = None
    prompt_chars: int = 0
    """The characters of the prompt's text in the bench's request body, as the guard counts them."""
    sent: float = 0.0
    held: float = 0.0
    share: float = 1.0
    """The share of a replica's limit the call may take (less on the batch tier: `Admission.reserve`)."""
    ttft: float | None = None
    tpot: float | None = None
    completed: bool = False
    refused_after: float | None = None
    """Seconds from the call's start to its refusal."""
    outcome: str | None = None

    def refuse(self, t: float) -> None:
        self.outcome, self.refused_after = "refused", t - self.start

    @property
    def ttft_limit(self) -> float:
        return TIERS[self.tier][0]


@dataclass
class Result:
    """One policy over one seed's traffic."""

    outcomes: dict[str, float]
    """Interactive calls per outcome."""
    interactive: int
    batch_done: int = 0
    batch: int = 0
    work_tokens: int = 0
    wasted_tokens: int = 0
    done_per_s: float = 0.0
    refused_p99: float | None = None
    """Seconds from a refused call's start to its refusal, 99th percentile."""
    peak_in_flight: int = 0
    """The most attempts a guard's gate held in flight on one replica at once (0: no gates)."""
    calls: list[Call] = field(default_factory=list, repr=False)

    @property
    def goodput(self) -> float:
        return self.outcomes["good"] / self.interactive if self.interactive else 0.0

    @property
    def wasted(self) -> float:
        return self.wasted_tokens / self.work_tokens if self.work_tokens else 0.0

    @property
    def batch_completed(self) -> float | None:
        return self.batch_done / self.batch if self.batch else None


class FixedLimit(LimitController):
    """A limit that learns nothing: ``fixed:N``."""

    def first_token(
        self,
        ttft: float,
        tier_ttft: float,
        held: float,
        in_flight: float,
        floor: float | None = None,
        share: float = 1.0,
    ) -> None:
        pass

    def overload(self, held: float) -> None:
        pass


@dataclass
class Cluster:
    """The scenario's engines, stepped in virtual time; the client's events go on the same heap."""

    engines: list[Engine]
    events: EventHeap = field(default_factory=EventHeap)
    next_step: list[float | None] = field(default_factory=list)
    """When each engine steps next (None: idle, not stepping)."""
    live: list[dict[int, Call]] = field(default_factory=list)
    """Per engine: the calls whose request it holds, by sequence id."""

    def __post_init__(self) -> None:
        self.next_step = [None] * len(self.engines)
        self.live = [{} for _ in self.engines]

    def submit(self, e: int, call: Call, t: float) -> None:
        """Send ``call`` to engine ``e`` at ``t`` (it arrives one half round trip later)."""
        arrives = t + HALF_RTT
        call.replica, call.sent = e, t
        call.seq = self.engines[e].submit(call.work, arrives)
        self.live[e][call.seq.id] = call
        if self.next_step[e] is None:
            self.next_step[e] = arrives
            self.events.push(arrives, "step", e)

    def abort(self, call: Call) -> None:
        """The client went away: the engine stops the call's work (counted as wasted)."""
        assert call.replica is not None and call.seq is not None
        if self.live[call.replica].pop(call.seq.id, None) is not None:
            self.engines[call.replica].abort(call.seq, by_disconnect=True)

    def step(self, e: int, t: float) -> None:
        """Engine ``e`` steps; the client sees first tokens and ends half a round trip later."""
        engine = self.engines[e]
        engine.step(t)
        live = self.live[e]
        for seq_id, call in list(live.items()):
            seq = call.seq
            assert seq is not None
            if seq.first_token_at == t:
                self.events.push(t + HALF_RTT, "token", call)
            if seq.done:
                del live[seq_id]
                self.events.push(t + HALF_RTT, "done", call)
        if engine.idle:
            self.next_step[e] = None
        else:
            self.next_step[e] = t + engine.config.step_period
            self.events.push(t + engine.config.step_period, "step", e)


class Client:
    """What a policy does with each call; the defaults are the raw client's."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._turn = itertools.count()

    def arrive(self, call: Call, t: float) -> None:
        self.cluster.submit(next(self._turn) % len(self.cluster.engines), call, t)

    def first_token(self, call: Call, t: float) -> None:
        pass

    def ended(self, call: Call, t: float, *, abandoned: bool) -> None:
        pass

    def deadline(self, call: Call, t: float) -> None:
        """The call's first-token deadline passed without a first token (the raw client keeps waiting)."""

    def timer(self, payload: object, t: float) -> None:
        pass


class Guarded(Client):
    """The guard's admission layer in front of each replica (see the module docstring)."""

    def __init__(self, cluster: Cluster, policy: Admission, fixed: int | None) -> None:
        super().__init__(cluster)
        self.policy = policy
        n = len(cluster.engines)
        self.replicas = ReplicaSet(
            [Replica(f"http://r{i}") for i in range(n)], lambda r: httpx.MockTransport(lambda q: httpx.Response(200))
        )
        self.index = {id(s): i for i, s in enumerate(self.replicas.states)}
        self.gates = [
            ReplicaGate(
                FixedLimit(dataclasses.replace(policy, initial_limit=fixed, max_limit=max(fixed, policy.max_limit)))
                if fixed is not None
                else LimitController(policy),
                LoadSignal(),
                policy.max_waiting,
                lambda: self.now,
            )
            for _ in range(n)
        ]
        self.waiting: list[list[Call]] = [[] for _ in range(n)]
        self.sizes = CallSizes()
        self.now = 0.0
        self.peak = 0
        """The most attempts any replica's gate held in flight at once."""

    def arrive(self, call: Call, t: float) -> None:
        self.now = t
        chosen = self.replicas.pick(t)
        assert chosen is not None
        e = self.index[id(chosen)]
        gate = self.gates[e]
        weight = self.sizes.weight(call.prompt_chars, call.work.max_tokens) if self.policy.by_size else 1.0
        call.share = share = 1.0 if call.ttft_limit <= URGENT_TTFT else 1.0 - self.policy.reserve
        deadline = call.start + call.ttft_limit
        slot = gate.try_take(weight, share, deadline)
        if slot is None:
            e, slot = self._elsewhere(e, weight, share, deadline)
            gate = self.gates[e]
        if slot is not None:
            self._send(call, e, slot, t)
            return
        recent = gate.signal.ttft_recent
        ttft = recent if recent is not None else 0.0  # the tier's TTFT statistics, empty at the start
        ahead = gate.ahead_of(deadline)
        urgent = call.ttft_limit <= URGENT_TTFT
        until = bound = deadline - ttft
        if urgent:
            bound = min(until, call.start + self.policy.max_queue_wait * call.ttft_limit)
        paced = gate.paced(ahead, weight, share)  # as the layer: only a limit that came down keeps it out
        if not paced:
            until = bound
        target = gate.controller.target(call.ttft_limit, gate.signal.ttft_floor)
        wait = gate.wait_for(ahead, weight, share, target if paced else None)
        if wait == float("inf"):
            wait = 0.0
        ok = t + wait <= until
        waiter = Waiter(deadline, until, weight, share, paced, bound, target) if ok else None
        if waiter is None or not gate.join(waiter):
            gate.refused += 1
            call.refuse(t)
            return
        call.replica, call.waiter = e, waiter
        self.waiting[e].append(call)
        self.cluster.events.push(until, "timer", call)

    def _elsewhere(self, e: int, weight: float, share: float, deadline: float) -> tuple[int, Slot | None]:
        best: tuple[float, int] | None = None
        for i, gate in enumerate(self.gates):
            if i == e:
                continue
            room = share * gate.controller.allowed - gate.load - gate.waiting
            if (room >= weight or (gate.in_flight == 0 and not gate.waiting)) and (best is None or room > best[0]):
                best = (room, i)
        if best is None:
            return e, None
        slot = self.gates[best[1]].try_take(weight, share, deadline)
        return (best[1], slot) if slot is not None else (e, None)

    def _send(self, call: Call, e: int, slot: Slot, t: float) -> None:
        call.slot, call.held = slot, self.gates[e].load
        self.peak = max(self.peak, self.gates[e].in_flight)
        self.replicas.states[e].in_flight += 1
        self.cluster.submit(e, call, t)

    def _settle(self, e: int, t: float) -> None:
        """Waiting calls the gate has just handed a slot to are sent; those it refused end."""
        line = self.waiting[e]
        if not line:
            return
        still: list[Call] = []
        for call in line:
            waiter = call.waiter
            assert waiter is not None
            if waiter.slot is not None:
                call.waiter = None
                self._send(call, e, waiter.slot, t)
            elif waiter.gone:
                call.waiter = None
                call.refuse(t)
                self.gates[e].refused += 1
            else:
                still.append(call)
        self.waiting[e] = still

    def timer(self, payload: object, t: float) -> None:
        """A waiting call's ``until``: still without a slot, it leaves the line, refused."""
        assert isinstance(payload, Call)
        call = payload
        if call.waiter is None or call.replica is None:
            return
        self.now = t
        waiter, e = call.waiter, call.replica
        self.waiting[e].remove(call)
        call.waiter = None
        self.gates[e].leave(waiter)
        call.refuse(t)
        self.gates[e].refused += 1
        self._settle(e, t)

    def first_token(self, call: Call, t: float) -> None:
        self.now = t
        assert call.replica is not None
        e, gate = call.replica, self.gates[call.replica]
        ttft = t - call.sent
        gate.signal.first_token(t, ttft)
        gate.controller.first_token(ttft, call.ttft_limit, call.held, gate.load, gate.signal.ttft_floor, call.share)
        self.replicas.succeeded(self.replicas.states[e], ttft, t)
        gate.hand_out()
        self._settle(e, t)

    def deadline(self, call: Call, t: float) -> None:
        """The first-token deadline fired: the attempt is abandoned, its slot freed, the limit taught."""
        self.now = t
        e = call.replica
        if call.waiter is not None:  # still in line (its ``until`` comes before the deadline: not expected)
            self.timer(call, t)
            return
        assert e is not None and call.slot is not None
        gate = self.gates[e]
        self.cluster.abort(call)
        self.replicas.states[e].in_flight -= 1
        call.slot.release()
        floor = gate.signal.ttft_floor
        gate.controller.first_token(t - call.sent, call.ttft_limit, call.held, gate.load, floor, call.share)
        call.outcome = "late"
        self._settle(e, t)

    def ended(self, call: Call, t: float, *, abandoned: bool) -> None:
        self.now = t
        e = call.replica
        assert e is not None and call.slot is not None and call.seq is not None
        self.replicas.states[e].in_flight -= 1
        if not abandoned:
            seq = call.seq
            duration = (seq.finished_at or t) - (seq.first_token_at or t)
            self.replicas.stream_finished(self.replicas.states[e], t, ok=True, tokens=seq.generated, duration=duration)
        call.slot.release()
        self._settle(e, t)


class Fleet(Client):
    """``--guards N``: N independent guards (as N processes, each with its own Guard) in front of the same engines,
    each sending every Nth call and learning its limits from its own first tokens only."""

    def __init__(self, guards: list[Guarded]) -> None:
        super().__init__(guards[0].cluster)
        self.guards = guards
        self.owner: dict[int, Guarded] = {}

    @property
    def peak(self) -> int:
        return max(g.peak for g in self.guards)

    def arrive(self, call: Call, t: float) -> None:
        guard = self.guards[next(self._turn) % len(self.guards)]
        self.owner[id(call)] = guard
        guard.arrive(call, t)

    def first_token(self, call: Call, t: float) -> None:
        self.owner[id(call)].first_token(call, t)

    def ended(self, call: Call, t: float, *, abandoned: bool) -> None:
        self.owner[id(call)].ended(call, t, abandoned=abandoned)

    def deadline(self, call: Call, t: float) -> None:
        self.owner[id(call)].deadline(call, t)

    def timer(self, payload: object, t: float) -> None:
        assert isinstance(payload, Call)
        self.owner[id(payload)].timer(payload, t)


class Budgeted(Client):
    """``tokens:B`` / ``calls:N``: a fixed budget per replica of what its calls in flight may add up to, in tokens
    (each call's prompt + ``max_tokens``) or in calls; ``tokens:learned`` / ``calls:learned``: that budget learned
    by the guard's `LimitController` from each first token, as the guard learns its limit (in tokens, its limits
    and growth are scaled by `CALL_TOKENS`). No line: a call goes to the replica with the most room left, and is
    refused at once when it fits on none (an idle replica takes any call). A call without its first token at its
    deadline is abandoned."""

    def __init__(self, cluster: Cluster, unit: str, budget: float | None, policy: Admission) -> None:
        super().__init__(cluster)
        self.unit = unit
        n = len(cluster.engines)
        scale = CALL_TOKENS if unit == "tokens" else 1
        self.learned = (
            None
            if budget is not None
            else [
                LimitController(
                    dataclasses.replace(
                        policy,
                        initial_limit=policy.initial_limit * scale,
                        min_limit=policy.min_limit * scale,
                        max_limit=policy.max_limit * scale,
                        growth=policy.growth * scale,
                    )
                )
                for _ in range(n)
            ]
        )
        self.budget = budget
        self.load = [0.0] * n
        self.held: dict[int, tuple[int, float, float]] = {}
        """Per call in flight: its replica, its weight, and the replica's load when it was sent (itself included)."""

    def room(self, e: int) -> float:
        limit = self.budget if self.learned is None else self.learned[e].limit
        assert limit is not None
        return limit - self.load[e]

    def arrive(self, call: Call, t: float) -> None:
        weight = float(call.work.prompt_tokens + call.work.max_tokens) if self.unit == "tokens" else 1.0
        e = max(range(len(self.load)), key=lambda i: (self.room(i), -i))
        if weight > self.room(e) and self.load[e] > 0:  # an idle replica takes any call
            call.refuse(t)
            return
        self.load[e] += weight
        self.held[id(call)] = (e, weight, self.load[e])
        self.cluster.submit(e, call, t)

    def first_token(self, call: Call, t: float) -> None:
        e, _, held = self.held[id(call)]
        self._learn(e, t - call.sent, call.ttft_limit, held)

    def deadline(self, call: Call, t: float) -> None:
        e, _, held = self.held[id(call)]
        self.cluster.abort(call)
        self.ended(call, t, abandoned=True)
        self._learn(e, t - call.sent, call.ttft_limit, held)
        call.outcome = "late"

    def _learn(self, e: int, ttft: float, tier_ttft: float, held: float) -> None:
        if self.learned is not None:
            self.learned[e].first_token(ttft, tier_ttft, round(held), round(self.load[e]))

    def ended(self, call: Call, t: float, *, abandoned: bool) -> None:
        found = self.held.pop(id(call), None)
        if found is not None:
            self.load[found[0]] -= found[1]


class Oracle(Client):
    """Clairvoyant greedy admission (see the module docstring)."""

    def arrive(self, call: Call, t: float) -> None:
        cluster = self.cluster
        order = sorted(range(len(cluster.engines)), key=lambda i: (len(cluster.live[i]), i))
        for e in order:
            if self._fits(e, call, t):
                cluster.submit(e, call, t)
                return
        call.refuse(t)

    def _fits(self, e: int, new: Call, t: float) -> bool:
        """Whether engine ``e``, simulated forward from ``t`` with ``new`` admitted, serves it and every call it
        holds within the SLO (later arrivals ignored: they are admitted only if they break nothing)."""
        cluster = self.cluster
        engine = cluster.engines[e]
        memo: dict[int, object] = {id(engine._rates.history): deque(maxlen=1), id(engine._rng): engine._rng}
        clone = copy.deepcopy(engine, memo)
        clone_seqs = {s.id: s for s in [*clone._running, *clone._waiting]}
        tracked: list[tuple[Call, Sequence]] = [(c, clone_seqs[i]) for i, c in cluster.live[e].items()]
        tracked.append((new, clone.submit(new.work, t + HALF_RTT)))
        step = cluster.next_step[e]
        now = t + HALF_RTT if step is None else step
        period = clone.config.step_period
        while tracked:
            clone.step(now)
            kept: list[tuple[Call, Sequence]] = []
            for call, seq in tracked:
                if seq.first_token_at is None:
                    if now + period + HALF_RTT - call.start > call.ttft_limit:
                        return False  # its first token cannot come in time any more
                elif seq.first_token_at + HALF_RTT - call.start > call.ttft_limit:
                    return False
                if not seq.done:
                    kept.append((call, seq))
                elif call.tier == "interactive" and _tpot(seq) > TPOT_SLO:
                    return False
            tracked = kept
            now += period
        return True


def _prompt_chars(request: PlannedRequest) -> int:
    """What the guard counts of the bench's request body (`llmguard_client._core.request.prompt_chars`)."""
    return prompt_chars(request_body(request, "sim-model")) or 0


def _tpot(seq: Sequence) -> float:
    if seq.first_token_at is None or seq.finished_at is None or seq.generated < 2:
        return 0.0
    return (seq.finished_at - seq.first_token_at) / (seq.generated - 1)


def run(
    policy: str,
    seed: int,
    profile: str = "spike",
    batch: float = 0.0,
    admission: Admission | None = None,
    calls: int | None = None,
    guards: int = 1,
) -> Result:
    """One policy over one seed's traffic (``calls``: fewer than the bench's 700 / 400, for a quick check;
    ``guards``: for ``adaptive`` and ``fixed:N``, that many independent guards sharing the traffic)."""
    plan: TrafficPlan = spike_plan(seed, calls or 700) if profile == "spike" else poisson_plan(seed, 40.0, calls or 400)
    tiers = assign(len(plan.requests), {"batch": batch}, seed) if batch else ("interactive",) * len(plan.requests)
    cluster = Cluster(make_engines(SCENARIO, seed))
    client: Client
    if policy == "plain":
        client = Client(cluster)
    elif policy == "oracle":
        if batch:
            raise SystemExit("--policy oracle models the interactive tier only (no --batch)")
        client = Oracle(cluster)
    elif policy == "adaptive" or policy.startswith("fixed:"):
        fixed = int(policy.split(":", 1)[1]) if policy.startswith("fixed:") else None
        each = [Guarded(cluster, admission or Admission(), fixed) for _ in range(guards)]
        client = each[0] if guards == 1 else Fleet(each)
    elif policy.startswith(("tokens:", "calls:")):
        unit, budget = policy.split(":", 1)
        learned = budget == "learned"
        client = Budgeted(cluster, unit, None if learned else float(budget), admission or Admission())
    else:
        raise SystemExit(f"unknown policy {policy!r}: plain, adaptive, fixed:N, tokens:B, calls:N or oracle")
    guarded = not isinstance(client, Oracle) and policy != "plain"
    made: list[Call] = []
    events = cluster.events
    for request, tier in zip(plan.requests, tiers, strict=True):
        events.push(request.arrival, "arrive", (request, tier))
    last_done = 0.0
    while events:
        t, kind, payload = events.pop()
        if kind == "step":
            cluster.step(payload, t)
        elif kind == "arrive":
            request, tier = payload
            call = Call(request, tier, t, engine_request(request), prompt_chars=_prompt_chars(request))
            made.append(call)
            events.push(t + TIERS[tier][0], "deadline", call)
            events.push(t + TIERS[tier][1], "total", call)
            client.arrive(call, t)
        elif kind == "timer":
            client.timer(payload, t)
        elif kind == "token":
            call = payload
            if call.outcome is None and call.ttft is None:
                call.ttft = t - call.start
                client.first_token(call, t)
        elif kind == "deadline":
            call = payload
            if call.outcome is None and call.ttft is None and guarded:
                client.deadline(call, t)
        elif kind == "total":
            call = payload
            if call.outcome is None:
                if call.seq is not None and call.waiter is None:
                    cluster.abort(call)
                    client.ended(call, t, abandoned=True)
                call.outcome = "cut" if call.ttft is not None else "late"
        elif kind == "done":
            call = payload
            if call.outcome is None:
                assert call.seq is not None
                call.tpot = _tpot(call.seq)
                call.completed, last_done = True, t
                client.ended(call, t, abandoned=False)
                call.outcome = _judge(call)
    for guard in client.guards if isinstance(client, Fleet) else [client] if isinstance(client, Guarded) else []:
        # every slot taken was given back, every call in line left it
        assert all(g.in_flight == 0 and g.waiting == 0 for g in guard.gates), "a slot or a place in line leaked"
        assert all(s.in_flight == 0 for s in guard.replicas.states)
    interactive = [c for c in made if c.tier == "interactive"]
    batch_calls = [c for c in made if c.tier == "batch"]
    counts: dict[str, float] = {name: sum(1 for c in interactive if c.outcome == name) for name in OUTCOMES}
    assert sum(counts.values()) == len(interactive), counts
    done = sum(1 for c in made if c.completed)
    return Result(
        outcomes=counts,
        interactive=len(interactive),
        batch_done=sum(1 for c in batch_calls if c.outcome == "done"),
        batch=len(batch_calls),
        work_tokens=sum(engine.stats.work_tokens for engine in cluster.engines),
        wasted_tokens=sum(engine.stats.aborted_work_tokens for engine in cluster.engines),
        done_per_s=done / (last_done - plan.requests[0].arrival) if last_done else 0.0,
        refused_p99=_p99([c.refused_after for c in made if c.refused_after is not None]),
        peak_in_flight=client.peak if isinstance(client, (Guarded, Fleet)) else 0,
        calls=made,
    )


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _judge(call: Call) -> str:
    """A completed call's outcome: a batch call is done when its first token came within its tier's ttft."""
    if call.tier == "batch":
        return "done" if call.ttft is not None and call.ttft <= call.ttft_limit else "late"
    if meets_slo(call.ttft, call.tpot):
        return "good"
    return "slow" if call.ttft is not None and call.ttft <= call.ttft_limit else "late"


def admission_settings(spec: str) -> tuple[Admission, dict[str, float]]:
    """``--set target=0.6,growth=2,margin=1.5``: `Admission` fields, and module constants (``margin``, ``used``)."""
    fields: dict[str, float | bool] = {}
    constants: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, value = part.partition("=")
        number = float(value)
        if name in CONSTANTS:
            constants[name] = number
        else:
            default = getattr(Admission(), name)  # Admission takes True/False for a switch and an int for a count
            if isinstance(default, bool):
                fields[name] = bool(number)
            else:
                fields[name] = int(number) if isinstance(default, int) else number
    return Admission(**fields), constants  # type: ignore[arg-type]


def patched(constants: dict[str, float]) -> Callable[[], None]:
    """Set the module constants for a run; returns the function that restores them."""
    kept = {name: getattr(*CONSTANTS[name]) for name in constants}
    for name, value in constants.items():
        setattr(*CONSTANTS[name], value)

    def restore() -> None:
        for name, value in kept.items():
            setattr(*CONSTANTS[name], value)

    return restore


def line(label: str, result: Result) -> str:
    o = result.outcomes
    n = result.interactive
    parts = " ".join(f"{100 * o[name] / n:5.1f}" for name in OUTCOMES[1:])
    batch = "" if result.batch_completed is None else f"  batch done {result.batch_completed:6.1%}"
    refused = "" if result.refused_p99 is None else f"  refused p99 {1000 * result.refused_p99:4.0f} ms"
    return (
        f"{label}  goodput {result.goodput:6.1%}  refused/late/slow/cut % {parts}  wasted {result.wasted:5.1%}  "
        f"{result.done_per_s:5.1f} done/s{refused}{batch}"
    )


def mean_result(results: Iterable[Result]) -> Result:
    found = list(results)
    n = len(found)
    return Result(
        outcomes={k: sum(r.outcomes[k] for r in found) / n for k in OUTCOMES},
        interactive=round(sum(r.interactive for r in found) / n),
        batch_done=round(sum(r.batch_done for r in found) / n),
        batch=round(sum(r.batch for r in found) / n),
        work_tokens=sum(r.work_tokens for r in found),
        wasted_tokens=sum(r.wasted_tokens for r in found),
        done_per_s=statistics.mean(r.done_per_s for r in found),
        refused_p99=max((r.refused_p99 for r in found if r.refused_p99 is not None), default=None),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=8, help="seeds 0..N-1 (default: 8)")
    parser.add_argument(
        "--policy", default="adaptive", help="comma-separated: plain, adaptive, fixed:N, tokens:B, calls:N, oracle"
    )
    parser.add_argument("--profile", choices=("spike", "0.8x"), default="spike")
    parser.add_argument("--batch", type=float, default=0.0, help="share of the calls on the batch tier")
    parser.add_argument("--set", default="", help="Admission fields and margin/used, e.g. target=0.6,margin=1.5")
    parser.add_argument("--calls", type=int, default=None, help="calls per run (default: the bench's 700 / 400)")
    parser.add_argument("--guards", type=int, default=1, help="independent guards sharing the calls (default: 1)")
    args = parser.parse_args(argv)
    admission, constants = admission_settings(args.set)
    print(f"{SCENARIO}, {args.profile}, batch share {args.batch:g}, {admission}, constants {constants or 'default'}")
    library = logging.getLogger("llmguard_client")
    level = library.level
    library.setLevel(logging.ERROR)  # the router's notes on slow replicas; restored for an in-process caller
    restore = patched(constants)
    try:
        for policy in args.policy.split(","):
            results = []
            for seed in range(args.seeds):
                results.append(run(policy, seed, args.profile, args.batch, admission, args.calls, args.guards))
                print(line(f"{policy:>9} seed {seed:2d}", results[-1]), flush=True)
            goodputs = [r.goodput for r in results]
            spread = statistics.stdev(goodputs) if len(goodputs) > 1 else 0.0
            print(line(f"{policy:>9} mean   ", mean_result(results)) + f"  (goodput sd {spread:.1%})", flush=True)
    finally:
        restore()
        library.setLevel(level)


if __name__ == "__main__":
    main()
