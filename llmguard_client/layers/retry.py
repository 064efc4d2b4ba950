"""Retries of a call under the shared budget, honouring Retry-After per replica.

After a round fails, `Retrier` decides whether and where to try again:

- only what is worth retrying: transport errors before the first token, and the
  statuses of `RetryPolicy.retry_statuses` (408, 429, 5xx); other 4xx never. Calls to
  paths that are not idempotent-safe generation calls are retried on connect errors
  only (the request never reached a server);
- a replica that answered with Retry-After cools down for that long: this call's retry
  goes at once to another replica that is not cooling; only when all are cooling does
  it wait, and only if the wait fits the tier's first-token deadline, otherwise it
  gives up at once, handing back the server's answer and its Retry-After;
- every retry is paid from the shared budget; an empty budget ends the call at once
  with the last server answer;
- backoff between retries is tenacity's ``wait_random_exponential`` (full jitter);
- a replica that keeps failing (connect errors, 5xx) has its circuit opened for a
  cool-down, then is probed again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import tenacity

from llmguard_client._call import Call
from llmguard_client._config import RetryPolicy
from llmguard_client._errors import AllReplicasCooling, BudgetExhausted, GuardFailure
from llmguard_client._replicas import ReplicaSet, ReplicaState
from llmguard_client.layers.attempt import AttemptFailure, AttemptWin
from llmguard_client.layers.budget import BudgetTicket
from llmguard_client.layers.hedge import Hedger
from llmguard_client.telemetry.hooks import Instrumentation


@dataclass(slots=True)
class GiveUp:
    """The call ends without a winner: the last failure, and the guard's reason if it chose to stop."""

    last: AttemptFailure
    reason: GuardFailure | None = None


class Retrier:
    """Runs a call's rounds until one wins or retrying is not worth it."""

    def __init__(
        self,
        hedger: Hedger,
        replicas: ReplicaSet,
        policy: RetryPolicy | None,
        instrumentation: Instrumentation,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hedger = hedger
        self.replicas = replicas
        self.policy = policy
        self._instrumentation = instrumentation
        self._clock = clock
        initial = policy.backoff_initial if policy else 0.05
        maximum = policy.backoff_max if policy else 2.0
        self._backoff = tenacity.wait_random_exponential(multiplier=initial, max=maximum)

    async def run(self, call: Call, first: ReplicaState) -> AttemptWin | GiveUp:
        state = first
        rounds = 0
        while True:
            rounds += 1
            result = await self.hedger.run_round(call, state, "primary" if rounds == 1 else "retry")
            if isinstance(result, AttemptWin):
                # Speed is learned from streams only: a non-streaming "first token" is the whole body.
                streamed = result.scanner is not None
                now = self._clock()
                self.replicas.succeeded(
                    result.state, result.attempt.ttft if streamed else None, now, result.response.headers
                )
                if streamed:
                    self.replicas.losers(call.record.attempts)
                return result
            self._learn(call, result)
            last = result[-1]
            plan = self._plan(call, last, rounds)
            if isinstance(plan, GiveUp):
                return plan
            wait, state, ticket = plan
            if wait > 0:
                try:
                    await anyio.sleep(wait)
                except anyio.get_cancelled_exc_class():
                    if ticket is not None:
                        ticket.refund()  # the retry was never sent: it costs the budget nothing
                    raise

    def _learn(self, call: Call, failures: list[AttemptFailure]) -> None:
        """Cool down replicas that sent Retry-After; count failures toward their circuits."""
        now = self._clock()
        for failure in failures:
            call.failed_replicas.append(failure.state)
            if failure.status_code is not None:
                self.replicas.saw_headers(failure.state, now, failure.headers)
            if failure.retry_after is not None and failure.status_code in (429, 503):
                self.replicas.cool_down(failure.state, now, failure.retry_after)
                self._instrumentation.replica_cooled(failure.state.name, failure.retry_after, "retry_after")
            elif failure.is_transport_error or (failure.status_code or 0) >= 500:
                policy = self.policy or RetryPolicy()
                if self.replicas.failed(failure.state, now, policy.circuit_failures, policy.circuit_cooldown):
                    self._instrumentation.replica_cooled(failure.state.name, policy.circuit_cooldown, "circuit_open")

    def _retryable(self, call: Call, failure: AttemptFailure) -> bool:
        assert self.policy is not None
        if failure.is_connect_error:
            return True
        if not call.retry_any_status:
            return False
        if failure.status_code is not None:
            return failure.status_code in self.policy.retry_statuses
        return failure.is_transport_error

    def _plan(
        self, call: Call, last: AttemptFailure, rounds: int
    ) -> tuple[float, ReplicaState, BudgetTicket | None] | GiveUp:
        """(seconds to wait, replica) for the next round, or why the call ends now."""
        if self.policy is None or not call.guarded or not self._retryable(call, last):
            return GiveUp(last)
        if rounds >= self.policy.max_attempts:
            return GiveUp(last)
        now = self._clock()
        remaining = call.first_token_deadline - now
        # A retry is worth sending only if its first token can still make the deadline.
        expected_ttft = self.hedger.ttft_stats.hedge_delay(call.tier_name, call.record.stream)
        state = self.replicas.pick_ready(now, exclude=call.failed_replicas) or self.replicas.pick_ready(now)
        if state is None:
            soonest = self.replicas.cooling_wait(now)
            if soonest is None:  # every circuit is open: nothing to wait for within a call
                return GiveUp(last)
            if soonest + expected_ttft >= remaining:
                reason = AllReplicasCooling(
                    f"every replica is cooling down for at least {soonest:.3f}s more (server Retry-After); "
                    f"with a first token taking about {expected_ttft:.3f}s, that does not fit "
                    f"the {remaining:.3f}s left before the ttft deadline of tier {call.tier_name!r} "
                    f"({call.tier.ttft}s); gave up after {len(call.record.attempts)} attempt(s)",
                    request=call.request,
                    record=call.record,
                    retry_after=soonest,
                )
                return GiveUp(last, reason)
            wait = soonest
            state = self.replicas.pick(now + soonest) or last.state
        elif last.retry_after is not None and state is not last.state:
            wait = 0.0  # overload on one replica: go to another at once
        else:
            retry_state = tenacity.RetryCallState(retry_object=tenacity.AsyncRetrying(), fn=None, args=(), kwargs={})
            retry_state.attempt_number = rounds
            wait = float(self._backoff(retry_state))
            if last.retry_after is not None:
                wait = max(wait, last.retry_after)
        if wait + expected_ttft >= remaining:
            return GiveUp(last)
        ticket = call.budget.try_acquire() if call.budget is not None else None
        if call.budget is not None and ticket is None:
            call.observation.budget_refused(call.record)
            exhausted = BudgetExhausted(
                f"the retry budget (shared by retries and hedges) is empty; tier {call.tier_name!r} call "
                f"ends after {len(call.record.attempts)} attempt(s) with the last answer",
                request=call.request,
                record=call.record,
                retry_after=last.retry_after,
            )
            return GiveUp(last, exhausted)
        return wait, state, ticket
