"""GuardTransport: the one integration point, an httpx transport that runs the layers.

For each request::

    rollout   -> cohort guarded | control (control: one plain attempt, still measured)
    bulkhead  -> per-tier slot, bounded waiting, fast failure          (phase: queued)
    deadline  -> one cancel scope bounded by the tier's ttft until the first token;
                 after it, the body is watched for stall and total  (layers.deadline)
    retry     -> rounds under the shared budget and Retry-After      (layers.retry)
    hedge     -> staggered attempts on different replicas             (layers.hedge)
    attempt   -> one physical request to one replica                  (layers.attempt)

Failures are mapped to the caller in one place, `_give_up`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from contextvars import ContextVar

import anyio
import httpx

from llmguard_client._call import TIER_HEADER, Call, RequestFacts
from llmguard_client._config import FailureMode, HedgePolicy, RetryPolicy, Tier
from llmguard_client._errors import (
    AllAttemptsFailed,
    BulkheadFull,
    GuardFailure,
    TTFTTimeout,
    UnknownTierError,
)
from llmguard_client._failure import describe_attempts, failure_response, upstream_response
from llmguard_client._replicas import ReplicaSet
from llmguard_client._sse import stream_outcome
from llmguard_client._ttft_stats import TTFTStats
from llmguard_client.layers.attempt import AttemptWin
from llmguard_client.layers.budget import RetryBudget
from llmguard_client.layers.bulkhead import TierBulkhead
from llmguard_client.layers.deadline import WatchedStream
from llmguard_client.layers.hedge import Hedger
from llmguard_client.layers.retry import GiveUp, Retrier
from llmguard_client.layers.rollout import Rollout
from llmguard_client.telemetry.hooks import Instrumentation
from llmguard_client.telemetry.record import CallStatus, PhaseRecord

logger = logging.getLogger("llmguard_client")

RecordCallback = Callable[[PhaseRecord], None]
_GENERATION_PATHS = HedgePolicy()
"""Which paths are idempotent-safe generation calls, when hedging is off."""


class GuardTransport(httpx.AsyncBaseTransport):
    """An `httpx.AsyncBaseTransport` that routes each request to the guard's replicas.

    Build it through `Guard`; its ``aclose`` does nothing, because the pools belong to
    the `Guard` (several clients may share one transport): close the `Guard`.
    """

    def __init__(
        self,
        *,
        replicas: ReplicaSet,
        tiers: Mapping[str, Tier],
        default_tier: str,
        tier_var: ContextVar[str | None],
        hedge: HedgePolicy | None,
        retry: RetryPolicy | None,
        budgets: Mapping[str, RetryBudget | None],
        bulkheads: Mapping[str, TierBulkhead],
        rollout: Rollout,
        failure_mode: FailureMode,
        instrumentation: Instrumentation,
        on_record: RecordCallback | None,
        clock: Callable[[], float] = time.monotonic,
        ttft_stats: TTFTStats | None = None,
    ) -> None:
        self._replicas = replicas
        self._tiers = dict(tiers)
        self._default_tier = default_tier
        self._tier_var = tier_var
        self._hedge = hedge
        self._retry = retry
        self._budgets = dict(budgets)
        self._bulkheads = dict(bulkheads)
        self._rollout = rollout
        self._failure_mode = failure_mode
        self._instrumentation = instrumentation
        self._on_record = on_record
        self._clock = clock
        self._bases = tuple(s.base for s in replicas.states)
        self.hedger = Hedger(replicas, hedge, clock, ttft_stats)
        self._retrier = Retrier(self.hedger, replicas, retry, instrumentation, clock)
        self.closed = False

    # --- the request path -----------------------------------------------------------------

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.closed:
            raise RuntimeError("this Guard is closed; build a new Guard to send more requests")
        call = await self._start_call(request)
        bulkhead = self._bulkheads.get(call.tier_name) if call.guarded else None
        admitted: bool | None = True
        if bulkhead is not None:
            admitted = None  # the time spent waiting in line counts against the call's ttft
            try:
                with anyio.move_on_after(call.first_token_deadline - self._clock()):
                    admitted = await bulkhead.acquire()
            except anyio.get_cancelled_exc_class():
                self._finish(call, "cancelled", "cancelled_by_caller")
                raise
        if admitted is None:
            return self._give_up(call, self._ttft_timeout(call, "while waiting for a bulkhead slot"), None, "timeout")
        if not admitted:
            assert bulkhead is not None
            self._instrumentation.bulkhead_rejected(call.tier_name)
            error = BulkheadFull(
                f"tier {call.tier_name!r} already has {bulkhead.config.max_in_flight} call(s) in flight and "
                f"{bulkhead.config.max_waiting} waiting (its Bulkhead limits); the call was refused at once",
                request=request,
                record=call.record,
            )
            return self._give_up(call, error, None, "rejected")
        call.record.queued = self._clock()
        released = False

        def release() -> None:
            nonlocal released
            if bulkhead is not None and not released:
                released = True
                bulkhead.release()

        try:
            return await self._run(call, release)
        except BaseException:
            release()
            raise

    async def _start_call(self, request: httpx.Request) -> Call:
        now = self._clock()
        tier_name = self._resolve_tier(request)
        tier = self._tiers[tier_name]
        cohort = self._rollout.cohort(request)
        body = await request.aread()
        facts = RequestFacts.parse(request, body)
        path = request.url.path
        record = PhaseRecord(
            request_id=uuid.uuid4().hex,
            tier=tier_name,
            cohort="guarded" if cohort == "guarded" else "control",
            method=request.method,
            path=path,
            start=now,
            start_unix=time.time(),
            model=facts.model,
            stream=facts.stream,
            max_tokens=facts.max_tokens,
        )
        generation = (self._hedge or _GENERATION_PATHS).applies_to(path)
        call = Call(
            request=request,
            body=body,
            headers=Call.forwarded_headers(request),
            tier_name=tier_name,
            tier=tier,
            guarded=cohort == "guarded",
            respond_with_errors=self._respond_with_errors(request),
            record=record,
            observation=self._instrumentation.call_started(record),
            first_token_deadline=now + tier.ttft,
            total_deadline=now + tier.total,
            hedgeable=generation,
            retry_any_status=generation or request.method in ("GET", "HEAD", "OPTIONS"),
            replica_bases=self._bases,
            budget=self._budgets.get(tier_name),
        )
        if call.guarded and call.budget is not None:
            call.budget.record_request()
        return call

    async def _run(self, call: Call, release: Callable[[], None]) -> httpx.Response:
        outcome: AttemptWin | GiveUp | None = None
        try:
            if call.guarded:
                with anyio.move_on_after(call.first_token_deadline - self._clock()):
                    outcome = await self._first_round(call)
            else:
                outcome = await self._first_round(call)
        except anyio.get_cancelled_exc_class():
            self._finish(call, "cancelled", "cancelled_by_caller")
            release()
            raise
        except GuardFailure as refused:
            release()
            return self._give_up(call, refused, None, "rejected")
        if outcome is None:
            release()
            return self._give_up(call, self._ttft_timeout(call, "in-flight attempts were closed"), None, "timeout")
        if isinstance(outcome, GiveUp):
            release()
            return self._give_up(call, outcome.reason, outcome, None)
        return self._deliver(call, outcome, release)

    async def _first_round(self, call: Call) -> AttemptWin | GiveUp:
        state = self._replicas.pick(self._clock())
        if state is None:
            raise AllAttemptsFailed(
                f"every replica's circuit is open (each kept failing); tier {call.tier_name!r} call refused "
                "at once; they are probed again when their cool-down ends",
                request=call.request,
                record=call.record,
            )
        return await self._retrier.run(call, state)

    def _deliver(self, call: Call, win: AttemptWin, release: Callable[[], None]) -> httpx.Response:
        record, attempt = call.record, win.attempt
        attempt.outcome = "won"
        record.replica = attempt.replica
        record.sent, record.headers, record.first_token = attempt.sent, attempt.headers, attempt.first_token
        record.http_status = win.response.status_code
        if attempt.ttft is not None and call.guarded:
            self.hedger.ttft_stats.observe(win.state.name, call.tier_name, record.stream, attempt.ttft)

        def finalize(status: CallStatus, cause: str | None) -> None:
            now = self._clock()
            attempt.finish = attempt.finish if attempt.finish is not None and win.rest is None else now
            facts = win.facts
            record.prompt_tokens, record.completion_tokens = facts.prompt_tokens, facts.completion_tokens
            record.response_id, record.response_model = facts.response_id, facts.model
            record.finish_reasons = list(facts.finish_reasons)
            record.chunks = win.scanner.chunks if win.scanner is not None else None
            win.state.in_flight -= 1
            ok, tokens, duration = stream_outcome(status, win.scanner, facts, attempt.first_token, now)
            self._replicas.stream_finished(win.state, now, ok=ok, tokens=tokens, duration=duration)
            release()
            call.observation.attempt_finished(attempt)
            self._finish(call, status, cause, finish=attempt.finish)

        stream = WatchedStream(call, win, finalize, self._clock, enforce=call.guarded)
        return httpx.Response(
            win.response.status_code,
            headers=win.response.headers,
            stream=stream,
            request=call.request,
            extensions={**win.response.extensions, "llmguard": record},
        )

    # --- failures -------------------------------------------------------------------------

    def _ttft_timeout(self, call: Call, detail: str) -> TTFTTimeout:
        elapsed = self._clock() - call.record.start
        return TTFTTimeout(
            f"no first content token within the ttft deadline of tier {call.tier_name!r} ({call.tier.ttft}s; "
            f"{elapsed:.3f}s elapsed); {describe_attempts(call.record)}; {detail}",
            request=call.request,
            record=call.record,
        )

    def _give_up(
        self, call: Call, error: GuardFailure | None, give_up: GiveUp | None, status: CallStatus | None
    ) -> httpx.Response:
        """End a call without a winner: the last server answer if there is one, else the guard's error."""
        last = give_up.last if give_up is not None else None
        if last is not None and last.status_code is not None:
            cause = error.cause if error is not None else "upstream_status"
            call.record.http_status = last.status_code
            call.record.replica = last.attempt.replica
            self._finish(call, "rejected" if error is not None else "http_error", cause)
            if not call.guarded:  # the control cohort gets the server's answer untouched
                return upstream_response(last, None, call.request, call.record, no_retry=False)
            no_retry = self._retry is not None or error is not None
            return upstream_response(last, cause, call.request, call.record, no_retry=no_retry)
        if error is None:
            assert last is not None and last.error is not None
            if not call.guarded or not isinstance(last.error, (httpx.HTTPError, OSError)):
                # Control calls fail as plain httpx would; an unexpected error is never disguised.
                self._finish(call, "error", last.attempt.error)
                raise last.error
            error = AllAttemptsFailed(
                f"every attempt failed before a response (tier {call.tier_name!r}, "
                f"{self._clock() - call.record.start:.3f}s elapsed); {describe_attempts(call.record)}",
                request=call.request,
                record=call.record,
            )
            error.__cause__ = last.error
        self._finish(call, status or ("rejected" if error.status_code in (429, 503) else "error"), error.cause)
        if call.respond_with_errors:
            call.record.http_status = error.status_code
            return failure_response(error, call.request, call.record)
        raise error

    def _finish(self, call: Call, status: CallStatus, cause: str | None, finish: float | None = None) -> None:
        record = call.record
        record.status, record.cause = status, cause
        record.finish = finish if finish is not None else self._clock()
        call.observation.call_finished(record)
        if self._on_record is not None:
            try:
                self._on_record(record)
            except Exception:
                logger.exception("llmguard on_record callback raised; the call itself is unaffected")

    # --- per-call choices -----------------------------------------------------------------

    def _resolve_tier(self, request: httpx.Request) -> str:
        name: str | None = request.headers.get(TIER_HEADER) or self._tier_var.get() or self._default_tier
        assert name is not None
        name = name.strip()
        if name not in self._tiers:
            raise UnknownTierError(
                f"unknown tier {name!r} (from the {TIER_HEADER} header or guard.tier()); "
                f"configured tiers: {', '.join(sorted(self._tiers))}"
            )
        return name

    def _respond_with_errors(self, request: httpx.Request) -> bool:
        if self._failure_mode == "auto":
            return any(key.lower().startswith(b"x-stainless-") for key, _ in request.headers.raw)
        return self._failure_mode == "response"

    async def aclose(self) -> None:
        """Nothing to do: the `Guard` owns the connection pools (``await guard.aclose()``)."""
