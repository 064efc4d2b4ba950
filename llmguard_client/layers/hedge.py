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

The winner is published on ``call.winner`` the moment it is known: if a deadline fires
while the losers are being closed, the deadline layer still delivers it.
"""

from __future__ import annotations

import math

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from llmguard_client._call import Call
from llmguard_client._config import HedgePolicy
from llmguard_client._outcome import AttemptFailure, Failed, Outcome, Route, Win
from llmguard_client._pipeline import Next
from llmguard_client._replicas import ReplicaSet, ReplicaState
from llmguard_client._ttft_stats import TTFTStats


class HedgeLayer:
    """Races hedges against the routed attempt; owns no per-call state."""

    def __init__(self, replicas: ReplicaSet, policy: HedgePolicy | None, ttft_stats: TTFTStats) -> None:
        self.replicas = replicas
        self.policy = policy
        self.ttft_stats = ttft_stats

    async def __call__(self, call: Call, route: Route, call_next: Next) -> Outcome:
        hedges = self._hedges_for(call)
        if not hedges:
            return await call_next(call, route)
        return await self._race(call, route, call_next, hedges)

    def _hedges_for(self, call: Call) -> int:
        if self.policy is None or not call.hedgeable or not call.guarded or len(self.replicas) < 2:
            return 0
        return self.policy.max_hedges

    async def _race(self, call: Call, route: Route, call_next: Next, hedges_left: int) -> Outcome:
        assert route.replica is not None and self.policy is not None
        clock = call.clock
        send, receive = anyio.create_memory_object_stream[Outcome](max_buffer_size=self.policy.max_hedges + 1)
        used: list[ReplicaState] = [route.replica]
        failures: list[AttemptFailure] = []
        delay = self.ttft_stats.hedge_delay(call.tier_name, call.record.stream, route.replica.name)
        if route.replica.health.drained and self.policy.delay is None:
            # A probe of a drained replica is expected to be slow: hedge it after a typical healthy TTFT.
            typical = self.ttft_stats.typical(call.tier_name, call.record.stream)
            delay = min(delay, max(self.policy.min_delay, typical))

        async def run(attempt_route: Route, out: MemoryObjectSendStream[Outcome]) -> None:
            async with out:
                out.send_nowait(await call_next(call, attempt_route))

        try:
            async with anyio.create_task_group() as tg:
                try:
                    tg.start_soon(run, route, send.clone())
                    running = 1
                    next_hedge_at = clock() + delay
                    while running:
                        result = await _receive_until(receive, next_hedge_at - clock())
                        if result is None:  # the hedge delay passed with no first token
                            next_hedge_at = math.inf
                            hedge = self._hedge_route(call, used) if hedges_left else None
                            if hedge is not None:
                                hedges_left -= 1
                                tg.start_soon(run, hedge, send.clone())
                                running += 1
                                next_hedge_at = clock() + delay if hedges_left else math.inf
                            continue
                        running -= 1
                        if isinstance(result, Win):
                            call.winner = result
                            break
                        failures.extend(result.failures)
                        if result.reason is not None:  # the guard itself stopped an attempt: end the round
                            return Failed(failures, result.reason)
                        if running and hedges_left and self.policy.on_failure:
                            next_hedge_at = clock()
                finally:
                    send.close()
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._settle_extras(call, receive)
            receive.close()
        return call.winner if call.winner is not None else Failed(failures)

    async def _settle_extras(self, call: Call, receive: MemoryObjectReceiveStream[Outcome]) -> None:
        """Results that arrived after the round was decided: a second winner in the same instant
        is closed; a winner that landed while a deadline was firing is adopted (if its token came
        in time), never orphaned."""
        for extra in _drain(receive):
            if not isinstance(extra, Win) or extra is call.winner:
                continue
            token = extra.attempt.first_token
            if call.winner is None and token is not None and token <= call.first_token_deadline:
                call.winner = extra
                continue
            extra.attempt.outcome = "lost"
            await call.lease.close_response(extra.response)
            extra.in_flight.release()
            call.observation.attempt_finished(extra.attempt)

    def _hedge_route(self, call: Call, used: list[ReplicaState]) -> Route | None:
        now = call.clock()
        if not self._hedge_allowed(call, now):
            return None
        state = self.replicas.pick_hedge(now, exclude=[*used, *call.failed_replicas])
        if state is None:
            return None
        payment = call.pay_extra()
        if payment is None:
            return None
        used.append(state)
        return Route(state, "hedge", payment)

    def _hedge_allowed(self, call: Call, now: float) -> bool:
        """No hedge while replicas signal overload, or when a new attempt could not make the deadline."""
        if self.replicas.any_cooling(now):
            return False
        remaining = call.first_token_deadline - now
        return remaining > self.ttft_stats.typical(call.tier_name, call.record.stream)


async def _receive_until(receive: MemoryObjectReceiveStream[Outcome], wait: float) -> Outcome | None:
    """The next attempt result, or None if ``wait`` seconds pass first."""
    if wait <= 0:
        try:
            return receive.receive_nowait()
        except anyio.WouldBlock:
            return None
    with anyio.move_on_after(wait):
        return await receive.receive()
    return None


def _drain(receive: MemoryObjectReceiveStream[Outcome]) -> list[Outcome]:
    out: list[Outcome] = []
    while True:
        try:
            out.append(receive.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            return out
