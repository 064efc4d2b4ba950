"""Retries of a call under the shared budget, honouring Retry-After per replica.

After a round fails, `Retrier` decides whether and where to try again:

- only what is worth retrying: transport errors before the first token, and the
  statuses of `RetryPolicy.retry_statuses` (408, 429, 5xx); other 4xx never, nor an answer
  the server marked ``x-should-retry: false`` (as the openai and anthropic SDKs read it). Other POSTs
  than generation calls (embeddings, files...) are retried on connect errors only (the
  request never reached a server); a GET, HEAD or OPTIONS is retried as a generation call. Only the answers
  to generation calls under a replica's base path (`Call.judges`) cool a replica or count toward its circuit:
  another API's or deployment's statuses (a 429 of the files API, a 503 of models.list, another Azure
  deployment's quota) speak for it only; its transport errors count (the host did not answer). Such a call is
  not held back by a replica's cool-down or circuit either (`_plan_unjudged`);
- a replica that signalled overload (429, 503, 529, or an overload error inside a 200
  stream) cools down for its Retry-After (at most `RetryPolicy.max_retry_after`: a longer one, such as a
  daily quota's, sends the call that got it to another replica or ends it at once, final), or
  `RetryPolicy.overload_cooldown` without one (vLLM and most engines send none), at its `REFUSALS_TO_COOL`-th
  overload answer in a row (a full queue or a rate limit; one refusing some calls at random serves the others
  between, and a call it serves ends such a cool-down of the guard's own; until then a Retry-After paces the
  refused call's own retry only), or at once for a 429 without a Retry-After or reporting a limit spent, an
  in-stream overload error, a Retry-After longer than the guard waits, or ``x-should-retry: false`` (`_cools`);
  this call's retry goes at once to another replica that is not cooling; only when all are cooling does
  it wait, and only if the wait fits the tier's first-token deadline, otherwise it
  gives up at once, handing back the server's answer and its Retry-After. A 429 whose rate-limit headers
  report room left in every limit they report (`room_left`: the provider refused that request for its own
  size, as a tokens-per-minute limit charging prompt + ``max_tokens`` does) cools nothing: the other calls go
  on, and its Retry-After paces that call's own retry only. A 429 carrying
  the provider's rate-limit headers, from a replica under a configured `RateLimit`, lowers its
  bucket to the room they report (the rate-limit layer) and, with a Retry-After, cools the replica for it
  as any 429 does (the server's word on when to come back); without one it sets no cool-down: the
  bucket admits the next attempts;
- with a single replica left (a hosted API) that is cooling, a call's first attempt waits for the
  cool-down's probe or end if that fits its first-token deadline, and is refused before it is sent
  otherwise (`AllReplicasCooling`, with the seconds left as its ``retry_after``); while another call is
  the probe, the waiting calls go when it is served, and decide again when it is refused;
- every retry is paid from the shared budget. A retry after a refused connection is free: no server saw
  the request, so resending it elsewhere adds no load (a dead replica must not empty the
  budget that the live ones need). A retry that goes back to the replica that answered with a
  Retry-After, no sooner than it asked, is *paced* by that server: it is paid while the budget has room
  and sent even when it has none (`RetryBudget.try_acquire`), as the plain SDK would send it (not when the answer
  was a 2xx with the error inside it, which the plain SDK does not retry: below); so is one
  back to a replica that answered 429 without a Retry-After (the server refused this client), once the
  cool-down standing in for it ends (`_server_paced`). When the budget refuses the retry at once to another
  replica after such an answer, the retry goes back, paced, to the replica that asked, at its cool-down's end
  (`_back_to_asker`), as it would with that replica alone and as the plain SDK would retry, unless it is
  excluded (a Retry-After longer than `RetryPolicy.max_retry_after`, an open circuit);
- the budget bounds the guard's *extra* load (retries at once elsewhere, hedges), never what the plain SDK would send:
  a retry it refuses after the replica's own failure (a 5xx, a 408, a transport error, an overload answer without a
  Retry-After) goes as a paced one (`_pace_refused`), to a ready replica (circuit closed, not cooling; the one that
  failed when no other is ready) after the backoff of a retry to the same replica, as an SDK's retry waits (at once
  after an overload answer: another replica is ready), within the call's deadline and attempts; but for a failure
  inside a 2xx answer (`AttemptFailure.in_ok_answer`: a stream cut after its headers, an error event before its first
  token), which the plain SDK does not retry: that one is paced only to a ready replica the call has not tried. Every
  replica cooling (an overload of every one: each cools at its third refusal in a row, or its first in-stream one) or
  open (panic mode) leaves none ready, and there the bound holds: circuits and cool-downs stop the
  retries once the replicas fail everything. The only replica left (one configured, or the others excluded or open)
  has nowhere else to send them: its retry goes at its cool-down's end when it is cooling, and once its circuit has
  opened (it failed every call lately) it also cools for `RetryPolicy.overload_cooldown` unless it is already cooling
  (reason ``"failing"``), new first attempts wait for its probe, and the retry goes at the cool-down's end (the server
  sees probes, not a flood). A replica that fails some calls and serves the others holds back no other call. After an
  overload answer without a Retry-After with no replica ready (each cooling, or back from a cool-down with nothing
  served since), the refused retry waits, its backoff or to the first cool-down's end, for a replica to serve a call
  again (`_await_serving`), then goes there; any other refused retry ends the call at once with the last answer;
- a call remembers each replica's Retry-After to it (`_remember_asked`): a retry goes back to a replica no sooner,
  the one whose wait ends first, and the last request goes back there rather than to a replica not tried when that
  fits the deadline; a replica that asked for more than `RetryPolicy.max_retry_after` gets none of its retries;
- a call whose answers speak for no replica (another API's, another deployment's: `Call.judges`) is planned by its
  own answers only (`_plan_unjudged`);
- backoff between retries is full jitter over an exponential window, drawn from the layer's own
  `random.Random` (`Backoff`), so a test can seed it; a retry that goes back to a replica that already
  failed the call (no other is ready) waits at least about `RetryPolicy.same_replica_backoff`, doubling each
  time, as an SDK retrying one endpoint does. After a failure to connect the retry goes at once to a ready replica
  not tried yet; when none is left and it goes back after two refused the call, or when the connection failed in
  this process (`AttemptFailure.local`), it goes no sooner than the plain SDK's would, after that same-replica
  backoff for its round plus those its earlier failovers at once skipped (`ConnectFaults`); a retry that goes back
  to a replica that only refused the call's connections goes to one that answered the call instead, after its
  pause, if that fits the deadline and it is in no run of refusals (`_reached_instead`);
- a replica that keeps failing (connect errors, 5xx, 408s) has its circuit opened for a
  cool-down, then is probed again. A call counts at most once toward each replica's circuit,
  however many of its attempts failed there: the guard's own retries do not count twice. A connection that failed
  in this process (out of file descriptors, local ports or buffers: `AttemptFailure.local`) counts toward nothing:
  the replica did nothing, and no fleet hears of it.

A continuation (`llmguard_client._stream.continuation`) is a route through this same layer: its route
names the replicas to avoid (never retried, unlike a retry's), its own budget (which pays for its first
attempt too), its first-token deadline and its most attempts. `learn` is the one failure classification
of every attempt; `fits_deadline` the one test of whether another attempt can still make its deadline.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import httpx

from llmguard_client._core.call import Call
from llmguard_client._core.outcome import AttemptFailure, Failed, Outcome, Payment, Route, Stop, Win, close_unread
from llmguard_client._core.pipeline import Next
from llmguard_client._core.randomness import process_random
from llmguard_client._layers.connect_faults import ConnectFaults
from llmguard_client._layers.deadline import first_token_reserve, fits_deadline
from llmguard_client._ratelimit.headers import remaining_room, room_left
from llmguard_client._routing.caller import caller, calling_as, holds_for_caller
from llmguard_client._routing.cooldown import REFUSALS_TO_COOL
from llmguard_client._routing.health import REJECTIONS
from llmguard_client._routing.replicas import ReplicaSet, ReplicaState
from llmguard_client._routing.ttft_stats import TTFTStats
from llmguard_client.config import HedgePolicy, RetryPolicy, deadline_text
from llmguard_client.errors import AllAttemptsFailed, AllReplicasCooling, BudgetExhausted
from llmguard_client.telemetry.hooks import Instrumentation

SDK_JITTER = 0.25
"""The share of its window a Stainless-built SDK's retry wait may fall short by (``1 - 0.25 x random()``)."""


