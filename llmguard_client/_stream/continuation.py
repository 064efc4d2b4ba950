"""Mid-stream failover by continuation (opt-in, `ContinuationPolicy`).

When a guarded chat/completions stream breaks after its first content token, `GuardBody` asks the
call's `CallContinuation` to `resume` it. A continuation is a kind of route: if the policy, the answer
(a single-choice text answer, see `llmguard_client.protocols.splice`) and the time left allow, a
``continuation`` `Route` goes through the pipeline's own deadline, retry and attempt layers
(`Pipeline.continuation`), like any attempt:

- the broken response is closed and its replica's in-flight count released first (`CallLease.end_attempt`);
- the route avoids the broken replica and those tried before, carries the continuation's request body
  (the rest of the answer), its own budget (paid for its first attempt too) and its first-token deadline
  (the first of the tier's ttft from now and the call's total deadline); the retry layer picks the replica,
  pays, checks `fits_deadline`, classifies failures (cool-downs, circuits) and sends a second one to a third
  replica within ``max_continuations``;
- on its first token the continuation's `Win` is handed back to the body, which delivers it; its stream
  reaches the caller through a `Splicer` (one answer: same id and index, no second role delta, one
  ``[DONE]``, usage summed), judged by a fresh reader of the same protocol;
- otherwise (no replica, no budget, no time, the continuation failed) the caller gets the error of the
  original break, as without continuation, and ``record.not_continued`` says why.

The budget is the policy's own `RetryBudget` (``ContinuationPolicy.budget``), not the retry/hedge budget:
a continuation finishes an answer the caller is already reading, sending only its remainder, so it
competes neither with the retries and hedges of calls yet to start nor they with it. It stays bounded
fleet-wide (``ratio`` x continuable calls per window + ``floor``) and per call (``max_continuations``),
and it is only ever sent after a replica produced a first token: no retry storm.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from llmguard_client._budget.budget import RetryBudget
from llmguard_client._core.clock import Clock, loop_clock
from llmguard_client._core.outcome import Failed, Outcome, Route, Win, close_unread
from llmguard_client._routing.replicas import ReplicaSet, ReplicaState
from llmguard_client.config import ContinuationPolicy
from llmguard_client.errors import GuardClosed
from llmguard_client.protocols.chat import ChatReader
from llmguard_client.protocols.completions import CompletionsReader
from llmguard_client.protocols.splice import Kind, Splicer, continuable_request, continuation_body
from llmguard_client.telemetry.record import NotContinued

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from llmguard_client._core.call import Call

    Path = Callable[[Call, Route], Awaitable[Outcome]]
    """The pipeline's layers a continuation route goes through (`Pipeline.continuation`)."""


class Classify(Protocol):
    """The retry layer's failure classification, for a stream that broke after its first token."""

    def broke(self, state: ReplicaState, now: float, *, injected: bool = False) -> None: ...


class SplicedRest:
    """The continuation's unread body, rewritten by its `Splicer` (an async iterator of bytes)."""

    __slots__ = ("_done", "_inner", "_splicer")

    def __init__(self, inner: AsyncIterator[bytes] | None, splicer: Splicer) -> None:
        self._inner = inner
        self._splicer = splicer
        self._done = inner is None

    def __aiter__(self) -> SplicedRest:
        return self

    async def __anext__(self) -> bytes:
        while not self._done:
            assert self._inner is not None
            try:
                chunk = await self._inner.__anext__()
            except StopAsyncIteration:
                self._done = True
                tail = self._splicer.flush()
                if tail:
                    return tail
                break
            out = self._splicer.rewrite(chunk)
            if out:
                return out
        raise StopAsyncIteration


@dataclass(slots=True, eq=False)
class Resumed:
    """What the caller's body reads next: rewritten bytes already read, the rest, its reader, and the
    continuation's `Win` (whose stream the caller now reads)."""

    chunks: list[bytes]
    rest: AsyncIterator[bytes]
    reader: ChatReader
    win: Win


class Continuer:
    """The Guard's continuation machinery: replicas, the path a continuation route takes through the
    pipeline (its deadline, retry and attempt layers), the retry layer's failure classification, the per-tier
    policies and the continuations' budgets (one per policy object: tiers given the same policy share it)."""

    def __init__(
        self,
        replicas: ReplicaSet,
        path: Path,
        classify: Classify,
        policies: dict[str, ContinuationPolicy | None],
        clock: Clock = loop_clock,
    ) -> None:
        self._replicas = replicas
        self._path = path
        self._classify = classify
        self._policies = policies
        by_policy: dict[int, RetryBudget] = {}
        for policy in policies.values():
            if policy is not None and id(policy) not in by_policy:
                b = policy.budget
                by_policy[id(policy)] = RetryBudget(b.ratio, b.floor, b.window, clock=clock)
        self.budgets: dict[str, RetryBudget] = {
            tier: by_policy[id(policy)] for tier, policy in policies.items() if policy is not None
        }
        """Each tier's continuation budget (``snapshot()`` reads it)."""

    def for_call(self, tier: str, method: str, path: str, body: bytes) -> CallContinuation | None:
        """The call's continuation state, or None when its tier has none or its request cannot be continued.
        A call that could be continued counts toward its tier's continuation budget."""
        policy = self._policies.get(tier)
        if policy is None:
            return None
        request = continuable_request(method, path, body)
        if request is None:
            return None
        budget = self.budgets[tier]
        budget.record_request()
        replicas = self._replicas
        return CallContinuation(replicas, self._path, self._classify, policy, budget, *request, pools=replicas.renewals)


