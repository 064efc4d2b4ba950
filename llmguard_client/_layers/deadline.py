"""Deadlines: the one owner of a call's ttft, stall and total limits.

Before the first token, `DeadlineLayer` runs the rest of the pipeline (retries, hedges,
attempts, backoff) inside one cancel scope that expires at the call's absolute first-token
deadline (start + tier ttft; the bulkhead's wait is bounded by the same instant). If a
winner was published while the scope fired (its token arrived in time, the losers were
still being closed), it is delivered all the same.

After the first token the stall and total limits are kept by the caller's body (`llmguard_client._stream.body`).
"""

from __future__ import annotations

from llmguard_client._core.call import Call
from llmguard_client._core.failure import describe_attempts
from llmguard_client._core.outcome import Failed, Outcome, Route
from llmguard_client._core.pipeline import Next
from llmguard_client.errors import TTFTTimeout


def ttft_timeout(call: Call, detail: str) -> TTFTTimeout:
    """The error of a call whose first token did not arrive within its tier's ttft."""
    elapsed = call.clock() - call.record.start
    return TTFTTimeout(
        f"no first content token within the ttft deadline of tier {call.tier_name!r} ({call.tier.ttft}s; "
        f"{elapsed:.3f}s elapsed); {describe_attempts(call.record)}; {detail}",
        request=call.request,
        record=call.record,
    )


class DeadlineLayer:
    """Bounds everything before the first token by the call's first-token deadline."""

    async def __call__(self, call: Call, route: Route, call_next: Next) -> Outcome:
        outcome: Outcome | None = None
        with call.phase_until(call.first_token_deadline):  # Guard.aclose() ends it too
            outcome = await call_next(call, route)
        if outcome is not None:
            return outcome
        if call.winner is not None:  # the token came in time; the scope fired while losers were closed
            return call.winner
        return Failed(reason=ttft_timeout(call, "in-flight attempts were closed"))