class Backoff:
    """Seconds to wait before retry round ``n``: uniform in [0, min(``maximum``, ``initial`` x 2^(n-1))]
    (full jitter), drawn from ``rng`` (seed it for a reproducible sequence), never the global ``random``.
    `returning` is the least wait before going back to a replica that failed the call."""

    def __init__(
        self, initial: float, maximum: float, rng: random.Random | None = None, same_replica: float = 0.0
    ) -> None:
        self._initial = initial
        self._maximum = maximum
        self._same_replica = same_replica
        self._rng = rng if rng is not None else process_random()

    def __call__(self, round_number: int) -> float:
        return self._rng.uniform(0.0, self._window(self._initial, round_number))

    def returning(self, failures: int) -> float:
        """Before a retry to a replica that failed the call ``failures`` times: uniform in [3/4, 1] x
        min(``maximum``, ``same_replica`` x 2^(failures-1)), never near 0 (it may need a moment to recover). The
        openai and anthropic SDKs draw their retries' waits so (`SDK_JITTER`): with the default 0.5 s, the
        guard's retries span what the plain SDK's do, so an outage the SDK rides out is ridden out here too."""
        window = self._window(self._same_replica, failures)
        return self._rng.uniform((1 - SDK_JITTER) * window, window)

    def _window(self, initial: float, n: int) -> float:
        return min(self._maximum, initial * 2.0 ** min(max(n - 1, 0), 64))


@dataclass(frozen=True)
class AwaitServing:
    """The budget refused a retry and no replica is ready to take it past the bound: wait until ``until`` for one to
    serve a call again (`RetryLayer._await_serving`), then send the retry no sooner than ``earliest`` (its backoff, as
    the plain SDK's retry waits), else end with ``refusal``."""

    earliest: float
    until: float
    refusal: Failed