@dataclass(slots=True, eq=False)
class CallContinuation:
    """One call's continuations: the text delivered by finished parts, the replicas tried."""

    replicas: ReplicaSet
    path: Path
    classify: Classify
    policy: ContinuationPolicy
    budget: RetryBudget
    kind: Kind
    request: dict[str, Any]
    text: str = ""
    """Text delivered by the parts before the current one."""
    tokens: int = 0
    count: int = 0
    splicer: Splicer | None = None
    """The current part's splicer (None while the original stream is the current part)."""
    tried: list[ReplicaState] = field(default_factory=list)
    pools: int = 0
    """The replicas' pools the call started with (`ReplicaSet.renewals`): once the Guard has moved to another
    event loop, this call's loop may not send through the new ones."""

    def _part(self, reader: object) -> tuple[str, int, bool] | None:
        """(text, tokens, still a plain text answer) of the current part, or None if it kept no text."""
        if self.splicer is not None:
            s = self.splicer
            return "".join(s.text), s.text_events, s.text_only
        if not isinstance(reader, ChatReader):
            return None
        text = reader.text
        if text is None:
            return None
        tokens = reader.facts.completion_tokens or reader.text_events  # continuous usage stats, when sent
        return text, tokens, reader.text_only

    async def resume(self, call: Call, win: Win, reader: object, cause: str) -> Resumed | None:
        """Continue the answer ``win`` was streaming on another replica; None (nothing changed) when it cannot
        be, with the reason in ``call.record.not_continued``."""
        resumed = await self._resume(call, win, reader, cause)
        if isinstance(resumed, str):
            call.record.not_continued_because(resumed)
            return None
        call.record.not_continued_because(None)
        return resumed

    async def _resume(self, call: Call, win: Win, reader: object, cause: str) -> Resumed | NotContinued:
        if self.replicas.renewals != self.pools:
            return "guard_moved"
        part = self._part(reader)
        if part is None:
            return "no_text"
        if not part[2]:
            return "not_text"
        if not part[0]:
            return "no_text"
        text, tokens = self.text + part[0], self.tokens + part[1]
        body = continuation_body(self.kind, self.request, text, tokens)
        if body is None:
            return "max_tokens"
        now = call.clock()
        if self.count >= self.policy.max_continuations:
            return "max_continuations"
        if call.total_deadline - now < self.policy.min_time_left:
            return "time_left"
        broken = win.attempt
        # The broken stream is closed first (the server sees the disconnect, its replica's in-flight count
        # is released); the caller has read all it will read from it.
        await call.lease.end_attempt(win.in_flight, win.response)
        route = Route(
            kind="continuation",
            resumes=(len(text), tokens, cause),
            avoid=(win.state, *self.tried, *call.outside),
            body=body,
            budget=self.budget,
            deadline=min(call.total_deadline, now + call.tier.ttft),
            rounds=self.policy.max_continuations - self.count,
        )
        before = len(call.record.attempts)
        try:
            outcome = await self.path(call, route)  # the pipeline's deadline -> retry -> attempt
        except GuardClosed:
            return "guard_closed"
        sent = len(call.record.attempts) - before
        self.count += sent
        if sent:
            broken.attempt_broke(cause)
            self.tried.append(win.state)
        if isinstance(outcome, Failed):
            self.tried.extend(f.state for f in outcome.failures)
            await close_unread(call.lease, outcome.failures)  # the caller gets the broken stream's error
            if sent:
                return "continuation_failed"
            return _NOT_SENT.get(outcome.stopped or "no_replica", "no_replica")
        broken.attempt_finished("failed", outcome.attempt.start)
        call.observation.attempt_finished(broken)
        # The call's end reports only its last winner to the router, so the broken replica is reported now: its
        # stream's pace, and a failure of the weight of one before the first token (it cost one extra request,
        # as a retry does), counted toward its circuit by the retry layer's classification.
        ended = outcome.attempt.start
        lasted = None if broken.first_token is None else win.waited  # its pace, as `Win.waited` says
        self.replicas.stream_finished(win.state, ended, ok=None, tokens=tokens - self.tokens, duration=lasted)
        self.classify.broke(win.state, ended, injected=bool(broken.chaos))
        prompt_tokens = win.facts.prompt_tokens if self.splicer is None else None
        splicer = Splicer(self.kind, win.facts.response_id, tokens, prompt_tokens)
        self.text, self.tokens, self.splicer = text, tokens, splicer
        fresh: ChatReader = ChatReader() if self.kind == "chat" else CompletionsReader()
        fresh.first_token = True
        fresh.facts.response_id = win.facts.response_id
        fresh.facts.prompt_tokens = win.facts.prompt_tokens
        chunks = [out for out in (splicer.rewrite(c) for c in outcome.chunks) if out]
        for chunk in chunks:
            fresh.feed(chunk)
        rest = SplicedRest(outcome.rest, splicer)
        outcome.attempt.attempt_outcome("won")
        call.record.continued_on(outcome.attempt)
        resumed = Win(outcome.attempt, outcome.state, outcome.response, [], rest, fresh, outcome.in_flight)
        return Resumed(chunks, rest, fresh, resumed)


_NOT_SENT: dict[str, NotContinued] = {"no_replica": "no_replica", "budget": "budget", "deadline": "time_left"}
"""Why no continuation was sent, from why the retry layer sent no attempt (`Failed.stopped`)."""
