"""Hedged rounds: staggered attempts on different replicas, the first content token wins.

A round starts one attempt. If no first content token has arrived after the hedge
delay (fixed, or adaptive: read from the healthy replicas' recent time-to-first-token,
see `llmguard_client._routing.ttft_stats`), the
same request goes to a *different* replica, paid from the shared budget. The first
attempt to produce a first content token (non-streaming: a complete successful body)
wins; every other attempt is cancelled and its connection closed, and the round
waits for that cleanup (as Polly does) so nothing outlives the call. A failure of one
attempt does not end the round while another is running, and it fires the next hedge
at once. Racing on response headers would do nothing for an SSE stream, whose headers
arrive before any token.

The routed (primary) attempt runs in the caller's own task; a hedge, when the delay passes,
runs in a task of its own. Most calls get their first token before the delay, so most rounds
start no task at all. The delay is one timer and the hedges are tasks of the call's time source
(`llmguard_client._core.clock.TimeSource.tasks`): on asyncio a loop timer and loop tasks the round
joins itself (no task group to enter and leave on every call), elsewhere a task group. Either way
each hedge's task is registered with the call's lease, so ``Guard.aclose()`` cancels it at once.
A hedge that wins cancels the primary.

A server that reports a queue at the primary's replica (`llmguard_client.server_hints`, or vLLM's load header)
while another replica's reports none fires the hedge at once: the primary would wait behind that queue.

The winner is recorded in the route's `Race` (the deadline layer's) the moment it is known: if a
deadline fires while the losers are being closed, the deadline layer still delivers it. The round
returns its winner as a value; hedges avoid the replicas the retry layer passes on the route.
"""

from __future__ import annotations

import contextvars
from collections import deque

import anyio

from llmguard_client._core.call import Call
from llmguard_client._core.clock import Tasks, TimerHandle
from llmguard_client._core.outcome import AttemptFailure, Failed, Outcome, Race, Route, Win, close_unread
from llmguard_client._core.pipeline import Next
from llmguard_client._layers.deadline import fits_deadline
from llmguard_client._routing.replicas import ReplicaSet, ReplicaState
from llmguard_client._routing.ttft_stats import TTFTStats
from llmguard_client.config import HedgePolicy
from llmguard_client.errors import GuardClosed


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
        policy = self.policy
        if policy is None or not call.hedgeable or len(self.replicas) < 2:
            return 0
        if not call.record.stream and not policy.non_streaming:  # a whole answer per hedge: `HedgePolicy`
            return 0
        return policy.max_hedges

    def _delay(self, call: Call, primary: ReplicaState) -> float:
        assert self.policy is not None
        cached = self.replicas.expected_hit(call.affinity_key, primary)
        size = call.ttft_size
        delay = self.ttft_stats.hedge_delay(call.tier_name, call.record.stream, primary.name, cached, size)
        if primary.health.drained and self.policy.delay is None:
            # A probe of a drained replica is expected to be slow: hedge it after a typical healthy TTFT.
            typical = self.ttft_stats.typical(call.tier_name, call.record.stream, size)
            delay = min(delay, max(self.policy.min_delay, typical))
        return delay

    async def _race(self, call: Call, route: Route, call_next: Next, hedges: int) -> Outcome:
        assert route.replica is not None and self.policy is not None
        race = route.race if route.race is not None else Race()
        round_ = _Round(self, call, route, race, call_next, hedges, self._delay(call, route.replica))
        try:
            async with call.time.tasks(call.lease, round_.stop) as tasks:
                round_.begin(tasks)
                outcome = await round_.run(route)
        finally:
            if round_.results:  # a second winner, or one that landed as a deadline fired
                with anyio.CancelScope(shield=True):
                    await self._settle_extras(call, race, round_.results)
        if outcome is None:
            outcome = race.winner if race.winner is not None else Failed(round_.failures)
        if isinstance(outcome, Win) and round_.failures:  # the failures' answers go to nobody
            await close_unread(call.lease, round_.failures)
        return outcome

    async def _settle_extras(self, call: Call, race: Race, results: deque[Outcome]) -> None:
        """Results that arrived after the round was decided: a second winner in the same instant
        is closed; a winner that landed while a deadline was firing is adopted (if its token came
        in time), never orphaned."""
        while results:
            extra = results.popleft()
            if isinstance(extra, Failed):  # judged by nobody: its answer goes to nobody
                await close_unread(call.lease, extra.failures)
            if not isinstance(extra, Win) or extra is race.winner:
                continue
            token = extra.attempt.first_token
            if race.winner is None and token is not None and token <= call.first_token_deadline:
                race.winner = extra
                continue
            extra.attempt.attempt_outcome("lost")
            await call.lease.end_attempt(extra.in_flight, extra.response)
            call.observation.attempt_finished(extra.attempt)

    def hedge_route(self, call: Call, route: Route, used: list[ReplicaState]) -> Route | None:
        """The next hedge of ``route``: a replica not used by this round nor avoided by the route (those that
        failed this call), paid from the call's budget; None when not allowed (``max_attempts`` counts hedges too:
        `Route.rounds`)."""
        if route.rounds is not None and route.spent + len(used) >= route.rounds:
            return None
        now = call.clock()
        if self.replicas.any_cooling(now) or not fits_deadline(call, now, deadline=route.deadline):
            return None  # no hedge while replicas signal overload, or when it could not make the deadline
        state = self.replicas.pick_hedge(now, [*used, *route.avoid], call.affinity_key)
        if state is None:
            return None
        payment = call.pay_extra()
        if payment is None:
            return None
        used.append(state)
        return route.next(state, "hedge", payment, route.avoid)