class RetryLayer:
    """Routes the call's first round, then runs rounds until one wins or retrying is not worth it."""

    def __init__(
        self,
        replicas: ReplicaSet,
        policy: RetryPolicy | None,
        instrumentation: Instrumentation,
        rng: random.Random | None = None,
        rate_limited: Callable[[str], bool] | None = None,
        ttft_stats: TTFTStats | None = None,
    ) -> None:
        self.replicas = replicas
        self.ttft_stats = ttft_stats if ttft_stats is not None else TTFTStats(HedgePolicy())
        """The first-token statistics a won attempt's TTFT is scaled by (`TTFTStats.scale`) before the router
        learns it; none given: a fresh one's, which scales nothing."""
        self.policy = policy
        self._instrumentation = instrumentation
        self._rate_limited = rate_limited
        """Whether a provider `RateLimit` applies to the replica named (its 429s feed the limit, not a cool-down)."""
        policy_or_default = policy or RetryPolicy()
        self.backoff = Backoff(
            policy_or_default.backoff_initial,
            policy_or_default.backoff_max,
            rng,
            policy_or_default.same_replica_backoff,
        )
        """The wait before each retry round (``rng``: its random source, e.g. ``random.Random(seed)``)."""

    async def __call__(self, call: Call, route: Route, call_next: Next) -> Outcome:
        """Run ``route`` as ``call``'s limit scope: the cool-downs another scope's 429s set do not hold it back."""
        with calling_as(call.scope):
            return await self._route(call, route, call_next)

    async def _route(self, call: Call, route: Route, call_next: Next) -> Outcome:
        first = await self._first(call, route)
        if isinstance(first, Failed):
            return first
        state, payment = first
        failures: list[AttemptFailure] = []
        failed: list[ReplicaState] = []  # replicas that failed this route: its hedges and later rounds avoid them
        counted: set[int] = set()  # replicas whose circuit this route already counted a failure toward
        asked: dict[int, float] = {}  # replica id -> when its Retry-After to this call ends
        answered: dict[int, AttemptFailure] = {}  # replica id -> its last answer to this call (`_note_answers`)
        faults = ConnectFaults()  # its failures to connect: whether its retries go as the plain SDK's
        allowed = route.rounds if route.rounds is not None or self.policy is None else self.policy.max_attempts
        sent = route.spent  # requests of the call so far, hedges included: `allowed` caps them
        rounds = 0
        kind = route.kind
        while True:
            rounds += 1
            avoid = (*route.avoid, *failed)
            outcome = await call_next(call, route.next(state, kind, payment, avoid, rounds=allowed, spent=sent))
            if isinstance(outcome, Win):
                if not call.judges:  # another API's (or deployment's) answer says nothing of the replica's calls
                    return outcome
                # Speed is learned from event streams only: a non-streaming "first token" is the whole body.
                streamed, ttft = outcome.reader.chunks is not None, outcome.attempt.ttft
                scale = self.ttft_stats.scale(call.tier_name, call.record.stream, call.ttft_size)
                judged = ttft * scale if streamed and ttft is not None and scale is not None else None
                self.replicas.succeeded(outcome.state, judged, call.clock(), outcome.response.headers)
                if streamed:
                    self.replicas.losers(call.record.attempts, scale)
                return outcome
            failures.extend(outcome.failures)
            if outcome.reason is not None or not outcome.failures:
                return Failed(failures, outcome.reason, outcome.stopped)
            sent += len(outcome.failures)  # the round's requests: its first and its hedges, every one failed
            self.learn(call.clock(), outcome.failures, counted, judged=call.judges)
            faults.saw(outcome.failures)
            failed.extend(f.state for f in outcome.failures)
            self._remember_asked(call.clock(), outcome.failures, asked)
            _note_answers(outcome.failures, answered)
            used_up = allowed is not None and sent >= allowed
            last_one = allowed is not None and sent + 1 >= allowed
            last = outcome.failures[-1]
            cuts = all(f.in_ok_answer for f in failures)  # none the plain SDK retries: it had a 2xx answer
            plan = self._plan(
                call,
                route,
                last,
                rounds,
                used_up,
                failed,
                asked=asked,
                last_one=last_one,
                faults=faults,
                cuts=cuts,
                answered=answered,
            )
            if isinstance(plan, AwaitServing):
                plan = await self._await_serving(call, route, last, rounds, failed, plan, asked, faults, cuts, answered)
            if isinstance(plan, Failed):
                return Failed(failures, plan.reason, plan.stopped, used_up=used_up)
            wait, state, payment = plan
            faults.retried(last, rounds, state, failed)
            if call.sdk_retries and route.kind != "continuation":  # the SDK sends it (the payment is refunded)
                return Failed(failures, stopped="sdk", retry_in=wait, paced=payment.paced)
            await close_unread(call.lease, outcome.failures)  # retried: their answers go to nobody
            if route.kind != "continuation":
                kind = "retry"
            if call.judges:  # sent as the probe, if it is (another API's call is no probe of the replica's)
                self.replicas.take_probe(state, call.clock() + wait, call.lease.hold)
            if wait > 0:
                await anyio.sleep(wait)  # a payment not yet used is refunded by the lease if this is cancelled

    async def _first(self, call: Call, route: Route) -> tuple[ReplicaState, Payment | None] | Failed:
        """The first attempt's replica and payment: the caller's first attempt is free; a route with a budget
        of its own (a continuation) pays for its first attempt too, and must fit its deadline. A call off the
        generation paths (files, models, embeddings) or beside the replicas' paths (another deployment) does not
        wait for a cool-down (`Call.judges`): the server asked the replicas' generation calls for rest, and its
        other APIs and deployments may answer."""
        if route.budget is None and route.replica is None and call.judges:
            refused = await self._wait_for_first(call, route.avoid)
            if refused is not None:
                return refused
        now = call.clock()
        if route.budget is None:
            state = route.replica or self.replicas.pick(
                now,
                route.avoid,
                call.affinity_key,
                cornered=bool(call.outside) or call.beside,
                resting=call.judges,
                keep=call.lease.hold,
            )
        else:
            state = (
                route.replica
                or self.replicas.pick_ready(now, exclude=route.avoid)
                or self.replicas.pick(now, exclude=route.avoid, keep=call.lease.hold)
            )
        if state is None:
            return Failed(
                reason=AllAttemptsFailed(
                    f"every replica's circuit is open (each kept failing); tier {call.tier_name!r} call refused "
                    "at once; they are probed again when their cool-down ends",
                    request=call.request,
                    record=call.record,
                ),
                stopped="no_replica",
            )
        if route.budget is None:
            return state, route.payment
        if not fits_deadline(call, now, deadline=route.deadline):
            return Failed(stopped="deadline")
        payment = call.pay_extra(route.budget)
        return (state, payment) if payment is not None else Failed(stopped="budget")

    async def _wait_for_first(self, call: Call, avoid: tuple[ReplicaState, ...]) -> Failed | None:
        """While the one replica left is cooling with no probe due: wait for its probe (or the end of its
        cool-down) if that fits the first-token deadline (half the time left while no TTFT is measured), else
        the call is refused before it is sent. While its probe is in flight, wait for the probe's answer as long
        as a call sent then can still make its deadline (half the tier's ``ttft`` before it while no TTFT is
        measured). A change of the cool-down (another call's probe served, or refused again) ends the wait early,
        to decide again."""
        while True:
            now = call.clock()
            wait = self.replicas.first_wait(now, avoid)
            if wait <= 0.0:
                return None
            asked = self.replicas.asked_beyond(now, avoid)
            if asked > 0.0:  # it asked for more rest than the guard waits: no call waits for its probe either
                why = (
                    f"the only replica left asked for {asked:.3f}s more of rest (its Retry-After), longer than the "
                    f"guard waits (RetryPolicy.max_retry_after); tier {call.tier_name!r} call refused before it was "
                    f"sent (its cool-down's probe goes in {wait:.3f}s)"
                )
                return _cooling_refusal(call, why, asked, "no_replica")
            if self.replicas.probe_pending(now, avoid) and math.isfinite(call.first_token_deadline):
                # Its answer is the next chance (served: the calls waiting go at once; refused: the next probe's
                # time): wait for it while a call sent when it comes can still make its deadline.
                latest = call.first_token_deadline - (call.expected_ttft() or call.tier.ttft / 2)
                slack = min(latest - now, call.pool_wait)
                if slack > 0.0:
                    await self.replicas.cooling_changed.wait(slack)
                    continue
            # With no TTFT measured yet, a wait may take half the time left (as the rate limit's): a wait to the
            # deadline's edge leaves the attempt no time.
            unknown = call.expected_ttft() == 0.0 and wait > (call.first_token_deadline - now) / 2
            if wait > call.pool_wait:  # longer than the caller lets a request wait before it is sent
                left = self.replicas.cooling_left(now, avoid)
                why = (
                    f"the only replica left is cooling down for {left:.3f}s more (server Retry-After, at most "
                    f"RetryPolicy.max_retry_after); its next attempt, in {wait:.3f}s, is later than the caller's "
                    f"pool timeout ({call.pool_wait:g}s) allows a request to wait; tier {call.tier_name!r} call "
                    "refused before it was sent"
                )
                return _cooling_refusal(call, why, left, "deadline")
            if unknown or not fits_deadline(call, now, wait):
                left = self.replicas.cooling_left(now, avoid)
                why = (
                    f"the only replica left is cooling down for {left:.3f}s more (server Retry-After, at most "
                    f"RetryPolicy.max_retry_after); its next attempt, in {wait:.3f}s, does not fit the "
                    f"{call.first_token_deadline - now:.3f}s left before the ttft deadline of tier "
                    f"{call.tier_name!r} ({deadline_text(call.tier.ttft)}); refused before it was sent"
                )
                return _cooling_refusal(call, why, left, "deadline")
            # Woken early when the cool-down changes: its probe served (go now) or refused (decide again).
            await self.replicas.cooling_changed.wait(wait)  # inside the deadline layer's scope: aclose() ends it

    def learn(
        self, now: float, failures: list[AttemptFailure], counted: set[int] | None = None, *, judged: bool = True
    ) -> None:
        """The one failure classification of every attempt (first, retry, hedge, continuation) and of a
        stream broken after its first token: cool down replicas that signalled overload (with or without
        Retry-After, for at most `RetryPolicy.max_retry_after`) unless the 429 reports room left in every limit
        its rate-limit headers report (the request was refused for its own size), or a provider rate limit takes
        a 429 that has no Retry-After;
        count transport errors, 5xx and 408s (`AttemptFailure.replica_failed`) toward their circuits and the
        router's failure rates, once per replica for the ids in ``counted`` (the replicas the route already
        counted, updated here); tell the router of a 401, 403 or 404 (a rejection: it drains a replica that
        rejects what the others serve, and counts toward no circuit). Not ``judged`` (a call off the generation
        paths: files, models, embeddings, GETs included): an answer's status speaks for that API only, not for the
        replica's generation calls (a 429 of the files API's own rate limit, a 503 of its backend), so it cools
        nothing and counts toward no circuit; only transport errors count (the host itself did not answer)."""
        policy = self.policy or RetryPolicy()
        for failure in failures:
            state = failure.state
            if failure.local:  # its connection failed here: nothing the replica did, nor an answer to its probe,
                self.replicas.probe_unsent(state)  # which is due again at once
                continue
            if failure.status_code is not None and not failure.torn:  # a torn answer teaches nothing of its own
                self.replicas.saw_headers(state, now, failure.headers)
                if not judged:  # it was no probe: a probe of another call's answers for the replica
                    continue
            if failure.overload:  # 429/503/529 or an in-stream overload error, with or without Retry-After
                if _refused_for_its_size(failure):
                    self.replicas.probe_answered(state)  # room for the others: a cool-down it probed ends
                    self.replicas.answered(state)
                    continue
                if self._provider_limit(failure):
                    continue  # no Retry-After: the rate-limit layer lowered its bucket to the room reported
                # A 429 is the limit's that got it (its key's limit or quota); the rest the replica's own.
                holder = caller() if failure.status_code == 429 and not state.replaces_credential else None
                refusals, holder = self.replicas.refused(state, holder)  # its keys', or every caller's
                probing = state.probing and holds_for_caller(state.holder)
                if not _cools(failure, refusals, probing, policy.max_retry_after):
                    continue  # a refusal among calls served: its own retry waits (its Retry-After), not the others
                seconds, why = failure.retry_after, "retry_after"
                if seconds is None:
                    seconds, why = policy.overload_cooldown, "overload"
                asked = seconds if seconds > policy.max_retry_after else None
                seconds = min(seconds, policy.max_retry_after)
                self.replicas.cool_down(
                    state, now, seconds, asked, unnamed=why == "overload", injected=failure.injected, holder=holder
                )
                self._instrumentation.replica_cooled(state.name, seconds, why)
                continue
            self.replicas.probe_answered(state)
            if failure.status_code is not None:
                self.replicas.answered(state)  # it took the request: its run of overload answers ends
            if failure.status_code in REJECTIONS and not failure.torn:  # 401/403/404: weighed, never a circuit's
                self.replicas.rejected(state, now, failure.status_code)
                continue
            if not failure.replica_failed:  # a transport error, a 5xx or a 408: the replica's own failure
                continue
            if counted is not None:
                if id(state) in counted:
                    continue
                counted.add(id(state))
            if self.replicas.failed(
                state, now, policy.circuit_failures, policy.circuit_cooldown, injected=failure.injected
            ):
                self._instrumentation.replica_cooled(state.name, policy.circuit_cooldown, "circuit_open")

    def _provider_limit(self, failure: AttemptFailure) -> bool:
        """A 429 with rate-limit headers (`remaining_room`) and no Retry-After from a replica under a configured
        `RateLimit`: the bucket, lowered to the room reported, paces the next attempts. A Retry-After is the
        server's own word on when to come back: it is honoured whatever else the 429 carries."""
        return (
            failure.status_code == 429
            and failure.retry_after is None
            and self._rate_limited is not None
            and self._rate_limited(failure.state.name)
            and remaining_room(failure.headers) != (None, None)
        )

    def broke(self, state: ReplicaState, now: float, *, injected: bool = False) -> None:
        """A stream that broke after its first token and was replaced by a continuation: counted toward its
        replica's circuit like a transport error before the first token (it cost one extra request); ``injected``:
        the break was a `Chaos` fault."""
        policy = self.policy or RetryPolicy()
        if self.replicas.failed(state, now, policy.circuit_failures, policy.circuit_cooldown, injected=injected):
            self._instrumentation.replica_cooled(state.name, policy.circuit_cooldown, "circuit_open")

    def _retryable(self, call: Call, failure: AttemptFailure) -> bool:
        assert self.policy is not None
        if failure.is_connect_error:
            return True
        if isinstance(failure.error, httpx.ReadTimeout) and (not call.sdk_retries or failure.failed_reading):
            # The caller's own read timeout (the request carries it to the pool): its SDK's to retry, as without a
            # guard; after a stream's headers not even its SDK's (it meets it reading the stream it returned).
            return False
        if failure.headers.get("x-should-retry") == "false":  # the server's word, which the SDKs obey too
            return False
        if not call.retry_any_status:
            return False
        if failure.status_code in REJECTIONS and failure.state.health.drained:
            return True  # a drained replica's probe (drained for rejecting what the others serve): not the call's
        if failure.status_code is not None:
            return failure.status_code in self.policy.retry_statuses or failure.overload
        return failure.is_transport_error

    def _plan(
        self,
        call: Call,
        route: Route,
        last: AttemptFailure,
        rounds: int,
        used_up: bool,
        failed: list[ReplicaState],
        *,
        asked: dict[int, float] | None = None,
        last_one: bool = False,
        earliest: float | None = None,
        faults: ConnectFaults | None = None,
        cuts: bool = False,
        answered: dict[int, AttemptFailure] | None = None,
    ) -> tuple[float, ReplicaState, Payment] | Failed | AwaitServing:
        """(seconds to wait, replica, payment) for round ``rounds + 1``, or why the route ends now (``used_up``: the
        requests it may send are sent), or how long to wait for a replica to serve again (`AwaitServing`).
        ``asked``: when each replica's Retry-After to this call ends (a retry goes back no sooner); ``last_one``: the
        retry is the last request the route may send. ``earliest``: the call waited already (`_await_serving`); its
        retry goes no sooner, and a refusal stands. ``faults``: the call's failures to connect (`_backoff`). ``cuts``:
        every failure of the call came inside a 2xx answer (`AttemptFailure.in_ok_answer`: a stream cut after its
        headers, an error event before the first token), none the plain SDK retries: whatever pace its server asked
        for, its retry goes past the bound only as `_pace_refused` lets it. ``answered``: each replica's last answer to
        the call (`_note_answers`), which a retry after a refused connection may go back to (`_reached_instead`)."""
        asked = asked or {}
        if self.policy is None or not self._retryable(call, last):
            return Failed(stopped="not_retryable")
        if used_up:
            return Failed(stopped="rounds")
        if not call.judges:
            return self._plan_unjudged(call, route, last, rounds, failed, asked, cuts, answered or {})
        now = call.clock()
        deadline = call.first_token_deadline if route.deadline is None else route.deadline
        # A retry may go back to a replica that failed this call when no other is ready; a continuation never
        # does (the caller is waiting mid-answer: the next replica, or the original error at once).
        avoid = (*route.avoid, *failed) if route.kind == "continuation" else route.avoid
        beyond = last.retry_after is not None and last.retry_after > self.policy.max_retry_after
        # A replica that asked this call for more rest than the guard waits (a daily quota's Retry-After: 86400), or
        # failed it as every request there would (`AttemptFailure.recurs`), gets none of its retries, whichever
        # replica failed it last; after such an answer another replica that is ready may serve it, else that answer
        # is final at once.
        avoid = (*avoid, *(s for s in failed if asked.get(id(s)) == math.inf))
        key = call.affinity_key  # a keyed call's retry goes to the key's next replica
        state = self.replicas.pick_ready(now, (*avoid, *failed), key)
        if state is None:  # back to one that failed this call: the one whose Retry-After to it ends first
            state = self._soonest_back(now, self.replicas.pick_ready(now, avoid, key), asked, failed, avoid)
            answer = self._reached_instead(call, now, last, state, asked, answered or {}, faults, avoid, deadline)
            if answer is not None:  # planned as a return to that replica after its own answer
                state, last = answer.state, answer
        elif last_one and last.retry_after is not None:
            # The last request goes back to the replica whose Retry-After ends first, when that fits the deadline,
            # rather than to one not tried: two that asked to wait say the limit is wider than one replica, and the
            # plain SDK's last request waits it out.
            asker = self._soonest_back(now, None, asked, failed, avoid)
            if asker is not None and fits_deadline(call, now, asked[id(asker)] - now, deadline):
                state = asker
        # Not cooling, and not in a run of overload answers that cooled it (a cool-down over with nothing served
        # since): no replica is ready in an overload of every one.
        ready = state is not None and state.refusals_in_row() < REFUSALS_TO_COOL
        if state is None and not last.overload:
            # Every replica cooling (each asked for rest, e.g. a quota's long Retry-After), and this one failed without
            # asking: its retry goes as a first attempt would, spread over them by the router, after its backoff (the
            # plain SDK's retry waits that, not for a cool-down to end).
            state = self.replicas.pick(now, avoid, key, take=False)
        if state is None and last.recurs:
            # Failed as every request there would (`AttemptFailure.recurs`), and no other replica can take it: the
            # guard sends no more, and leaves the failure to the SDK's retries, as without a guard (not a final
            # "no_replica"): max_retries=0 gets it at once, and a retry the plain SDK sends is sent (behind one
            # name, a certificate rotation half rolled out serves the next connection).
            return Failed(stopped="not_retryable")
        if state is None:
            soonest = self.replicas.cooling_wait(now, avoid)
            if soonest is None or beyond:  # every circuit open (outside panic mode), or all avoided; or it asked
                return Failed(stopped="no_replica")  # for rest beyond: no wait for another's cool-down either
            if not fits_deadline(call, now, soonest, deadline):  # the cause; the caller gets the attempts' failure
                left = self.replicas.cooling_left(now, avoid)
                return Failed(
                    reason=AllReplicasCooling(
                        f"every replica is cooling down for at least {left:.3f}s more (server Retry-After); "
                        f"with a first token taking about {first_token_reserve(call):.3f}s, that does not fit "
                        f"the {deadline - now:.3f}s left before the ttft deadline of tier {call.tier_name!r} "
                        f"({deadline_text(call.tier.ttft)}); gave up after {len(call.record.attempts)} attempt(s)",
                        request=call.request,
                        record=call.record,
                        retry_after=left,
                    ),
                    stopped="deadline",
                )
            wait = soonest
            # Chosen ahead: the probe is taken only when the retry is sent as the probe (see __call__), not
            # by a retry the server paced past it (it goes after the cool-down, below).
            state = self.replicas.pick(now + soonest, avoid, key, take=False) or last.state
        elif (last.retry_after is not None or last.overload) and not _times_failed(state, route, failed):
            wait = 0.0  # overload on one replica: go to another, not tried by the call yet, at once
        else:
            said = _server_says_when((answered or {}).get(id(state)))
            wait = self._backoff(last, rounds, 0 if said else _times_failed(state, route, failed), faults)
        # Back to a replica whose server set the pace: not before its cool-down ends (not at its probe).
        if earliest is not None:
            wait = max(wait, earliest - now)
        told = asked.get(id(state), now) - now  # its Retry-After to this call (the last's too): no sooner
        wait = max(wait, told)
        server_paced = _server_paced(last)
        paced = ((server_paced and state is last.state) or told > 0.0) and not self._provider_limit(last)
        if paced:
            wait = max(wait, state.cooling_end() - now)
        if not fits_deadline(call, now, wait, deadline):
            return Failed(stopped="deadline")
        # A server's pace takes past the bound the retry the plain SDK sends; it sends none of a failure inside a 2xx
        # answer (``cuts``), whatever its error event says (a 429, a Retry-After): `_pace_refused` decides those.
        past_bound = route.kind != "continuation" and not cuts
        payment = Payment() if last.refused else call.pay_extra(route.budget, paced and past_bound)
        if payment is None and past_bound and not paced and server_paced:
            back = self._back_to_asker(now, last, avoid)  # the retry elsewhere refused: paced back where it asked
            if back is not None:
                state, wait = last.state, back
                if fits_deadline(call, now, wait, deadline):
                    payment = call.pay_extra(route.budget, paced=True)
        elif payment is None and route.kind != "continuation":
            untried = not any(f is state for f in failed)
            least = self._pace_refused(now, last, state, ready, rounds, avoid, cuts and not untried)  # as plain's
            if least is not None:
                wait = max(wait, least)
                if fits_deadline(call, now, wait, deadline):
                    payment = call.pay_extra(route.budget, paced=True)
        if payment is None:
            refused = Failed(
                reason=BudgetExhausted(
                    f"the retry budget (shared by retries and hedges) is empty; tier {call.tier_name!r} call "
                    f"ends after {len(call.record.attempts)} attempt(s) with the last answer",
                    request=call.request,
                    record=call.record,
                    retry_after=last.retry_after,
                ),
                stopped="budget",
            )
            waiting = (
                None
                if earliest is not None or route.kind == "continuation"
                else self._patience(call, now, last, ready, rounds, avoid, deadline, refused)
            )
            return refused if waiting is None else waiting
        return wait, state, payment

    def _backoff(self, last: AttemptFailure, rounds: int, times: int, faults: ConnectFaults | None) -> float:
        """The wait before the retry after round ``rounds`` that neither a server nor a cool-down paces: the ordinary
        backoff, and at least the plain SDK's after a failure to connect that another replica does not cure (the
        connection failed here, or the retry goes back to a replica that failed the call after two refused it:
        `ConnectFaults.paces`, `ConnectFaults.wait`); else at least the same-replica backoff when the retry goes back
        to a replica that failed the call ``times`` times (it may need a moment to recover)."""
        wait = self.backoff(rounds)
        if faults is not None and faults.paces(last, going_back=times > 0):
            return max(wait, faults.wait(self.backoff.returning, rounds))
        return max(wait, self.backoff.returning(times)) if times else wait

    def _plan_unjudged(
        self,
        call: Call,
        route: Route,
        last: AttemptFailure,
        rounds: int,
        failed: list[ReplicaState],
        asked: dict[int, float],
        cuts: bool,
        answered: dict[int, AttemptFailure],
    ) -> tuple[float, ReplicaState, Payment] | Failed:
        """`_plan` for a call whose answers speak for no replica (`Call.judges`: another API's, another
        deployment's): the replicas' cool-downs and circuits neither hold its retry back nor pace it. It waits for
        its own answers only, as the plain SDK's retry does: its backoff (at least the same-replica backoff back
        to a replica that failed it) and the Retry-Afters it was given (``asked``; a longer one than
        `RetryPolicy.max_retry_after` is not waited for: that replica gets no retry, and the answer is final when no
        other can serve the call). A call `beside` the replicas' paths goes to its own deployment whichever replica
        sends it: each wait it was asked applies, and one beyond the guard's makes the answer final. It is paid from
        the budget, and goes past it when it is empty: each is a retry the plain SDK sends (but for a failure inside a
        2xx answer, `AttemptFailure.in_ok_answer`, which it does not retry: when every failure of the call was one
        (``cuts``), the budget bounds its retries)."""
        assert self.policy is not None
        now = call.clock()
        deadline = call.first_token_deadline if route.deadline is None else route.deadline
        avoid = (*route.avoid, *failed) if route.kind == "continuation" else route.avoid
        never = tuple(s for s in failed if asked.get(id(s)) == math.inf)
        if never and call.beside:  # its deployment asked for more rest than the guard waits
            return Failed(stopped="no_replica")
        avoid = (*avoid, *never)
        key = call.affinity_key
        state = self.replicas.pick(
            now, (*avoid, *failed), key, cornered=True, resting=False, take=False
        ) or self.replicas.pick(now, avoid, key, cornered=True, resting=False, take=False)
        if state is None:
            return Failed(stopped="not_retryable" if last.recurs else "no_replica")  # a recurring failure: see `_plan`
        # Beside: its one deployment, whichever replica sends it.
        times = len(route.earlier_failures) + len(failed) if call.beside else _times_failed(state, route, failed)
        waits = asked.values() if call.beside else [asked.get(id(state), now)]
        told = max(waits, default=now) - now  # no sooner than it was asked (all finite here)
        if times == 0 and not call.beside and (last.retry_after is not None or last.overload):
            wait = 0.0  # refused there: another server at once
        else:
            answer = (last if last.status_code is not None else None) if call.beside else answered.get(id(state))
            said = _server_says_when(answer)
            wait = max(self.backoff(rounds), self.backoff.returning(times) if times and not said else 0.0)
        wait = max(wait, told)
        if not fits_deadline(call, now, wait, deadline):
            return Failed(stopped="deadline")
        # Every such retry is one the plain SDK sends (no hedge, no retry elsewhere it would not): past the budget;
        # but for one of a failure inside a 2xx answer, which it does not retry.
        paced = route.kind != "continuation" and not cuts
        payment = Payment() if last.refused else call.pay_extra(route.budget, paced)
        if payment is None:
            return Failed(stopped="budget")
        return wait, state, payment

    def _patience(
        self,
        call: Call,
        now: float,
        last: AttemptFailure,
        ready: bool,
        rounds: int,
        avoid: tuple[ReplicaState, ...],
        deadline: float,
        refused: Failed,
    ) -> AwaitServing | None:
        """After an overload answer without a Retry-After (a 503 or 529 status: a replica refusing a random share of
        calls, or an engine's full queue), when the budget refused the retry and no replica is ready to take it past
        the bound (each cooling at its third refusal in a row, or back from one with nothing served since): how long
        the call waits for one to serve a call again, which ends its cool-down: the backoff of a retry to the same
        replica, as the plain SDK's retry waits, or until the first cool-down ends if later, within the call's
        deadline. None: it does not wait, the refusal stands."""
        if not self._awaits_serving(last, ready):
            return None
        backoff = self.backoff.returning(rounds)
        patience = max(backoff, self.replicas.cooling_left(now, avoid))
        if not fits_deadline(call, now, patience, deadline):
            return None
        return AwaitServing(now + backoff, now + patience, refused)

    def _awaits_serving(self, last: AttemptFailure, ready: bool) -> bool:
        """Whether the retry of ``last``, refused by the budget with no replica ready, waits for one to serve again
        (`_patience`): after an overload answer in a status, without a Retry-After."""
        return (
            not ready
            and last.overload
            and last.stream_failure is None
            and not _server_paced(last)
            and not self._provider_limit(last)
        )

    async def _await_serving(
        self,
        call: Call,
        route: Route,
        last: AttemptFailure,
        rounds: int,
        failed: list[ReplicaState],
        waiting: AwaitServing,
        asked: dict[int, float],
        faults: ConnectFaults,
        cuts: bool,
        answered: dict[int, AttemptFailure],
    ) -> tuple[float, ReplicaState, Payment] | Failed:
        """Wait until ``waiting.until`` for a replica to serve a call again (`ReplicaSet.cooling_changed`: a served call
        ends the guard's own cool-down), planning the retry anew at each change and at the end; the retry goes no sooner
        than ``waiting.earliest`` (the waiters, woken together, go at their own backoffs). The budget's refusal stands
        when no replica is ready by then."""
        while True:
            plan = self._plan(
                call,
                route,
                last,
                rounds,
                False,
                failed,
                asked=asked,
                earliest=waiting.earliest,
                faults=faults,
                cuts=cuts,
                answered=answered,
            )
            assert not isinstance(plan, AwaitServing)
            left = waiting.until - call.clock()
            if left <= 0.0 or not isinstance(plan, Failed) or plan.stopped != "budget":
                return plan
            await self.replicas.cooling_changed.wait(left)

    def _remember_asked(self, now: float, failures: list[AttemptFailure], asked: dict[int, float]) -> None:
        """Note in ``asked`` when each of ``failures``' Retry-Afters ends: a retry of this call goes back to that
        replica no sooner, whichever replica failed it since; never (inf) after one longer than
        `RetryPolicy.max_retry_after` (a quota's), which the guard does not wait for, nor after a failure every
        request there would repeat (`AttemptFailure.recurs`: a refused certificate, a proxy's 407)."""
        longest = (self.policy or RetryPolicy()).max_retry_after
        for failure in failures:
            if failure.recurs:
                asked[id(failure.state)] = math.inf
            elif failure.retry_after is not None and failure.retry_after > 0.0:
                asked[id(failure.state)] = now + failure.retry_after if failure.retry_after <= longest else math.inf

    def _soonest_back(
        self,
        now: float,
        chosen: ReplicaState | None,
        asked: dict[int, float],
        failed: list[ReplicaState],
        avoid: tuple[ReplicaState, ...],
    ) -> ReplicaState | None:
        """Going back to a replica that failed this call: ``chosen`` (the router's choice among the ready ones), unless
        it asked this call to wait (`asked`) and another that failed it lets it back sooner; with none chosen, the
        ready one that asked whose wait ends first (None: none asked)."""
        ready = [s for s in failed if self.replicas.allows(now, s, avoid) and not s.cooling(now) and not s.open(now)]
        if chosen is None:
            ready = [s for s in ready if id(s) in asked]
        elif asked.get(id(chosen), now) <= now:
            return chosen
        return min(ready, key=lambda s: asked.get(id(s), now), default=chosen)

    def _reached_instead(
        self,
        call: Call,
        now: float,
        last: AttemptFailure,
        chosen: ReplicaState | None,
        asked: dict[int, float],
        answered: dict[int, AttemptFailure],
        faults: ConnectFaults | None,
        avoid: tuple[ReplicaState, ...],
        deadline: float,
    ) -> AttemptFailure | None:
        """Going back to ``chosen``, a replica that only refused the call's connections: rather, the last answer of a
        ready replica that answered the call, whose wait (its Retry-After or cool-down) ends first, if that fits the
        deadline and that replica is in no run of refusals (`REFUSALS_TO_COOL`: a limit refusing every call, where
        the one that refused, perhaps restarting, is the better chance). None: go to ``chosen`` (and after a
        connection that failed in this process, which no replica cures)."""
        if chosen is None or faults is None or not faults.only_refused(chosen) or last.local:
            return None
        candidates = [
            answer
            for answer in answered.values()
            if self.replicas.allows(now, answer.state, avoid)
            and not answer.state.open(now)
            and answer.state.refusals_in_row() < REFUSALS_TO_COOL
        ]

        def back_at(answer: AttemptFailure) -> float:  # its Retry-After to the call, its cool-down after that answer
            return max(asked.get(id(answer.state), now), answer.state.cooling_end())

        best = min(candidates, key=back_at, default=None)
        if best is None or not fits_deadline(call, now, back_at(best) - now, deadline):
            return None
        return best

    def _back_to_asker(self, now: float, last: AttemptFailure, avoid: tuple[ReplicaState, ...]) -> float | None:
        """When the budget refused a retry to another replica after ``last`` asked to wait (`_server_paced`: a
        Retry-After, or a 429 without one): the seconds before the paced retry back to the replica that asked (its
        cool-down's end, no sooner than its Retry-After), as with that replica alone; None when it is excluded (a
        Retry-After longer than the guard waits, an open circuit) or a provider rate limit paces its 429s
        instead."""
        assert self.policy is not None
        state = last.state
        if self._provider_limit(last) or not self.replicas.allows(now, state, avoid):
            return None
        asked = min(last.retry_after or 0.0, self.policy.max_retry_after)
        return max(asked, state.cooling_end() - now, 0.0)

    def _pace_refused(
        self,
        now: float,
        last: AttemptFailure,
        state: ReplicaState,
        ready: bool,
        rounds: int,
        avoid: tuple[ReplicaState, ...],
        cuts_back: bool,
    ) -> float | None:
        """When the budget refused the retry of ``last``, the replica's own failure (a 5xx, a 408, a transport error, an
        overload answer without a Retry-After): the least seconds before it goes instead to ``state`` as a paced retry,
        past the bound, as the plain SDK's retry would go; None when it does not (the bound holds), as when every
        failure of the call came inside a 2xx answer (`AttemptFailure.in_ok_answer`: a stream cut after its headers, an
        error event before its first token; the plain SDK had it as a success, and sends no retry) and the retry would
        go back to a replica that failed it (``cuts_back``): such a failure is paced only to a replica not tried yet
        (another may not share the fault: a gateway's idle timeout, a backend's broken stream).

        It goes to a ready replica (circuit closed, not cooling: `_plan` chose it, another than those that failed the
        call when one is ready), after the backoff of a retry to the same replica (`Backoff.returning`), or at once
        after an overload answer (another replica is ready). Every replica cooling (an overload of every one: each cools
        at its `REFUSALS_TO_COOL`-th refusal in a row, or its first in-stream one) or open (panic mode) leaves none
        ready, and the bound holds. The only replica left (one configured, or the others excluded or open) stands in for
        a ready one, cooling or open: with nowhere else to go, the retry goes at the end of its cool-down; once its
        circuit has opened (it failed `RetryPolicy.circuit_failures` calls in a row, none served since) it is also
        cooled for `RetryPolicy.overload_cooldown` unless it is cooling already (reason ``"failing"``), so new first
        attempts wait for its probe. A replica that fails some calls and serves the others holds back no other call."""
        assert self.policy is not None
        if not (last.overload or last.replica_failed) or self._provider_limit(last) or cuts_back:
            return None
        lone = self.replicas.alone(now, avoid) is state
        if not lone and (not ready or state.open(now)):
            return None
        if lone and state.tripped and not state.cooling(now):
            seconds = self.policy.overload_cooldown
            self.replicas.cool_down(state, now, seconds)
            self._instrumentation.replica_cooled(state.name, seconds, "failing")
        if state.cooling(now):
            return state.cooling_end() - now
        if last.overload and state is not last.state:
            return 0.0
        return self.backoff.returning(rounds)


