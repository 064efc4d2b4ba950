"""`AdmissionLayer`: each attempt takes a slot on its replica's gate before it is sent.

It sits between the hedge layer and the rate limit, because the limit is per replica and the replica is known
only once the retry layer (or a hedge) has picked it; it runs before the rate limit, so that a call waiting for
a slot holds no share of the provider's limit. A call whose replica has no free slot goes to another replica
with one (the router does not see the lines); failing that it waits in its replica's line (earliest deadline
first) for at most ``max_queue_wait x ttft`` (a call of a longer tier than the most urgent one, or one kept out
only by a limit that came down with no sign of overload: as long as its first token can still come in time),
if at the rate slots free up (or, paced, as the limit grows) it would get one in that time and still its first
token before its deadline; otherwise it is refused at once with `Overloaded` and a computed ``retry_after``
(the line ahead of it divided by that rate). ``max_waiting`` bounds the line, every tier's calls counted (a
batch job of thousands of calls waiting in it would hold the limit's growth at its load, and the calls that cannot
wait would then queue behind them in the engine). A
call of a longer tier takes a slot only under ``1 - reserve`` of the limit: the rest is kept for the calls that
cannot wait. A hedge never waits: one without a free slot is not sent, and the round goes on. A continuation is
not held back: it finishes an answer already admitted.

What each attempt ends with teaches the replica's `LimitController`: its first token against the tier's TTFT
target, a first-token deadline that fired (a late first token), an overload answer, and the server's own report
of its queue longer than ``max_server_queue``. That report lives with the replica's health, where the router
reads it too, whichever way it came: vLLM's ORCA header on a non-streamed answer (read here) or its ``/metrics``
(`llmguard_client.server_hints`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from llmguard_client._admission.controller import LimitController
from llmguard_client._admission.policy import Admission
from llmguard_client._admission.queue import ReplicaGate, Slot, Waiter
from llmguard_client._admission.signal import ORCA_FORMAT_HEADER, ORCA_HEADER, LoadSignal, parse_orca
from llmguard_client._admission.size import CallSizes
from llmguard_client._admission.view import AdmissionSnapshot
from llmguard_client._core.call import Call
from llmguard_client._core.outcome import Failed, Outcome, Route, Win
from llmguard_client._core.pipeline import Next
from llmguard_client._routing.health import server_kv_usage, server_waiting
from llmguard_client._routing.replicas import ReplicaSet, ReplicaState
from llmguard_client.config import deadline_text
from llmguard_client.errors import Overloaded

__all__ = ["AdmissionLayer"]

SLO_TTFT_HEADER = b"x-slo-ttft-ms"
"""The caller's time-to-first-token objective, as llm-d's SLO-aware scheduling reads it."""
MIN_RETRY_AFTER_S = 0.05
MAX_RETRY_AFTER_S = 60.0


class AdmissionLayer:
    """Per-replica adaptive admission (a no-op without an `Admission` policy)."""

    def __init__(
        self,
        policy: Admission | None,
        clock: Callable[[], float],
        replica_set: ReplicaSet,
        urgent_ttft: float = 0.0,
    ) -> None:
        self.policy = policy
        self.clock = clock
        self.urgent_ttft = urgent_ttft
        """The shortest ``ttft`` of the Guard's tiers: calls with no longer one are the most urgent."""
        self.replicas = tuple(replica_set.states)
        """Where a call whose replica is full may go instead (any with a free slot, healthy, not avoided)."""
        self.server_load = replica_set.router.server_load
        """Where a replica's own load report goes: its health, which the router reads too."""
        self.gates: dict[str, ReplicaGate] = {}
        self.sizes = CallSizes()
        """The average call's size, which each attempt's weight is measured against."""

    def gate(self, name: str) -> ReplicaGate:
        gate = self.gates.get(name)
        if gate is None:
            assert self.policy is not None
            policy = self.policy
            gate = self.gates[name] = ReplicaGate(LimitController(policy), LoadSignal(), policy.max_waiting, self.clock)
        return gate

    async def __call__(self, call: Call, route: Route, call_next: Next) -> Outcome:
        policy, state = self.policy, route.replica
        if policy is None or state is None or route.kind == "continuation":
            return await call_next(call, route)
        gate = self.gate(state.name)
        if policy.ask_load_reports and not call.record.stream:
            _ask_for_load_report(call)
        deadline = call.first_token_deadline if route.deadline is None else route.deadline
        weight = self.sizes.weight(call.prompt_size(), call.record.max_tokens) if policy.by_size else 1.0
        share = 1.0 if self._urgent(call) else 1.0 - policy.reserve
        slot = gate.try_take(weight, share, deadline)
        if slot is None and route.kind != "hedge":
            moved = self._elsewhere(call, route, weight, share, deadline)
            if moved is not None:
                route, gate, slot = moved
        if slot is None:
            if route.kind == "hedge":
                return Failed()  # not sent: the round goes on with the attempts it has
            taken = await self._wait(call, gate, deadline, weight, share)
            if isinstance(taken, Overloaded):
                return Failed(reason=taken)
            slot = taken
        if policy.send_slo:
            _set_slo(call, deadline)  # what is left once the slot is taken
        sent, held = call.clock(), gate.load
        try:
            outcome = await call_next(call, route)
        except BaseException:
            slot.release()
            now = call.clock()
            if now >= deadline:  # the first-token deadline fired: a first token later than the tier allows
                floor = gate.signal.ttft_floor
                gate.controller.first_token(now - sent, call.tier.ttft, held, gate.load, floor, share)
            raise
        assert route.replica is not None
        self._learn(call, route.replica, gate, outcome, sent, held, share)
        if isinstance(outcome, Win):
            call.lease.hold(slot.release)  # the winner's stream holds its slot until the call ends
        else:
            slot.release()
        gate.hand_out()
        return outcome

    def _elsewhere(
        self, call: Call, route: Route, weight: float, share: float, deadline: float
    ) -> tuple[Route, ReplicaGate, Slot] | None:
        """A free slot on another replica (healthy, not avoided), the one with the most room, for a call whose
        replica is full: the router does not see the gates' lines."""
        now = call.clock()
        best: tuple[float, ReplicaState, ReplicaGate] | None = None
        for state in self.replicas:
            if state is route.replica or state in route.avoid or state.cooling(now) or state.open(now):
                continue
            gate = self.gate(state.name)
            room = share * gate.controller.allowed - gate.load - gate.waiting
            if (room >= weight or (gate.in_flight == 0 and not gate.waiting)) and (best is None or room > best[0]):
                best = (room, state, gate)
        if best is None:
            return None
        _, state, gate = best
        slot = gate.try_take(weight, share, deadline)
        return None if slot is None else (dataclasses.replace(route, replica=state), gate, slot)

    async def _wait(
        self, call: Call, gate: ReplicaGate, deadline: float, weight: float, share: float
    ) -> Slot | Overloaded:
        """A slot within the time that still leaves a first token before ``deadline``, or the refusal."""
        now = call.clock()
        ttft = self._ttft(call, gate)
        ahead = gate.ahead_of(deadline)
        urgent = self._urgent(call)
        until = bound = min(deadline - ttft, now + call.pool_wait)  # at most the caller's pool timeout
        if urgent and math.isfinite(call.tier.ttft):  # the most urgent tier's wait is bounded: its caller learns
            # a refusal early (a tier without a ttft deadline waits until a slot frees up)
            started = call.first_token_deadline - call.tier.ttft  # the caller's wait began with the call
            bound = min(until, started + policy_wait(self.policy, call))
        paced = gate.paced(ahead, weight, share)  # kept out only by a limit that came down, no sign of overload
        if not paced:
            until = bound
        target = gate.controller.target(call.tier.ttft, gate.signal.ttft_floor)
        wait = gate.wait_for(ahead, weight, share, target if paced else None)
        if wait == float("inf"):
            wait = 0.0  # nothing freed yet to measure a rate: the wait below is bounded by the deadline anyway
        if now + wait > until:
            return self._refused(call, gate, ahead, weight, "no replica slot frees up in time")
        waiter = Waiter(deadline, until, weight, share, paced, bound, target)
        if not gate.join(waiter):
            return self._refused(call, gate, ahead, weight, f"{gate.waiting} calls already wait for this replica")
        try:
            with call.phase_until(until):  # Guard.aclose() ends it too
                await waiter.event.wait()
        except BaseException:
            gate.leave(waiter)
            raise
        if waiter.slot is None:
            gate.leave(waiter)
            return self._refused(call, gate, gate.ahead_of(deadline), weight, "no slot freed up in time")
        return waiter.slot

    def _urgent(self, call: Call) -> bool:
        """Whether the call is of the most urgent tier (no longer ``ttft`` than any of the Guard's tiers)."""
        return call.tier.ttft <= self.urgent_ttft

    @staticmethod
    def _ttft(call: Call, gate: ReplicaGate) -> float:
        """How long an admitted attempt on this replica takes to its first token now."""
        recent = gate.signal.ttft_recent
        return recent if recent is not None else call.expected_ttft()

    def _learn(
        self,
        call: Call,
        state: ReplicaState,
        gate: ReplicaGate,
        outcome: Outcome,
        sent: float,
        held: float,
        share: float,
    ) -> None:
        assert self.policy is not None
        now = call.clock()
        controller, signal = gate.controller, gate.signal
        if isinstance(outcome, Win):
            signal.first_token(now, now - sent)
            controller.first_token(now - sent, call.tier.ttft, held, gate.load, signal.ttft_floor, share)
            headers = [outcome.response.headers]
        else:
            headers = [f.headers for f in outcome.failures if not f.torn]  # a torn answer teaches nothing
            if any(f.overload for f in outcome.failures):
                signal.overloaded(now)
                controller.overload(held)
        for found in headers:
            report = found.get(ORCA_HEADER)
            if report is not None:
                waiting, kv = parse_orca(report)
                self.server_load(state, now, waiting=waiting, kv_usage=kv, fresh_for=self.policy.signal_fresh_for)
        waiting = server_waiting(state.health, now)
        if waiting is not None and waiting > self.policy.max_server_queue:
            controller.overload(held)

    def _refused(self, call: Call, gate: ReplicaGate, ahead: float, weight: float, why: str) -> Overloaded:
        gate.refused += 1
        rate = gate.rate()
        backlog = ahead + weight
        seconds = backlog / rate if rate > 0 else self._ttft(call, gate)
        retry_after = min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, seconds))
        return Overloaded(
            f"the replica cannot give this call its first token within the ttft deadline of tier "
            f"{call.tier_name!r} ({deadline_text(call.tier.ttft)}): {why} ({gate.in_flight} in flight of a learned "
            f"limit of {gate.controller.allowed}, {ahead:.1f} ahead in line, {rate:.1f} slots freed/s); refused before "
            f"it was sent, retry after {retry_after:.2f}s",
            request=call.request,
            record=call.record,
            retry_after=retry_after,
        )

    def snapshot(self, now: float) -> dict[str, AdmissionSnapshot]:
        """Each replica's learned limit, slots, line and load signal at ``now``."""
        out: dict[str, AdmissionSnapshot] = {}
        health = {state.name: state.health for state in self.replicas}
        for name, gate in self.gates.items():
            signal, reported = gate.signal, health[name]
            out[name] = AdmissionSnapshot(
                limit=gate.controller.allowed,
                in_flight=gate.in_flight,
                waiting=gate.waiting,
                refused=gate.refused,
                slots_freed_per_s=gate.rate(),
                ttft_floor=signal.ttft_floor,
                ttft_recent=signal.ttft_recent,
                server_waiting=server_waiting(reported, now),
                server_kv_usage=server_kv_usage(reported, now),
                signal_age=now - reported.reported_at,
            )
        return out


def policy_wait(policy: Admission | None, call: Call) -> float:
    """The longest a call of this tier waits in a replica's line."""
    assert policy is not None
    return policy.max_queue_wait * call.tier.ttft


def _set_slo(call: Call, deadline: float) -> None:
    """``x-slo-ttft-ms``: the milliseconds this attempt has left for its first token (replacing a previous
    attempt's); none for a call without a first-token deadline (the default tier's), which has no SLO to send."""
    if not math.isfinite(deadline):
        return
    left = max(0, int((deadline - call.clock()) * 1000))
    call.headers[:] = [(k, v) for k, v in call.headers if k.lower() != SLO_TTFT_HEADER]
    call.headers.append((SLO_TTFT_HEADER, str(left).encode()))


def _ask_for_load_report(call: Call) -> None:
    """Ask the engine for its ORCA load report on this (non-streamed) call's answers, once."""
    if not any(name == ORCA_FORMAT_HEADER for name, _ in call.headers):
        call.headers.append((ORCA_FORMAT_HEADER, b"text"))