class _Round:
    """One hedged round: the primary in the caller's task, hedges in tasks of their own.

    Each attempt's outcome is handled the moment it arrives (`_arrived`): a winner is published
    and the other attempts cancelled, a failure fires the next hedge at once (``on_failure``);
    the caller's task then judges them in arrival order (`decide`)."""

    def __init__(
        self, layer: HedgeLayer, call: Call, route: Route, race: Race, call_next: Next, hedges: int, delay: float
    ) -> None:
        assert layer.policy is not None and route.replica is not None
        self.policy = layer.policy
        self.layer = layer
        self.call = call
        self.route = route
        self.race = race
        """Where the round's winner is recorded the moment it is known."""
        self.call_next = call_next
        self.primary = route.replica
        self.used = [route.replica]
        self.hedges_left = hedges
        self.results: deque[Outcome] = deque()
        """Outcomes not yet judged, in arrival order."""
        self.failures: list[AttemptFailure] = []
        self.live = 1
        """Attempts still running (the primary counts)."""
        self.decided = False
        self.primary_scope = anyio.CancelScope()
        self.delay = delay
        self.timer: TimerHandle | None = None
        """The next hedge's timer, while one is armed."""
        self._tasks: Tasks | None = None
        """Where the hedges and the timer run (`TimeSource.tasks`), until the round is decided."""
        self._wakeup: anyio.Event | None = None
        self.watching = False
        """Told by the router when the primary's server reports a queue (`queued`), until the round ends."""
        self._context: contextvars.Context | None = None
        """The call's context variables, for a hedge sent when the router tells (`queued`)."""

    def begin(self, tasks: Tasks) -> None:
        self._tasks = tasks
        self.arm()
        router = self.layer.replicas.router
        if router.queues_reported_until > self.call.clock():  # servers report their queues: watch the primary's
            self._context = contextvars.copy_context()
            router.watch_queue(self.primary, self.queued)
            self.watching = True

    def arm(self) -> None:
        """Fire the next hedge ``delay`` seconds from now."""
        assert self._tasks is not None
        self.disarm()
        self.timer = self._tasks.call_at(self.call.clock() + self.delay, self.start_hedge)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    async def run(self, route: Route) -> Outcome | None:
        """The primary attempt in this task, then the round's outcome (see `decide`)."""
        try:
            with self.primary_scope:  # cancelled by a hedge that wins
                await self.attempt(route)
            return await self.decide()
        finally:
            self.end()

    def end(self) -> None:
        """The round is decided (or cancelled): no more hedges; running ones are cancelled."""
        self.decided = True
        self.disarm()
        self.stop_watching()
        if self._tasks is not None:
            self._tasks.cancel()
            self._tasks = None

    def stop_watching(self) -> None:
        if self.watching:
            self.watching = False
            self.layer.replicas.router.unwatch_queue(self.primary, self.queued)

    def stop(self) -> None:
        """A hedge task ended with an unexpected error: stop the round (the error is raised when it is joined)."""
        self.primary_scope.cancel()
        if self._wakeup is not None:
            self._wakeup.set()

    def queued(self) -> None:
        """The primary's server reports a queue and another replica's none (`Router.watch_queue`): the primary
        would wait behind that queue for its first token, so the next hedge goes now (once), not after the delay."""
        self.stop_watching()
        if self.race.winner is None and self._context is not None:
            # Told from the reporter's task (the poller, another call): the hedge runs in this call's context
            # (its tier, captures, tracing span), as it does when the timer sends it.
            self._context.run(self.start_hedge)

    def start_hedge(self) -> None:
        """Send the next hedge now, if one is left, allowed and paid for; re-arm the timer for the one after."""
        if self.decided or not self.hedges_left or self._tasks is None:
            return
        route = self.layer.hedge_route(self.call, self.route, self.used)
        if route is None:  # not allowed or not paid for: no more hedges this round
            self.disarm()
            return
        self.hedges_left -= 1
        self.live += 1
        self._tasks.start_soon(self.attempt, route)
        if self.hedges_left:
            self.arm()
        else:
            self.disarm()

    async def attempt(self, route: Route) -> None:
        """Run one attempt (the primary in the caller's task, a hedge in its own) and hand over its outcome."""
        try:
            outcome = await self.call_next(self.call, route)
        except GuardClosed as closed:  # the Guard closed under this attempt: the round ends with it
            outcome = Failed(reason=closed)
        finally:
            self.live -= 1
        self._arrived(outcome, hedge=route.kind == "hedge")

    def _arrived(self, outcome: Outcome, *, hedge: bool) -> None:
        self.results.append(outcome)
        race = self.race
        if isinstance(outcome, Win):
            if race.winner is None:
                race.winner = outcome  # recorded at once: the others, cancelled next, are "lost"
                if hedge:
                    self.primary_scope.cancel()
        elif outcome.reason is not None:
            if hedge:
                self.primary_scope.cancel()
        elif self.live and self.policy.on_failure and race.winner is None:
            self.start_hedge()
        if self._wakeup is not None:
            self._wakeup.set()

    async def decide(self) -> Outcome | None:
        """The round's outcome: the winner, a failure the guard chose (its reason), or None when
        every attempt failed."""
        race = self.race
        while True:
            while self.results:
                result = self.results.popleft()
                if isinstance(result, Win):
                    if result is not race.winner:
                        self.results.appendleft(result)  # a second winner: closed when the round settles
                    return race.winner
                self.failures.extend(result.failures)
                if result.reason is not None:  # the guard itself stopped an attempt: end the round
                    return Failed(self.failures, result.reason)
            if race.winner is not None:  # won while the primary was being cancelled
                return race.winner
            if not self.live:
                return None
            self._wakeup = anyio.Event()
            await self._wakeup.wait()
            self._wakeup = None
