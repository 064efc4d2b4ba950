"""Rate-limit admission: every attempt (primary, retry, hedge, continuation) is charged to the provider's limit
before it is sent.

The charge is one request and the attempt's tokens: a prompt estimate (from the request body's bytes, cheap
and content-free: the guard never reads the prompt; at 4 bytes per token until answers report their usage, then
at the ratio they report, with a fixed allowance for each image, audio clip or file in place of its bytes:
`llmguard_client._ratelimit.prompt_estimate`) plus ``max_tokens`` (when the request sets none,
`DEFAULT_OUTPUT_ESTIMATE` on a generation API, none on another: an embedding generates no tokens). When the call
ends, a winner's charge is corrected from the ``usage`` it reported (or, for a stream without usage, from its chunk
count), and an attempt the provider refused (429) is refunded: it used none of the limit.
The provider's rate-limit headers on any answer (`llmguard_client._ratelimit.headers.remaining_room`) lower
the bucket to the room the provider reports (`llmguard_client._ratelimit.buckets`).

An attempt that does not fit waits for its share if that wait, plus the time a first token takes on all but
the slowest tries (`Call.slow_ttft`, the p95), fits before its route's deadline; otherwise the call fails at
once with `RateLimited` carrying the computed retry-after. The p95, not the median that `fits_deadline` reads
for a retry: an attempt let through spends a share of the provider's limit, and one that then misses its
deadline has spent it for nothing, a share that a later call would have completed with. When every process
waits on one fleet-wide bucket, the admitted waits crowd at the longest allowed, so a median margin timed out
about one admitted call in 25 (the ``ratelimited`` bench, docs/benchmarks.md). Until the guard has measured a
TTFT, a wait may take half the time left. A hedge never waits: one that does not fit is not sent, and the round
goes on.
"""

from __future__ import annotations

import math

import anyio

from llmguard_client._core.call import Call
from llmguard_client._core.outcome import Failed, Outcome, Route, Win
from llmguard_client._core.pipeline import Next
from llmguard_client._ratelimit.buckets import RateLimiter
from llmguard_client._ratelimit.headers import remaining_room
from llmguard_client._ratelimit.prompt_estimate import PromptEstimator
from llmguard_client.config import deadline_text
from llmguard_client.errors import RateLimited
from llmguard_client.protocols import protocol_for

DEFAULT_OUTPUT_ESTIMATE = 256
"""Output tokens charged for a generation request that sets no ``max_tokens`` (corrected from its usage
afterwards)."""


def charge_for(call: Call, prompts: PromptEstimator, route: Route | None = None) -> int:
    """Tokens charged for one attempt of ``call`` on ``route``: its prompt estimate plus its ``max_tokens`` (when it
    sets none, `DEFAULT_OUTPUT_ESTIMATE` on a generation API, 0 on another: embeddings, files, models)."""
    max_tokens = call.record.max_tokens
    if max_tokens is not None:
        output = max_tokens
    else:
        generates = protocol_for(call.record.method, call.record.path) is not None
        output = DEFAULT_OUTPUT_ESTIMATE if generates else 0
    return prompt_estimate(call, prompts, route) + output


def prompt_estimate(call: Call, prompts: PromptEstimator, route: Route | None = None) -> int:
    """The prompt's tokens, estimated from the body the attempt sends (a continuation's asks for the rest, with
    the caller's media) and the media parts it holds."""
    body = call.body if route is None or route.body is None else route.body
    return prompts.estimate(len(body), call.media)


def used_tokens(call: Call, win: Win, prompts: PromptEstimator) -> int | None:
    """Tokens the winning answer used, from its ``usage`` (prompt + completion), else its chunk count plus the
    prompt estimate; None when neither is known (the charge then stands)."""
    facts = win.facts
    completion = facts.completion_tokens if facts.completion_tokens is not None else win.reader.chunks
    if completion is None:
        return None
    prompt = facts.prompt_tokens if facts.prompt_tokens is not None else prompt_estimate(call, prompts)
    return prompt + completion


class RateLimitLayer:
    """Admits each attempt into its provider rate limit (if the Guard or the replica has one)."""

    def __init__(self, limiter: RateLimiter | None) -> None:
        self.limiter = limiter
        self.prompts = PromptEstimator()
        """The prompt estimate's tokens per byte, learnt from the usage the answers report."""

    async def __call__(self, call: Call, route: Route, call_next: Next) -> Outcome:
        limiter, state = self.limiter, route.replica
        if limiter is None or state is None or not limiter.applies(state.name):
            return await call_next(call, route)
        replica = state.name
        tokens = charge_for(call, self.prompts, route)
        hedge = route.kind == "hedge"
        deadline = call.first_token_deadline if route.deadline is None else route.deadline
        max_wait = 0.0 if hedge else self._max_wait(call, deadline)
        grant = await limiter.admit(replica, tokens, max_wait)
        if grant.retry_after is not None:
            if hedge:
                return Failed()  # not sent: the round goes on with the attempts it has
            return Failed(reason=self._refused(call, grant.retry_after, tokens))
        if grant.wait > 0.0:
            try:
                await anyio.sleep(grant.wait)  # inside the deadline layer's scope: Guard.aclose() ends it too
            except anyio.get_cancelled_exc_class():
                limiter.refund(replica, tokens)
                raise
        outcome = await call_next(call, route)
        if isinstance(outcome, Win):
            limiter.observe(replica, *remaining_room(outcome.response.headers))
            win = outcome
            own_body = route.body is None  # a continuation's answer reports the caller's prompt, not its body's
            call.lease.hold(lambda: self._correct(call, win, replica, tokens, own_body))
        else:
            heard = [f for f in outcome.failures if not f.torn]  # a torn answer teaches nothing (`AttemptFailure.torn`)
            if any(f.status_code == 429 and f.stream_failure is None for f in heard):
                limiter.refund(replica, tokens)  # refused by the provider: it used none of the limit
            for failure in heard:  # after the refund: the room the provider reports has the last word
                limiter.observe(replica, *remaining_room(failure.headers))
        return outcome

    @staticmethod
    def _max_wait(call: Call, deadline: float) -> float:
        """The longest wait for a share that leaves the p95 TTFT before ``deadline``; while no TTFT is known yet,
        half the time left (a wait to the deadline itself would leave none for the first token); at most the
        caller's pool timeout (`Call.pool_wait`)."""
        left = deadline - call.clock()
        slow = call.slow_ttft()
        return min(call.pool_wait, max(0.0, left - slow if slow > 0.0 else left / 2))

    def _correct(self, call: Call, win: Win, replica: str, charged: float, own_body: bool) -> None:
        prompt_tokens = win.facts.prompt_tokens
        if own_body and prompt_tokens is not None:
            self.prompts.observe(len(call.body), prompt_tokens, call.media)
        used = used_tokens(call, win, self.prompts)
        if used is not None and self.limiter is not None:
            self.limiter.correct(replica, charged, used)

    @staticmethod
    def _refused(call: Call, retry_after: float, tokens: int) -> RateLimited:
        pool = f" or the caller's pool timeout ({call.pool_wait:g}s)" if math.isfinite(call.pool_wait) else ""
        return RateLimited(
            f"the provider's rate limit has no room for this call (1 request, ~{tokens} tokens) within the "
            f"ttft deadline of tier {call.tier_name!r} ({deadline_text(call.tier.ttft)}){pool}: it fits in "
            f"{retry_after:.3f}s; refused before it was sent after {len(call.record.attempts)} attempt(s)",
            request=call.request,
            record=call.record,
            retry_after=retry_after,
        )
