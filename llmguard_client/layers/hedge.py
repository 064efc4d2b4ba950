"""Hedged rounds: staggered attempts on different replicas, the first content token wins.

A round starts one attempt. If no first content token has arrived after the hedge
delay (fixed, or adaptive: read from the healthy replicas' recent time-to-first-token,
see `llmguard_client._ttft_stats`), the
same request goes to a *different* replica, paid from the shared budget. The first
attempt to produce a first content token (non-streaming: a complete successful body)
wins; every other attempt is cancelled and its connection closed, and the round
waits for that cleanup (as Polly does) so nothing outlives the call. A failure of one
attempt does not end the round while another is running, and it fires the next hedge
at once. Racing on response headers would do nothing for an SSE stream, whose headers
arrive before any token.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from llmguard_client._call import Call
from llmguard_client._config import HedgePolicy
from llmguard_client._replicas import ReplicaSet, ReplicaState
from llmguard_client._ttft_stats import TTFTStats
from llmguard_client.layers.attempt import AttemptFailure, AttemptResult, AttemptWin, run_attempt
from llmguard_client.telemetry.record import AttemptKind

RoundResult = AttemptWin | list[AttemptFailure]
"""A round ends with a winner, or with the failures of all its attempts."""


class Hedger:
    """Runs rounds of attempts for calls; owns no per-call state."""

    def __init__(
        self,
        replicas: ReplicaSet,
        policy: HedgePolicy | None,
        clock: Callable[[], float] = time.monotonic,
        ttft_stats: TTFTStats | None = None,
    ) -> None:
        self.replicas = replicas
        self.policy = policy
        self.ttft_stats = ttft_stats or TTFTStats(
            policy or HedgePolicy(), replicas.router.degraded, lambda: replicas.router.epoch
        )
        """TTFT per replica (owned by the Guard when it passes one): the hedge delay and typical TTFT."""
        self._clock = clock

    def _hedges_for(self, call: Call) -> int:
        if self.policy is None or not call.hedgeable or not call.guarded or len(self.replicas) < 2:
            return 0
        return self.policy.max_hedges

    def _hedge_allowed(self, call: Call, now: float) -> bool:
        """No hedge while replicas signal overload, or when a new attempt could not make the deadline."""
        if self.replicas.any_cooling(now):
            return False
        remaining = call.first_token_deadline - now
        return remaining > self.ttft_stats.typical(call.tier_name, call.record.stream)

    async def run_round(self, call: Call, first: ReplicaState, kind: AttemptKind) -> RoundResult:
        """One primary (or retry) attempt on ``first``, plus hedges; see the module docstring."""
        clock = self._clock
        send, receive = anyio.create_memory_object_stream[AttemptResult](max_buffer_size=16)
        used: list[ReplicaState] = [first]
        failures: list[AttemptFailure] = []
        winner: AttemptWin | None = None
        hedges_left = self._hedges_for(call)
        delay = self.ttft_stats.hedge_delay(call.tier_name, call.record.stream) if hedges_left else math.inf
        if hedges_left and first.health.drained and self.policy is not None and self.policy.delay is None:
            # A probe of a drained replica is expected to be slow: hedge it after a typical healthy TTFT.
            typical = self.ttft_stats.typical(call.tier_name, call.record.stream)
            delay = min(delay, max(self.policy.min_delay, typical))

        def lost() -> bool:
            return winner is not None

        try:
            async with send, anyio.create_task_group() as tg:
                tg.start_soon(run_attempt, call, first, kind, send.clone(), lost, clock)
                running = 1
                next_hedge_at = clock() + delay
                while running:
                    result = await _receive_until(receive, next_hedge_at - clock())
                    if result is None:  # the hedge delay passed with no first token
                        next_hedge_at = math.inf
                        state = self._hedge_target(call, used) if hedges_left else None
                        if state is not None:
                            hedges_left -= 1
                            used.append(state)
                            tg.start_soon(run_attempt, call, state, "hedge", send.clone(), lost, clock)
                            running += 1
                            next_hedge_at = clock() + delay if hedges_left else math.inf
                        continue
                    running -= 1
                    if isinstance(result, AttemptWin):
                        winner = result
                        break
                    failures.append(result)
                    if running and hedges_left and self.policy is not None and self.policy.on_failure:
                        next_hedge_at = clock()
                tg.cancel_scope.cancel()
        finally:
            # A second attempt may have won in the same instant; it was never handed to anyone.
            with anyio.CancelScope(shield=True):
                for extra in _drain(receive):
                    if isinstance(extra, AttemptWin) and extra is not winner:
                        extra.attempt.outcome = "lost"
                        extra.state.in_flight -= 1
                        await extra.aclose()
                        call.observation.attempt_finished(extra.attempt)
            receive.close()
        return winner if winner is not None else failures

    def _hedge_target(self, call: Call, used: list[ReplicaState]) -> ReplicaState | None:
        now = self._clock()
        if not self._hedge_allowed(call, now):
            return None
        state = self.replicas.pick_hedge(now, exclude=[*used, *call.failed_replicas])
        if state is None:
            return None
        # The ticket is spent as the hedge starts; a hedge cancelled in the instant before it sends is not
        # refunded (a known, tiny over-count; retries refund a ticket cancelled during their wait).
        if call.budget is not None and call.budget.try_acquire() is None:
            call.observation.budget_refused(call.record)
            return None
        return state


async def _receive_until(
    receive: MemoryObjectReceiveStream[AttemptResult], wait: float
) -> AttemptResult | None:
    """The next attempt result, or None if ``wait`` seconds pass first."""
    if wait <= 0:
        try:
            return receive.receive_nowait()
        except anyio.WouldBlock:
            return None
    with anyio.move_on_after(wait):
        return await receive.receive()
    return None


def _drain(receive: MemoryObjectReceiveStream[AttemptResult]) -> list[AttemptResult]:
    out: list[AttemptResult] = []
    while True:
        try:
            out.append(receive.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            return out
