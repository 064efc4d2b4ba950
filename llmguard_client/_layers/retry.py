"""Retries of a call under the shared budget, honouring Retry-After per replica.

After a round fails, `Retrier` decides whether and where to try again:

- only what is worth retrying: transport errors before the first token, and the
  statuses of `RetryPolicy.retry_statuses` (408, 429, 5xx); other 4xx never. Calls to
  paths that are not idempotent-safe generation calls are retried on connect errors
  only (the request never reached a server);
- a replica that signalled overload (429, 503, 529, or an overload error inside a 200
  stream) cools down for its Retry-After, or `RetryPolicy.overload_cooldown` without one
  (vLLM and most engines send none): this call's retry
  goes at once to another replica that is not cooling; only when all are cooling does
  it wait, and only if the wait fits the tier's first-token deadline, otherwise it
  gives up at once, handing back the server's answer and its Retry-After;
- every retry is paid from the shared budget; an empty budget ends the call at once
  with the last server answer. A retry after a refused connection is free: no server saw
  the request, so resending it elsewhere adds no load (a dead replica must not empty the
  budget that the live ones need);
- backoff between retries is full jitter over tenacity's ``wait_exponential`` window (what
  ``wait_random_exponential`` does), drawn from the layer's own `random.Random` (`Backoff`), so
  a test can seed it; tenacity's own draw uses the global ``random`` module;
- a replica that keeps failing (connect errors, 5xx) has its circuit opened for a
  cool-down, then is probed again.
"""

from __future__ import annotations

import random

import anyio
import tenacity

from llmguard_client._core.call import Call
from llmguard_client._core.outcome import AttemptFailure, Failed, Outcome, Payment, Route, Win
from llmguard_client._core.pipeline import Next
from llmguard_client._state.replicas import ReplicaSet, ReplicaState
from llmguard_client._state.ttft_stats import TTFTStats
from llmguard_client.config import RetryPolicy
from llmguard_client.errors import AllAttemptsFailed, AllReplicasCooling, BudgetExhausted
from llmguard_client.telemetry.hooks import Instrumentation


class Backoff:
    """Seconds to wait before retry round ``n``: uniform in [0, min(``maximum``, ``initial`` x 2^(n-1))].

    The window is tenacity's ``wait_exponential``; the draw comes from ``rng`` (seed it for a
    reproducible sequence) rather than the global ``random`` module that tenacity's
    ``wait_random_exponential`` draws from.
    """

    def __init__(self, initial: float, maximum: float, rng: random.Random | None = None) -> None:
        self._window = tenacity.wait_exponential(multiplier=initial, max=maximum)
        self._rng = rng if rng is not None else random.Random()

    def __call__(self, round_number: int) -> float:
        state = tenacity.RetryCallState(retry_object=tenacity.AsyncRetrying(), fn=None, args=(), kwargs={})
        state.attempt_number = round_number  # all that wait_exponential reads
        return self._rng.uniform(0.0, self._window(state))


