"""GuardTransport: the one integration point, an httpx transport that runs the pipeline.

The transport runs calls; it builds nothing. The pipeline it is given (`GuardTransport.pipeline`, a
`llmguard_client._core.pipeline.Pipeline` assembled by `llmguard_client._compose.build_pipeline`; drawn in
docs/architecture.md) is, outermost first::

    rollout   -> cohort guarded | control: decided before the Call is built; a control call (and every call
                 while the guard is off) is passed through (_rollout.passthrough). Before it, for every call:
                 refused at once after ``Guard.aclose()`` or for an unknown tier or cohort header (`refuse`)
    bulkhead  -> per-tier slot, bounded waiting, fast failure          (phase: queued)
    deadline  -> one cancel scope until the route's first token
    retry     -> routes the call; rounds under the shared budget and Retry-After
    hedge     -> staggered attempts on different replicas, first content token wins
    ratelimit -> each attempt charged to the provider's rate limit before it is sent
    attempt   -> one physical request to one replica
    -- first token: the body (`GuardBody`) runs the stream stages: stall/total deadlines, the protocol
       reader, continuation (a route through deadline -> retry -> attempt) --

Each call gets one `CallLease` that owns everything the layers acquire; a winner's response body carries
the lease to the caller and closes it exactly once. Failures are mapped to the caller in one place, `_give_up`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import replace

import anyio
import httpx

from llmguard_client._budget.budget import RetryBudget
from llmguard_client._core.call import Call
from llmguard_client._core.caller_intent import check_timeouts, max_attempts, pool_timeout, within_read_timeout
from llmguard_client._core.clock import Clock, current_time_source, is_cancellation
from llmguard_client._core.cooperative import allow_retry, next_episode, resume, sdk_rounds
from llmguard_client._core.failure import (
    attempts_error,
    describe_attempts,
    failure_response,
    met_reading,
    untold_answer,
    upstream_response,
)
from llmguard_client._core.given_up import Episode, GivenUp, HandedBack, SdkCall, from_sync_edge, sdk_call
from llmguard_client._core.given_up import again as again_error
from llmguard_client._core.headers import CAUSE_HEADER, KNOWN_HEADERS, TIER_HEADER, CallerHeaders
from llmguard_client._core.lease import CallLease, LeaseRegistry
from llmguard_client._core.loop_owner import FORKED, LoopEnded, LoopOwner
from llmguard_client._core.outcome import AttemptFailure, Failed, Route, Win
from llmguard_client._core.pipeline import Pipeline
from llmguard_client._core.request import RequestFacts, json_document
from llmguard_client._http.network_stream import for_caller
from llmguard_client._http.origin import origin
from llmguard_client._http.pool import pool_idle
from llmguard_client._http.redirects import RedirectTargets
from llmguard_client._http.upload import sent_once, streamed_body
from llmguard_client._rollout.passthrough import PassthroughPool, passthrough
from llmguard_client._rollout.rollout import Assignment, Rollout
from llmguard_client._routing.reach import Reach
from llmguard_client._routing.replicas import ReplicaSet
from llmguard_client._routing.ttft_stats import TTFTStats
from llmguard_client._stream.body import GuardBody
from llmguard_client._stream.continuation import CallContinuation
from llmguard_client._stream.stages import StreamStages
from llmguard_client.config import FailureMode, RetryPolicy, Tier
from llmguard_client.errors import (
    GuardClosed,
    GuardFailure,
    GuardRequestError,
    GuardTimeout,
    GuardUnavailable,
    TotalTimeout,
    TTFTTimeout,
    UnknownTierError,
    WrongEventLoop,
)
from llmguard_client.telemetry._record_builder import CallRecordBuilder
from llmguard_client.telemetry.capture import deliver_to_captures
from llmguard_client.telemetry.hooks import Instrumentation
from llmguard_client.telemetry.record import CallStatus, OneAttempt, PhaseRecord

logger = logging.getLogger("llmguard_client")

RecordCallback = Callable[[PhaseRecord], None]
_RETRY_HEADERS = frozenset({b"content-length", b"x-should-retry", b"retry-after", b"retry-after-ms"})
"""Left out of an answer kept to hand back again as final (`GuardTransport._decline` sets its own)."""
_SIGNED_ORIGINS_NOTED = 16
"""Origins no replica has that signed requests named, warned of at most."""
STACKING_WARNING = (
    "llmguard: an SDK retried a call the guard had already given up on (failure_mode='raise'); the retry was "
    "failed at once, but the SDK's own retries wait their backoff first: give the SDK client max_retries=0, "
    "or leave failure_mode='auto'"
)


class GuardTransport(httpx.AsyncBaseTransport):
    """An `httpx.AsyncBaseTransport` that routes each request to the guard's replicas.

    Build it through `Guard` (which assembles what it is given: the pipeline and the state every call
    shares); it only runs calls. Its ``aclose`` does nothing, because the pools belong to the `Guard`
    (several clients may share one transport): close the `Guard`.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        stream: StreamStages,
        *,
        replicas: ReplicaSet,
        tiers: Mapping[str, Tier],
        default_tier: str,
        tier_var: ContextVar[str | None],
        budgets: Mapping[str, RetryBudget | None],
        ttft_stats: TTFTStats,
        rollout: Rollout,
        passthrough_pool: PassthroughPool,
        registry: LeaseRegistry,
        instrumentation: Instrumentation,
        on_record: RecordCallback | None,
        clock: Clock,
        failure_mode: FailureMode,
        generation: Callable[[str], bool],
        retries: bool,
        cooperative: RetryPolicy | None = None,
    ) -> None:
        self.pipeline = pipeline
        """What every guarded call runs through before its first token (and a continuation's path)."""
        self.stream = stream
        """The stages after the first token: the read deadlines and the continuation."""
        self._replicas = replicas
        self._affinity = replicas.affinity
        self._bases = tuple(s.base for s in replicas.states)
        self._reach = Reach(self._bases)
        self._tiers = dict(tiers)
        self._default_tier = default_tier
        self._tier_var = tier_var
        self._budgets = dict(budgets)
        self._ttft_stats = ttft_stats
        self._rollout = rollout
        self.passthrough_pool = passthrough_pool
        """Control calls' transports (the Guard closes them)."""
        self._registry = registry
        self._instrumentation = instrumentation
        self._on_record = on_record
        self._clock = clock
        self._failure_mode = failure_mode
        self._generation = generation
        """Whether a path is a generation call (idempotent-safe to hedge and to retry on any status)."""
        self._retries = retries
        self._cooperative = cooperative
        """The retry policy when its mode is "cooperative" (an SDK sends the retries the guard allows), else None."""
        self._given_up = GivenUp()
        """Calls given up on with an error, or whose retry the SDK sends: `llmguard_client._core.given_up`."""
        self._warned_stacking = False
        self.loops = LoopOwner(self._new_pools, self._idle)
        """Which event loop the Guard's connections belong to; where sync calls run."""
        self._redirects = RedirectTargets[Assignment](self._bases)
        """Redirects to origins that are no replica's, until the request that follows each comes."""
        self._signed_elsewhere: set[str] = set()
        """Origins no replica has that signed requests were sent to (warned of once each)."""

    @property
    def closed(self) -> bool:
        return self._registry.closed

    def _new_pools(self) -> list[httpx.AsyncBaseTransport]:
        """New connection pools for the replicas and the control calls (the next event loop's); the old ones,
        for `LoopOwner` to close. Nothing once the Guard is closed: its pools are closed already."""
        if self._registry.closed:
            return []
        return [*self._replicas.renew_transports(), *self.passthrough_pool.renew()]

    def _idle(self) -> bool:
        """No call in flight, guarded (a live lease, even between attempts) or not (a request in a pool)."""
        if self._registry.live:
            return False
        return all(pool_idle(t) for t in (*self._replicas.transports(), *self.passthrough_pool.shared()))

    # --- the request path -----------------------------------------------------------------

    # A sync client given this async transport (``httpx.Client(transport=guard.transport)``, e.g. through a
    # framework's ``http_client_kwargs``) is told what to use instead, not left with an AttributeError: on its
    # first request, or on ``with`` (which enters its transport). Its close() is a no-op, as aclose() is.

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        raise TypeError(SYNC_CLIENT_MESSAGE)

    def __enter__(self) -> GuardTransport:
        raise TypeError(SYNC_CLIENT_MESSAGE)

    def close(self) -> None:
        """Nothing to do, as for ``aclose``."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """The call's response, or its error; either way it has passed through the event loop at least once.

        A refusal made before any I/O (a full bulkhead, `Admission`, a rate limit, every replica cooling, the
        budget, a bad request, a closed Guard) would otherwise come back without ever suspending, where the plain
        SDK always awaits the network: a caller that tries again at once on it would spin, starving every other
        task of the loop (the call holding the slot it waits for among them). So an error raised, or an answer
        made in memory (the guard's own, or a server's error answer kept whole), first yields once, as a
        cancellation point; a response whose body is still to be read (a winner's stream, a pass-through) is
        returned as it is: the success path pays one type check, and a cancellation leaves no open body behind."""
        try:
            response = await self._handle(request)
        except Exception:
            await anyio.lowlevel.checkpoint()
            raise
        if type(response.stream) is httpx.ByteStream:
            await anyio.lowlevel.checkpoint()
        return response

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        if not isinstance(request, httpx.Request):  # e.g. httpx2.AsyncClient(transport=guard.transport)
            raise TypeError(wrong_client_message(request))
        headers = CallerHeaders(request)
        try:  # refused before anything starts: closed, a bad URL or loop, a guard header naming nothing configured
            if self._registry.closed:
                raise GuardClosed("this Guard is closed; build a new Guard to send more requests", request=request)
            if self.loops.forked:  # in a child forked while a loop owned the Guard: that loop stayed in the parent
                raise GuardClosed(FORKED, request=request)
            if request.url.scheme not in ("http", "https") or not request.url.host:
                raise GuardRequestError(
                    f"the request URL {str(request.url)!r} is not an absolute http:// or https:// URL; give the "
                    "client a base_url (e.g. one of the replicas) or send to a full URL",
                    request=request,
                )
            if headers.unknown is not None:  # for every cohort, like the tier
                raise GuardRequestError(
                    f"unknown header {headers.unknown!r}: the guard's own headers are {KNOWN_HEADERS}; nothing was "
                    "sent",
                    request=request,
                )
            check_timeouts(request)
            tier_name = self._resolve_tier(headers, request)  # for every cohort: a typo fails at 5 % as at 100 %
            if not self.loops.owns():  # a handover from the Guard's own sync loop is waited for within the ttft
                handover = self._tiers[tier_name].ttft
                wrong_loop = await self.loops.claim(handover)
                if wrong_loop is not None:
                    raise WrongEventLoop(wrong_loop, request=request)
            attempts = max_attempts(headers.max_attempts, self._tiers[tier_name], request)
            followed = self._redirects.take(request.url, self._clock()) if len(self._redirects) else None
            # before a Call: a control call never builds one; a redirect followed elsewhere keeps its call's cohort
            if followed is None and self._rollout.settle is not None:
                connecting = self._rollout.settle()  # the fleet's flag (a kill switch) for a new process's calls
                if connecting is not None:
                    await connecting
            streamed = streamed_body(request)  # sent as it is read: never held here
            sdk = await sdk_call(request, held=streamed is None)  # the SDK call: its retries get its cohort
            assignment = self._rollout.assign(request, headers, sdk) if followed is None else followed
        except GuardFailure as refused:
            if isinstance(refused, LoopEnded) and from_sync_edge(request):
                raise  # a sync call that missed the loop it was to run on, nothing sent: its edge sends it again
            return self.refuse(request, refused, headers)
        if followed is not None:  # sent where the redirect points, as the SDK's own client would
            response = await self._pass_through(request, followed, tier_name, "other_origin", headers, sdk)
        elif headers.signed is not None and headers.signed.url and not self._reach.serves_signed(request.url):
            # signed for an origin that is no replica's: no replica could send it as it is; there, once, as it is
            self._warn_signed_elsewhere(request.url)
            one: OneAttempt | None = "signed_other_origin" if assignment.cohort != "control" else None
            response = await self._pass_through(request, assignment, tier_name, one, headers, sdk)
        else:
            response = await self._in_cohort(request, headers, assignment, tier_name, attempts, streamed, sdk)
        self._redirects.note(request, response, assignment, self._clock(), own=followed is None)
        return response

    async def _in_cohort(
        self,
        request: httpx.Request,
        headers: CallerHeaders,
        assignment: Assignment,
        tier_name: str,
        attempts: int | None,
        streamed: httpx.AsyncByteStream | None,
        sdk: SdkCall,
    ) -> httpx.Response:
        """The call run as its cohort says: passed through (control), or guarded. ``streamed``: its body when the
        guard sends it as it is read (`streamed_body`); ``sdk``: the SDK call it is a request of (`sdk_call`)."""
        # An SDK's retry of a call given up on or handed back; never one of a body sent once as it came (the SDK's).
        remembered = len(self._given_up) > 0 and not sent_once(streamed)
        held = streamed is None
        again = await self._given_up.recall(request, self._clock(), held, headers.from_sdk) if remembered else None
        episode = again if isinstance(again, Episode) else None  # cooperative mode: the SDK's allowed retry
        handed = again if isinstance(again, HandedBack) else HandedBack(0)  # the SDK's retry of a call handed back
        spent = handed.rounds
        if isinstance(again, GuardFailure):  # an SDK's retry of a call the guard gave up on: the same error
            if self._failure_mode == "raise" and not self._warned_stacking:
                self._warned_stacking = True
                logger.warning(STACKING_WARNING)
            raise again
        if assignment.cohort == "control":
            return await self._pass_through(request, assignment, tier_name, None, headers, sdk)
        call, continuation = await self._start_call(request, headers, assignment, tier_name, streamed, sdk)
        call.max_attempts = attempts
        rounds = 1 if sent_once(streamed) else sdk_rounds(call) if call.sdk_retries else attempts
        route = Route(avoid=call.outside, rounds=rounds, spent=spent)
        if episode is not None and call.sdk_retries:
            resumed = resume(call, episode, self._replicas)
            if resumed is None:
                return await self._decline(call, episode)
            route = resumed
        lease = call.lease
        try:  # every wait inside is a phase of the lease, which Guard.aclose() cancels
            outcome = await self.pipeline.handle(call, route)
        except GuardFailure as refused:  # e.g. GuardClosed from an attempt
            outcome = Failed(reason=refused)
        except BaseException as exc:  # a cancellation (bare, or in a group: `is_cancellation`), or not the guard's
            if is_cancellation(exc):
                await lease.aclose("cancelled", "cancelled_by_caller")
            else:
                await lease.aclose("error", type(exc).__name__)
            raise
        else:
            if lease.aborted:
                outcome = Failed(reason=self._closed_error(call))
        if isinstance(outcome, Win):
            return self._deliver(call, outcome, continuation)
        last = outcome.last
        if outcome.stopped == "sdk" and (last is None or last.as_sent is None or last.failed_reading):
            return await self._hand_back(call, outcome, episode)  # not a 200 whose error event the SDK reads itself
        return await self._give_up(call, outcome, route.spent, handed.retried)  # also a 200 with an error event

    def refuse(
        self, request: httpx.Request, error: GuardFailure, headers: CallerHeaders | None = None
    ) -> httpx.Response:
        """A call refused before it started (``error``: `GuardClosed`, `GuardRequestError`): in response
        mode a proxy-style answer with ``x-should-retry: false`` (an SDK raises it at once instead of
        retrying a "connection error" with backoff), else ``error`` is raised. The sync edges use it too."""
        if self._respond_with_errors(headers if headers is not None else CallerHeaders(request)):
            return failure_response(error, request, None)
        raise error

    def _warn_signed_elsewhere(self, url: httpx.URL) -> None:
        """Log once per origin (a bounded number of them) that signed requests for it are sent there, unguarded."""
        name = origin(url)
        if name in self._signed_elsewhere or len(self._signed_elsewhere) >= _SIGNED_ORIGINS_NOTED:
            return
        self._signed_elsewhere.add(name)
        logger.warning(
            "llmguard: a request signed for %s (its host is a signed header, e.g. AWS SigV4), which is no replica's "
            "origin, is sent there as it is, once, with no retry, hedge or deadline of the guard's (the SDK's own "
            "retries re-sign it); give that URL as a replica to guard its calls",
            name,
        )

    async def _pass_through(
        self,
        request: httpx.Request,
        assignment: Assignment,
        tier: str,
        one_attempt: OneAttempt | None,
        headers: CallerHeaders,
        sdk: SdkCall,
    ) -> httpx.Response:
        """The control cohort (and every call while the guard is off), a request that follows a redirect to an
        origin that is no replica's, and one signed for such an origin (``one_attempt`` says so):
        _rollout.passthrough."""

        def report(record: PhaseRecord) -> None:
            deliver_to_captures(record, request)
            if self._on_record is not None:
                self._on_record(record)

        return await passthrough(
            request,
            self.passthrough_pool.for_url,
            tier=tier,
            cohort=assignment.cohort,
            fraction=assignment.fraction,
            one_attempt=one_attempt,
            sdk_call=sdk,
            signed=headers.signed.headers if headers.signed is not None else frozenset(),
            instrumentation=self._instrumentation,
            on_record=report,
            clock=current_time_source(self._clock).now,
        )

    async def _start_call(
        self,
        request: httpx.Request,
        headers: CallerHeaders,
        assignment: Assignment,
        tier_name: str,
        streamed: httpx.AsyncByteStream | None,
        sdk: SdkCall,
    ) -> tuple[Call, CallContinuation | None]:
        """The call, built complete, and its continuation state (None: its tier has none, or the request
        cannot be continued). A body sent as it is read (``streamed``) is not read here, and is not hedged (two
        attempts would read one file at once); one that can be sent only once gets one attempt, no retry (its
        record says so); the SDK is told to retry neither."""
        time_source = current_time_source(self._clock)  # once per call: the layers ask it, never the loop
        clock = time_source.now
        now = clock()
        sdk_retries = self._cooperative is not None and headers.from_sdk and streamed is None
        tier = self._tiers[tier_name]
        if not sdk_retries:  # the guard retries: the SDK's timeout= bounds the call (cooperative: each SDK request)
            tier = within_read_timeout(tier, request.extensions)
        body = b"" if streamed is not None else await request.aread()
        document = json_document(request, body)  # parsed once: the facts and the affinity key read the same value
        facts = RequestFacts.of(document)
        path = request.url.path
        record = CallRecordBuilder(
            request_id=os.urandom(16).hex(),  # a random 128-bit id, like uuid4().hex at a quarter of the cost
            tier=tier_name,
            cohort="guarded",
            method=request.method,
            path=path,
            start=now,
            start_unix=time.time(),
            model=facts.model,
            stream=facts.stream,
            max_tokens=facts.max_tokens,
            rollout_fraction=assignment.fraction,
            sdk_call=sdk,
        )
        if sent_once(streamed):
            record.one_attempt_because("streamed_body")
        background = facts.background  # a job the server runs on its own: a second request starts a second one
        if background:
            record.one_attempt_because("background")
        signed = headers.signed
        continuer = self.stream.continuation
        continuation = (  # a signed request is sent as it was signed: never with another body
            continuer.for_call(tier_name, request.method, path, body)
            if continuer is not None and facts.stream and signed is None and not background
            else None
        )
        affinity = self._affinity
        key = affinity.key_for(headers.session, body, document) if affinity is not None else None
        generation = self._generation(path)
        signed_url = signed is not None and signed.url  # sent only to its own origin, as it is
        outside, beside = self._reach.where(request.method, request.url, signed_url)
        observation = self._instrumentation.call_started(record)

        def finish(status: CallStatus, cause: str | None) -> None:  # the lease's last act (`_finish`)
            self._finish(call, status, cause)

        call = Call(  # the lease last: nothing after it can fail and leave it registered
            request=request,
            body=body,
            headers=headers.forwarded,
            host=headers.host,
            signed=signed.headers if signed is not None else frozenset(),
            signed_url=signed_url,
            tier_name=tier_name,
            tier=tier,
            respond_with_errors=self._respond_with_errors(headers),
            record=record,
            observation=observation,
            clock=clock,
            time=time_source,
            first_token_deadline=now + tier.ttft,
            total_deadline=now + tier.total,
            pool_wait=pool_timeout(request.extensions),
            # beside: every replica sends it to one place; background: a second request starts a second job
            hedgeable=generation and streamed is None and not beside and not background,
            # background: resent only where nothing was sent (a refused connection); its answers are the SDK's
            retry_any_status=(generation and not background) or request.method in ("GET", "HEAD", "OPTIONS"),
            generation=generation,
            sdk_retries=sdk_retries,
            replica_bases=self._bases,
            outside=tuple(self._replicas.states[i] for i in outside),
            beside=beside,
            budget=self._budgets.get(tier_name),
            ttft_stats=self._ttft_stats,
            affinity_key=key,
            keeps_text=continuation is not None,
            streamed=streamed,
            opening_live=background and facts.stream,
            prompt_chars=facts.prompt_chars,
            media=facts.media,
            choices=facts.choices,
            lease=CallLease(self._registry, finish, time_source),
        )
        return call, continuation

    def _deliver(self, call: Call, win: Win, continuation: CallContinuation | None) -> httpx.Response:
        record, attempt = call.record, win.attempt
        call.deliver(win)
        attempt.attempt_outcome("won")
        record.delivered(attempt, win.response.status_code)
        cached = self._replicas.served(call.affinity_key, win.state)  # expected to hit the cache, or None
        if attempt.ttft is not None:
            stats = self._ttft_stats
            stats.observe(win.state.name, call.tier_name, record.stream, attempt.ttft, cached, call.ttft_size)
        response = httpx.Response(
            win.response.status_code,
            headers=win.response.headers,
            stream=GuardBody(call, win, self.stream, continuation, self._given_up),
            request=call.request,
            extensions=win.response.extensions,  # copied by httpx
        )
        record.hand_over(for_caller(response.extensions))
        return response

    # --- the end of a call ----------------------------------------------------------------

    def _finish(self, call: Call, status: CallStatus, cause: str | None) -> None:
        """The lease's last act, exactly once per call: finalise the record and report it."""
        now = call.clock()
        win = call.delivered
        end = now
        if win is not None:
            attempt = win.attempt
            if attempt.outcome == "won":
                if attempt.finish is None or win.rest is not None:  # a body that broke: the attempt's error too
                    attempt.attempt_finished("won", now, error=cause if status in ("error", "timeout") else None)
                end = attempt.finish if attempt.finish is not None else now
                ok, tokens, duration = _stream_outcome(status, cause, win)
                self._replicas.stream_finished(win.state, now, ok=ok, tokens=tokens, duration=duration)
                facts = win.facts
                call.record.response_facts(
                    facts.prompt_tokens,
                    facts.completion_tokens,
                    facts.response_id,
                    facts.model,
                    facts.finish_reasons,
                    win.reader.chunks,
                )
            else:  # won the race, but the call ended before it was handed over
                attempt.attempt_finished("cancelled", now)
            call.observation.attempt_finished(attempt)
        record = call.record.call_finished(status, cause, end)
        call.observation.call_finished(record)
        deliver_to_captures(record, call.request)
        if self._on_record is not None:
            self._on_record(record)  # contained: what it raises is logged once (`ContainedCallback`)

    def _closed_error(self, call: Call) -> GuardClosed:
        return GuardClosed(
            f"the Guard was closed while this call waited for its first token (tier {call.tier_name!r}, "
            f"{call.clock() - call.record.start:.3f}s elapsed); {describe_attempts(call.record)}",
            request=call.request,
            record=call.record,
        )

    async def _give_up(self, call: Call, outcome: Failed, spent: int = 0, retried: bool = False) -> httpx.Response:
        """End a call without a winner: the last server answer if there is one, else the error its attempts
        met (raised in every failure mode: a timeout stays a timeout, a refused connection a connection error),
        else the guard's own error. A refusal that
        came after attempts were sent (cooling, budget, open circuits) only names the cause, never the type.
        ``spent``: the rounds the call's earlier requests used (`Route.spent`), for an error handed back; ``retried``:
        the guard retried or hedged one of them (`HandedBack.retried`)."""
        error, last, lease = outcome.reason, outcome.last, call.lease
        retried = retried or sum(a.kind != "continuation" for a in call.record.attempts) > 1
        # Its rounds used up after the guard's own retries (they stood in for the SDK's): final, not handed back.
        spent_out = self._retries and outcome.used_up and retried
        if isinstance(error, TTFTTimeout) and call.generation and call.record.stream:
            # No first token in time: a lower bound on each's TTFT, scaled to a typical prompt's.
            scale = self._ttft_stats.scale(call.tier_name, call.record.stream, call.ttft_size)
            self._replicas.timed_out(call.record.attempts, scale)
        if isinstance(error, GuardClosed) or lease.aborted:
            error = error if isinstance(error, GuardClosed) else self._closed_error(call)
            last = None
        if last is not None and last.status_code is not None:
            status: CallStatus = "rejected" if error is not None else "http_error"
            cause = error.cause if error is not None else "upstream_status"
            if last.as_sent is not None and last.stream_failure is not None and error is None:
                status, cause = "error", last.stream_failure.cause  # the 200 the caller reads the error event of
            call.record.answered(last.as_sent[0] if last.as_sent else last.status_code, last.attempt.replica)
            _hand_on(lease, last)
            await lease.aclose(status, cause)
            # The guard retried, or stopped retrying (attempts, budget, deadline): the SDK must not retry on top. An
            # answer the guard does not retry at all (a 400, a 409 or a 52x, any status off the generation paths) is
            # the SDK's to retry or not, as without a guard, and the caller's: it carries no cause of the guard's;
            # unless it came with no round left after retries of the guard's own (`spent_out`): then it is final.
            decided = error is not None or (self._retries and outcome.stopped != "not_retryable") or spent_out
            if not decided and not sent_once(call.streamed):
                self._handed_to_sdk(call, spent, retried)
            return upstream_response(
                last, cause if decided else None, call, call.record.snapshot(), no_retry=decided, as_sent=True
            )
        met = False  # the error is what the attempts met, not a refusal of the guard's
        if last is not None and (error is None or isinstance(error, GuardUnavailable)):
            await self._raise_unless_network_failure(call, last)
            error, met = attempts_error(call, outcome.failures, error), True
        assert error is not None
        timeout = isinstance(error, GuardTimeout)
        status = (
            "timeout"
            if timeout
            else ("rejected" if error.status_code in (429, 503) and not isinstance(error, GuardClosed) else "error")
        )
        if met and last is not None and last.failed_reading:
            # An error met reading a stream after its headers (a cut, a reset, the SDK's read timeout), and no retry of
            # it goes (none of the guard's left, or none the plain SDK would send past an empty budget): without a
            # guard the SDK had returned the stream by then, and the error met its caller reading it, unretried: so it
            # does here, in cooperative mode too. (A whole body is read inside the SDK's request: an error there is
            # the SDK's to retry, headers or not.)
            assert last.as_sent is not None
            call.record.answered(last.as_sent[0], last.attempt.replica)
            await lease.aclose(status, error.cause)
            return met_reading(last, call, call.record.snapshot())
        # What the attempts met, and a deadline, are raised in every mode: the SDK's connection or timeout error.
        respond = call.respond_with_errors and not (timeout or met)
        if respond:  # the caller gets the guard's own answer: the record says so
            call.record.answered(error.status_code)
        await lease.aclose(status, error.cause)
        if respond:
            return failure_response(error, call.request, call.record.snapshot())
        # A failure the guard does not retry at all (off the generation paths, anything but a refused connection;
        # the SDK's own read timeout) is the SDK's to retry or not, as without a guard: its max_retries decides (0:
        # this one request; else the next goes as a call of its own, with the rounds this call has left: the SDK's
        # max_retries adds no request to the guard's max_attempts), unless no round is left after retries of the
        # guard's own (`spent_out`): then it is final. So is a body sent once as it came (an iterator's): its one
        # attempt was the caller's one request. A multipart upload the guard read again for each attempt is as a
        # body in memory: its attempts were the guard's retries (`Call.known_by` is how its SDK retry is known).
        sdk_decides = met and outcome.stopped == "not_retryable" and not spent_out
        if sent_once(call.streamed):
            pass
        elif not sdk_decides and (
            (self._retries and call.record.attempts) or isinstance(error, (TTFTTimeout, TotalTimeout))
        ):
            error.final = True  # its attempts or deadline spent
            self._given_up.remember(call.request, call.known_by, error, call.clock())
        elif sdk_decides:
            self._handed_to_sdk(call, spent, retried)
        elif len(self._given_up):  # the SDK may retry this one: not with another call's error of the same body
            self._given_up.forget(call.request, call.known_by)
        raise error

    def _handed_to_sdk(self, call: Call, spent: int, retried: bool) -> None:
        """The call's failure is the SDK's to retry, as without a guard (an answer or error the guard does not
        retry): its retry gets only the rounds the call has left (`HandedBack`; ``spent``: the rounds of its earlier
        requests; ``retried``: the guard retried or hedged one of the call's requests), and never the error an
        earlier call of the same body left."""
        if self._retries:
            rounds = spent + sum(a.kind != "continuation" for a in call.record.attempts)
            self._given_up.remember(call.request, call.known_by, HandedBack(rounds, retried), call.clock())
        elif len(self._given_up):
            self._given_up.forget(call.request, call.known_by)

    @staticmethod
    async def _raise_unless_network_failure(call: Call, last: AttemptFailure) -> None:
        """An error that is neither httpx's nor the network's (a request body that could not be read, an OSError
        of the caller's own transport, a bug) is never disguised: the caller gets it as it was raised, as without
        a guard. (A network error httpx lets through, such as a TLS record error, is given up on as the rest.)"""
        assert last.error is not None
        if not (isinstance(last.error, httpx.HTTPError) or last.is_transport_error):
            await call.lease.aclose("error", last.attempt.error)
            raise last.error

    async def _hand_back(self, call: Call, outcome: Failed, before: Episode | None) -> httpx.Response:
        """Cooperative mode: the guard allows a retry and the SDK sends it (`llmguard_client._core.cooperative`):
        the failure itself, a server's answer marked ``x-should-retry: true``, or the error raised."""
        last, lease = outcome.last, call.lease
        assert last is not None
        episode = next_episode(call, outcome, before)
        if last.status_code is not None:
            call.record.answered(last.status_code, last.attempt.replica)
            _hand_on(lease, last)
            await lease.aclose("http_error", "upstream_status")
            record = call.record.snapshot()
            response = upstream_response(last, "upstream_status", call, record, no_retry=False)
            allow_retry(response, outcome.retry_in)
            kept = [(k, v) for k, v in response.headers.raw if k.lower() not in _RETRY_HEADERS]
            answer = (response.status_code, kept, last.body if last.unread is None else None)  # None: not kept
            self._given_up.remember(
                call.request, call.known_by, replace(episode, answer=answer, record=record), call.clock()
            )
            return response
        await self._raise_unless_network_failure(call, last)
        error = attempts_error(call, outcome.failures, None)
        await lease.aclose("timeout" if isinstance(error, GuardTimeout) else "error", error.cause)
        self._given_up.remember(call.request, call.known_by, replace(episode, error=error), call.clock())
        raise error

    async def _decline(self, call: Call, episode: Episode) -> httpx.Response:
        """Cooperative mode: the SDK's retry may not be sent after all (the budget emptied since the guard
        allowed it): the last failure again, final, with nothing sent."""
        await call.lease.aclose("rejected", "budget_exhausted")
        if episode.error is not None:
            error = again_error(episode.error, call.request, 1)
            error.cause, error.final = "budget_exhausted", True
            self._given_up.remember(call.request, call.known_by, episode.error, call.clock())
            raise error
        assert episode.answer is not None
        status, raw, body = episode.answer
        if body is None:  # longer than the guard keeps: said so, never repeated cut
            raw = [(k, v) for k, v in raw if k.lower() != b"content-type"] + [(b"content-type", b"application/json")]
            body = untold_answer(status)
        response = httpx.Response(status, headers=raw, content=body, request=call.request)
        response.extensions = {"llmguard": episode.record}
        response.headers["x-should-retry"] = "false"
        response.headers[CAUSE_HEADER] = "budget_exhausted"
        return response

    # --- per-call choices -----------------------------------------------------------------

    def _resolve_tier(self, headers: CallerHeaders, request: httpx.Request) -> str:
        name: str | None = headers.tier or self._tier_var.get() or self._default_tier
        assert name is not None
        name = name.strip()
        if name not in self._tiers:
            raise UnknownTierError(
                f"unknown tier {name!r} (from the {TIER_HEADER} header or guard.tier()); "
                f"configured tiers: {', '.join(sorted(self._tiers))}",
                request=request,
            )
        return name

    def _respond_with_errors(self, headers: CallerHeaders) -> bool:
        if self._failure_mode == "auto":
            return headers.from_typed_sdk
        return self._failure_mode == "response"

    async def aclose(self) -> None:
        """Nothing to do: the `Guard` owns the connection pools (``await guard.aclose()``)."""


def _hand_on(lease: CallLease, last: AttemptFailure) -> None:
    """The last answer goes to the caller: the rest of its error body, if it is longer than the guard keeps, is
    read on from the server by the caller (`upstream_response`), so the call's end must not close it."""
    if last.unread is not None:
        lease.disown(last.unread.response)


def _stream_outcome(status: CallStatus, cause: str | None, win: Win) -> tuple[bool | None, int | None, float | None]:
    """``(ok, tokens, duration)`` for `Router.stream_finished` from how a delivered body ended: ok for a
    complete answer, False for a failure after the first token (transport error, stall, total, an in-stream
    error or a truncation), None when the caller closed it early or cancelled its read, or the Guard closed under
    it (nothing to blame the replica for). Timing only for event streams: the tokens after the first token over the
    seconds the body waited on the replica for them (`Win.waited`), not the seconds since the first token, which
    hold the caller's own pauses between reads (the body reads the replica only when the caller asks)."""
    reader = win.reader
    ok: bool | None
    if cause == GuardClosed.cause:  # aborted by Guard.aclose(): the guard's own doing, not the replica's
        ok = None
    elif status == "ok":
        ok = reader.failure is None
    elif status in ("abandoned", "cancelled"):
        ok = True if reader.complete and reader.failure is None else None
    else:
        ok = False
    first_token = win.attempt.first_token
    if reader.chunks is None or first_token is None:
        return ok, None, None
    tokens = reader.facts.completion_tokens if reader.facts.completion_tokens is not None else reader.chunks
    return ok, tokens, win.waited


SYNC_CLIENT_MESSAGE = (
    "guard.transport is an async httpx transport, but a sync client (httpx.Client) was given it; for sync code "
    "use guard.sync_http_client() (an httpx.Client through the guard), or guard.http_client_for(openai.OpenAI) "
    "for whichever client the installed SDK takes"
)
"""Why a sync `httpx.Client` cannot use `guard.transport`, and what to use instead."""


def wrong_client_message(request: object) -> str:
    """Why `guard.transport` (an httpx transport) cannot serve ``request``, and what to use instead."""
    kind = type(request).__module__.split(".")[0]
    return (
        f"guard.transport is an httpx transport, but it was given a {kind} request ({type(request).__name__}); "
        "for httpx2 clients (openai >= 3, anthropic >= 1) use guard.httpx2_client() (async) or "
        "guard.sync_httpx2_client() (sync), or guard.http_client_for(SDKClass)"
    )