def _server_paced(failure: AttemptFailure) -> bool:
    """Whether the server set the pace of ``failure``'s retry back to it: a Retry-After, or a 429 without one (the
    server refused this client, cheaply; the guard's cool-down stands in for the wait, and the plain SDK would
    retry it too). A 503 without one is not: while the budget has room its retry goes at its backoff, as the plain
    SDK's does, or elsewhere."""
    if failure.retry_after is not None:
        return failure.retry_after > 0.0
    return failure.status_code == 429


def _cools(failure: AttemptFailure, refusals: int, probing: bool, longest: float) -> bool:
    """Whether an overload answer cools its replica for the other calls: at its `REFUSALS_TO_COOL`-th in a row (a rate
    limit or a full queue refuses every call until it frees, where a replica refusing some calls at random serves the
    others between), or when it answers the probe of the replica's cool-down (refused again: the cool-down is renewed).
    At once: a 429 without a Retry-After (the server refused this client, cheaply: the cool-down stands in for the wait
    it did not name) or whose rate-limit headers report none left in a limit (spent for every caller), an overload error
    inside a 200 stream (no SDK retries one: every retry of it is load the guard adds, within the budget's bound but
    to a replica the call has not tried: `RetryLayer._pace_refused`),
    a Retry-After longer than the guard waits (``longest``: a quota's, which holds for every call) and an answer marked
    ``x-should-retry: false``. Before that, a Retry-After paces the retry of the call that got it only
    (`RetryLayer._plan`), as the plain SDK's retry follows it."""
    if failure.stream_failure is not None or probing or refusals >= REFUSALS_TO_COOL:
        return True
    if failure.status_code == 429 and (failure.retry_after is None or room_left(failure.headers) is False):
        return True
    return failure.retry_after is not None and (
        failure.retry_after > longest or failure.headers.get("x-should-retry") == "false"
    )


