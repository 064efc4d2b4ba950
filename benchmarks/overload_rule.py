"""The cool-down rule in the overload scenario, in virtual time: no load generator that can fall behind.

    python -m benchmarks.overload_rule [--seeds 24] [--rule holds|ties] [--budget-floor 4]

Each seed replays the bench's ``overload`` traffic (700 calls, the 30 -> 140 -> 30 rps spike, the same plan
as ``llmguard bench --sim overload --seed N``) against three of the scenario's engines
(`llmguard_tools.sim.engine.Engine`, stepped every 40 ms of virtual time, 3 ms of network each way; a refusal
carries the engine's Retry-After, backlog / token rate) through two clients:

- plain: one attempt per call, round-robin over the replicas;
- guarded: the guard's own `ReplicaSet` chooses each first attempt, retry and wait (``pick``, ``pick_ready``,
  ``cooling_wait``, ``cool_down``, ``succeeded``: the cool-down rule's one code path) under a model of the
  retry layer: a refused call goes at once to a replica that is not cooling, else waits for the first
  cool-down to end if that fits its 1 s first-token deadline, at most 3 attempts, paid from a budget of
  10 % of the calls + ``--budget-floor`` (4) per 10 s; a call without a first token at 1 s is abandoned. No hedges.

``--rule ties`` replaces the rule by the one before it (a cooling replica took first attempts, losing only
ties). Goodput is the bench's: TTFT <= 1 s and TPOT <= 80 ms. Both clients see identical engines, so the
ratio moves only with the routing. Per seed it prints the server work done (guarded / plain), the refusals of
first attempts and retries, the retries sent and the refused calls given up (no retry fits the deadline / the
budget is spent), and "held off": replica-seconds in which a cooling replica had room for a median call
while another replica was ready (capacity the rule left unused).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

import llmguard_client._routing.replicas as replicas_module
from benchmarks._virtual_cluster import HALF_RTT, engine_request, make_engines, meets_slo, spike_plan
from llmguard_client import BudgetPolicy, Replica
from llmguard_client._routing.replicas import ReplicaSet, ReplicaState
from llmguard_tools.bench.traffic import PlannedRequest
from llmguard_tools.sim.engine import Rejected, Sequence
from llmguard_tools.sim.scenarios import get_scenario

TTFT_DEADLINE = 1.0
MAX_ATTEMPTS = 3
EXPECTED_TTFT = 0.1
"""What a retry must still leave before the deadline (the guard uses the tier's recent TTFT)."""
TICK = 0.01
ROOM = 80
"""KV tokens a median call reserves (prompt + reserved output): a replica with this much free had room."""


@dataclass
class _Call:
    request: PlannedRequest
    start: float
    attempts: int = 1
    refused_by: list[ReplicaState] = field(default_factory=list)
    seq: tuple[int, Sequence] | None = None
    """The replica and engine request of the attempt in progress."""
    ttft: float | None = None
    tpot: float | None = None
    outcome: str | None = None


@dataclass
class Result:
    goodput: float
    work_tokens: int
    refused_first: int = 0
    refused_retry: int = 0
    retries: int = 0
    gave_up_deadline: int = 0
    gave_up_budget: int = 0
    held_off: float = 0.0
    """Replica-seconds a cooling replica had room for a call while another replica was ready."""


@contextmanager
def rule(name: str) -> Iterator[None]:
    """``holds``: the current rule; ``ties``: every candidate may take a first attempt (a cooling one loses ties)."""
    kept = getattr(replicas_module, "first_attempt_candidates")  # noqa: B009 (not exported: patched for a run)
    if name == "ties":
        setattr(replicas_module, "first_attempt_candidates", lambda candidates, now: candidates)  # noqa: B010
    try:
        yield
    finally:
        setattr(replicas_module, "first_attempt_candidates", kept)  # noqa: B010


def run(client: str, seed: int, floor: int = BudgetPolicy().floor) -> Result:
    """One client over one seed's traffic; see the module docstring."""
    engine_config = get_scenario("overload").engine
    plan = spike_plan(seed)
    engines = make_engines("overload", seed)
    rs = ReplicaSet(
        [Replica(f"http://r{i}") for i in range(3)], lambda r: httpx.MockTransport(lambda q: httpx.Response(200))
    )
    index = {id(s): i for i, s in enumerate(rs.states)}
    events: list[tuple[float, int, str, Any]] = []
    order = itertools.count()
    turn = itertools.count()
    stepping = [False] * 3
    live: dict[tuple[int, int], tuple[_Call, float, Sequence]] = {}
    calls: list[_Call] = []
    retried_at: list[float] = []
    result = Result(0.0, 0)

    def push(t: float, kind: str, payload: Any) -> None:
        heapq.heappush(events, (t, next(order), kind, payload))

    def budget_left(t: float) -> float:
        firsts = sum(1 for c in calls if t - 10.0 < c.start <= t)
        return floor + 0.1 * firsts - sum(1 for r in retried_at if r > t - 10.0)

    def send(t: float, call: _Call, e: int, first: bool) -> None:
        rs.states[e].in_flight += 1
        try:
            seq = engines[e].submit(engine_request(call.request), t + HALF_RTT)
        except Rejected as refused:
            push(t + 2 * HALF_RTT, "refused", (call, e, refused.retry_after_s, first))
            return
        call.seq = (e, seq)
        live[(e, seq.id)] = (call, t, seq)
        if not stepping[e]:
            stepping[e] = True
            push(t + HALF_RTT, "step", e)

    def end(call: _Call, outcome: str) -> None:
        call.outcome = outcome

    for request in plan.requests:
        push(request.arrival, "arrive", request)
    push(0.0, "tick", None)
    limit = engine_config.kv_tokens * engine_config.headroom
    while events:
        t, _, kind, payload = heapq.heappop(events)
        if kind == "tick":
            if any(c.outcome is None for c in calls) or t < plan.requests[-1].arrival:
                push(t + TICK, "tick", None)
            if not all(s.cooling(t) for s in rs.states):
                result.held_off += TICK * sum(
                    1
                    for s, engine in zip(rs.states, engines, strict=True)
                    if s.cooling(t) and limit - engine.reserved >= ROOM
                )
        elif kind == "arrive":
            call = _Call(payload, t)
            calls.append(call)
            if client == "plain":
                send(t, call, next(turn) % 3, True)
                continue
            chosen = rs.pick(t)
            assert chosen is not None
            push(t + TTFT_DEADLINE, "deadline", call)
            send(t, call, index[id(chosen)], True)
        elif kind == "step":
            e = payload
            engines[e].step(t)
            for key, (call, sent, seq) in list(live.items()):
                if key[0] != e:
                    continue
                if seq.first_token_at is not None and call.ttft is None:
                    call.ttft = seq.first_token_at + HALF_RTT - call.start
                    if client != "plain":
                        rs.succeeded(rs.states[e], seq.first_token_at + HALF_RTT - sent, t)
                if seq.done:
                    del live[key]
                    rs.states[e].in_flight -= 1
                    assert seq.first_token_at is not None and seq.finished_at is not None
                    duration = seq.finished_at - seq.first_token_at
                    call.tpot = duration / (seq.generated - 1) if seq.generated > 1 else None
                    end(call, "ok")
                    if client != "plain":
                        rs.stream_finished(rs.states[e], t, ok=True, tokens=seq.generated, duration=duration)
            if not engines[e].idle:
                push(t + engine_config.step_period, "step", e)
            else:
                stepping[e] = False
        elif kind == "deadline":
            call = payload
            if call.outcome is None and call.ttft is None:
                if call.seq is not None and (call.seq[0], call.seq[1].id) in live:
                    e, seq = call.seq
                    engines[e].abort(seq, by_disconnect=True)
                    del live[(e, seq.id)]
                    rs.states[e].in_flight -= 1
                end(call, "timeout")
        elif kind == "refused":
            call, e, retry_after, first = payload
            state = rs.states[e]
            state.in_flight -= 1
            if first:
                result.refused_first += 1
            else:
                result.refused_retry += 1
            if client == "plain" or call.outcome is not None:
                if call.outcome is None:
                    end(call, "refused")
                continue
            rs.cool_down(state, t, retry_after)
            call.refused_by.append(state)
            plan_ = _retry_plan(rs, t, call, state)
            if plan_ is None:
                result.gave_up_deadline += 1
                end(call, "refused")
            elif budget_left(t) < 1:
                result.gave_up_budget += 1
                end(call, "refused")
            else:
                wait, target = plan_
                retried_at.append(t)
                result.retries += 1
                call.attempts += 1
                push(t + wait, "retry", (call, index[id(target)]))
        elif kind == "retry":
            call, e = payload
            if call.outcome is None:
                send(t, call, e, False)
    good = sum(1 for c in calls if c.outcome == "ok" and meets_slo(c.ttft, c.tpot))
    result.goodput = good / len(calls)
    result.work_tokens = sum(engine.stats.work_tokens for engine in engines)
    return result


def _retry_plan(rs: ReplicaSet, now: float, call: _Call, refused: ReplicaState) -> tuple[float, ReplicaState] | None:
    """(wait, replica) of the retry, as `llmguard_client._layers.retry` plans it; None: it does not fit."""
    if call.attempts >= MAX_ATTEMPTS:
        return None
    deadline = call.start + TTFT_DEADLINE
    target = rs.pick_ready(now, call.refused_by) or rs.pick_ready(now)
    wait = 0.0
    if target is None:
        soonest = rs.cooling_wait(now)
        if soonest is None or now + soonest + EXPECTED_TTFT > deadline:
            return None
        wait, target = soonest, rs.pick(now + soonest) or refused
    elif target is refused:
        wait = 0.05
    return (wait, target) if now + wait + EXPECTED_TTFT <= deadline else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=24, help="seeds 0..N-1 (default: 24)")
    parser.add_argument("--rule", choices=("holds", "ties"), default="holds")
    parser.add_argument(
        "--budget-floor",
        type=int,
        default=BudgetPolicy().floor,
        help="the retry budget's floor (default: BudgetPolicy's, 4)",
    )
    args = parser.parse_args()
    ratios: list[float] = []
    held_off: list[float] = []
    print(f"rule: {args.rule}, budget: 10 % of the calls + {args.budget_floor} per 10 s")
    print("seed  plain  guarded  ratio  work ratio  refused 1st/retry  retries  gave up deadline/budget  held off")
    for seed in range(args.seeds):
        plain = run("plain", seed)
        with rule(args.rule):
            guarded = run("guarded", seed, args.budget_floor)
        ratios.append(guarded.goodput / plain.goodput)
        held_off.append(guarded.held_off)
        print(
            f"{seed:4d}  {plain.goodput:5.1%}  {guarded.goodput:7.1%}  {ratios[-1]:.3f}  "
            f"{guarded.work_tokens / plain.work_tokens:10.3f}  {guarded.refused_first:7d}/{guarded.refused_retry:<5d}  "
            f"{guarded.retries:7d}  {guarded.gave_up_deadline:11d}/{guarded.gave_up_budget:<12d}  "
            f"{guarded.held_off:.2f} s",
            flush=True,
        )
    spread = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
    print(
        f"guarded goodput / plain's over {len(ratios)} seeds: mean {statistics.mean(ratios):.3f}, sd {spread:.3f}, "
        f"min {min(ratios):.3f}, max {max(ratios):.3f}, >= 1.0 in {sum(r >= 1.0 for r in ratios)}; "
        f"held off {statistics.mean(held_off):.2f} replica-s per run"
    )


if __name__ == "__main__":
    main()