class RetryLayer:
    """Routes the call's first round, then runs rounds until one wins or retrying is not worth it."""

    def __init__(
        self,
        replicas: ReplicaSet,
        policy: RetryPolicy | None,
        ttft_stats: TTFTStats,
        instrumentation: Instrumentation,
        rng: random.Random | None = None,
    ) -> None:
        self.replicas = replicas
        self.policy = policy
        self.ttft_stats = ttft_stats
        self._instrumentation = instrumentation
        initial = policy.backoff_initial if policy else 0.05
        maximum = policy.backoff_max if policy else 2.0
        self.backoff = Backoff(initial, maximum, rng)
        """The wait before each retry round (``rng``: its random source, e.g. ``random.Random(seed)``)."""

    async def __call__(self, call: Call, route: Route, call_next: Next) -> Outcome:
        state = route.replica or self.replicas.pick(call.clock(), key=call.affinity_key)
        if state is None:
            return Failed(
                reason=AllAttemptsFailed(
                    f"every replica's circuit is open (each kept failing); tier {call.tier_name!r} call refused "
                    "at once; they are probed again when their cool-down ends",
                    request=call.request,
                    record=call.record,
                )
            )
        failures: list[AttemptFailure] = []
        payment: Payment | None = route.payment
        rounds = 0
        while True:
            rounds += 1
            kind = route.kind if rounds == 1 else "retry"
            outcome = await call_next(call, Route(state, kind, payment))
            if isinstance(outcome, Win):
                # Speed is learned from event streams only: a non-streaming "first token" is the whole body.
                streamed = outcome.reader.chunks is not None
                self.replicas.succeeded(
                    outcome.state, outcome.attempt.ttft if streamed else None, call.clock(), outcome.response.headers
                )
                if streamed:
                    self.replicas.losers(call.record.attempts)
                return outcome
            failures.extend(outcome.failures)
            if outcome.reason is not None or not outcome.failures:
                return Failed(failures, outcome.reason)
            self._learn(call, outcome.failures)
            plan = self._plan(call, outcome.failures[-1], rounds)
            if isinstance(plan, Failed):
                return Failed(failures, plan.reason)
            wait, state, payment = plan
            if wait > 0:
                await anyio.sleep(wait)  # a payment not yet used is refunded by the lease if this is cancelled

    def _learn(self, call: Call, failures: list[AttemptFailure]) -> None:
        """Cool down replicas that sent Retry-After; count failures toward their circuits."""
        now = call.clock()
        for failure in failures:
            call.failed_replicas.append(failure.state)
            if failure.status_code is not None:
                self.replicas.saw_headers(failure.state, now, failure.headers)
            policy = self.policy or RetryPolicy()
            if failure.overload:  # 429/503/529 or an in-stream overload error, with or without Retry-After
                seconds, why = failure.retry_after, "retry_after"
                if seconds is None:
                    seconds, why = policy.overload_cooldown, "overload"
                self.replicas.cool_down(failure.state, now, seconds)
                self._instrumentation.replica_cooled(failure.state.name, seconds, why)
            elif (failure.is_transport_error or (failure.status_code or 0) >= 500) and self.replicas.failed(
                failure.state, now, policy.circuit_failures, policy.circuit_cooldown
            ):
                self._instrumentation.replica_cooled(failure.state.name, policy.circuit_cooldown, "circuit_open")

    def _retryable(self, call: Call, failure: AttemptFailure) -> bool:
        assert self.policy is not None
        if failure.is_connect_error:
            return True
        if not call.retry_any_status:
            return False
        if failure.status_code is not None:
            return failure.status_code in self.policy.retry_statuses or failure.overload
        return failure.is_transport_error

    def _plan(self, call: Call, last: AttemptFailure, rounds: int) -> tuple[float, ReplicaState, Payment] | Failed:
        """(seconds to wait, replica, payment) for the next round, or why the call ends now."""
        if self.policy is None or not self._retryable(call, last):
            return Failed()
        if rounds >= self.policy.max_attempts:
            return Failed()
        now = call.clock()
        remaining = call.first_token_deadline - now
        # A retry is worth sending only if its first token can still make the deadline.
        expected_ttft = self.ttft_stats.hedge_delay(call.tier_name, call.record.stream)
        key = call.affinity_key  # a keyed call's retry goes to the key's next replica
        state = self.replicas.pick_ready(now, call.failed_replicas, key) or self.replicas.pick_ready(now, key=key)
        if state is None:
            soonest = self.replicas.cooling_wait(now)
            if soonest is None:  # every circuit is open: nothing to wait for within a call
                return Failed()
            if soonest + expected_ttft >= remaining:
                return Failed(
                    reason=AllReplicasCooling(
                        f"every replica is cooling down for at least {soonest:.3f}s more (server Retry-After); "
                        f"with a first token taking about {expected_ttft:.3f}s, that does not fit "
                        f"the {remaining:.3f}s left before the ttft deadline of tier {call.tier_name!r} "
                        f"({call.tier.ttft}s); gave up after {len(call.record.attempts)} attempt(s)",
                        request=call.request,
                        record=call.record,
                        retry_after=soonest,
                    )
                )
            wait = soonest
            state = self.replicas.pick(now + soonest, key=key) or last.state
        elif (last.retry_after is not None or last.overload) and state is not last.state:
            wait = 0.0  # overload on one replica: go to another at once
        else:
            wait = self.backoff(rounds)
            if last.retry_after is not None:
                wait = max(wait, last.retry_after)
        if wait + expected_ttft >= remaining:
            return Failed()
        payment = Payment() if last.refused else call.pay_extra()
        if payment is None:
            return Failed(
                reason=BudgetExhausted(
                    f"the retry budget (shared by retries and hedges) is empty; tier {call.tier_name!r} call "
                    f"ends after {len(call.record.attempts)} attempt(s) with the last answer",
                    request=call.request,
                    record=call.record,
                    retry_after=last.retry_after,
                )
            )
        return wait, state, payment