def _refused_for_its_size(failure: AttemptFailure) -> bool:
    """A 429 whose rate-limit headers report room left in every limit they report: the provider refused that
    request for its own size (its prompt and ``max_tokens`` do not fit yet), not the endpoint for every caller.
    Its Retry-After paces that call's own retry; the replica is not cooled for the other calls."""
    return failure.status_code == 429 and failure.stream_failure is None and room_left(failure.headers) is True


def _server_says_when(answer: AttemptFailure | None) -> bool:
    """Whether a retry back to a replica whose own last answer to the call (``answer``) asked for a wait (a positive
    Retry-After) waits that alone, the server's word, rather than also the same-replica backoff, as the SDKs' retries
    do."""
    return answer is not None and answer.retry_after is not None and answer.retry_after > 0.0


def _times_failed(state: ReplicaState, route: Route, failed: list[ReplicaState]) -> int:
    """How many times ``state`` failed the call: in this route (``failed``) and in the call's earlier requests (the
    SDK's, in the cooperative mode: `Route.earlier_failures`). The wait before going back to it grows with them."""
    return sum(f is state for f in (*route.earlier_failures, *failed))


def _note_answers(failures: list[AttemptFailure], answered: dict[int, AttemptFailure]) -> None:
    """Note in ``answered`` each replica's last answer to the call that the plain SDK retries (a status, not an
    error inside a 2xx answer, which it does not); any other failure there since (a reset, a refused connection)
    forgets it."""
    for failure in failures:
        if failure.status_code is not None and not failure.in_ok_answer:
            answered[id(failure.state)] = failure
        else:
            answered.pop(id(failure.state), None)


def _cooling_refusal(call: Call, why: str, retry_after: float, stopped: Stop) -> Failed:
    """A first attempt refused before it was sent because the one replica left is cooling (`AllReplicasCooling`)."""
    reason = AllReplicasCooling(why, request=call.request, record=call.record, retry_after=retry_after)
    return Failed(reason=reason, stopped=stopped)
