"""Deadlines: the one owner of a call's ttft limits, and of the question "does another attempt fit?".

Before the first token, `DeadlineLayer` runs the rest of the pipeline (retries, hedges, attempts,
backoff) inside one cancel scope that expires at the route's first-token deadline: the call's
(start + tier ttft; the bulkhead's wait is bounded by the same instant), or a continuation's (the
first of its tier's ttft from the break and the call's total deadline). It hands the inner layers a
`Race`: if a hedged round's winner landed while the scope fired (its token arrived in time, the
losers were still being closed), the layer delivers it all the same.

`fits_deadline` is the one test of whether another attempt (a retry, a hedge, a continuation) can
still make its first-token deadline. After the first token the stall and total limits are kept by
the caller's body (`llmguard_client._stream.body`).
"""

from __future__ import annotations

import dataclasses

from llmguard_client._core.call import Call
from llmguard_client._core.failure import describe_attempts
from llmguard_client._core.outcome import Failed, Outcome, Race, Route
from llmguard_client._core.pipeline import Next
from llmguard_client.config import deadline_text
from llmguard_client.errors import TTFTTimeout

FIRST_TOKEN_FLOOR = 0.05
"""The least time an attempt is taken to need for its first token (a request's round trip and the server's first
step), measured or not."""


def first_token_reserve(call: Call) -> float:
    """The time an attempt of ``call`` is expected to need for its first token: the median healthy TTFT
    (`Call.expected_ttft`), and never less than `FIRST_TOKEN_FLOOR` (none is measured yet, or the measured ones
    came from a server on this host).

    The median, not the p95: it is the measured time a fresh attempt typically needs, so an attempt is sent
    while it has an even chance or better; the p95 the hedge delay reads would refuse attempts that usually
    make it (and before samples exist it is the hedge policy's warm-up delay, not a measurement). Never instant:
    an attempt paced to start a moment before the deadline has no chance, and is cancelled at once (the caller
    would get a ttft timeout for the attempts' own failure). A floor, not a share of the tier's ttft: an attempt
    the plain SDK would send with a realistic time left is still sent, on a 60 s tier as on a 2 s one."""
    return max(call.expected_ttft(), FIRST_TOKEN_FLOOR)


def fits_deadline(call: Call, now: float, wait: float = 0.0, deadline: float | None = None) -> bool:
    """Whether an attempt sent ``wait`` seconds after ``now`` can get its first token before ``deadline``
    (default: the call's first-token deadline), expecting it to take `first_token_reserve`. An attempt that
    does not make it is cancelled at the deadline anyway."""
    end = call.first_token_deadline if deadline is None else deadline
    return now + wait + first_token_reserve(call) < end


WHOLE_ANSWER_HINT = (
    "the call asked for no stream, so its first token is its whole answer: stream it, or send it in a tier whose "
    "ttft covers the whole answer"
)


def ttft_timeout(call: Call, detail: str) -> TTFTTimeout:
    """The error of a call whose first token did not arrive within its tier's ttft (for a call that asked for
    no stream, the ttft bounds its whole answer, which the message says)."""
    elapsed = call.clock() - call.record.start
    if not call.record.stream:
        detail += f"; {WHOLE_ANSWER_HINT}"
    return TTFTTimeout(
        f"no first content token within the ttft deadline of tier {call.tier_name!r} ({deadline_text(call.tier.ttft)}; "
        f"{elapsed:.3f}s elapsed); {describe_attempts(call.record)}; {detail}",
        request=call.request,
        record=call.record,
    )


class DeadlineLayer:
    """Bounds everything before the (route's) first token by its first-token deadline."""

    async def __call__(self, call: Call, route: Route, call_next: Next) -> Outcome:
        race = Race()
        deadline = call.first_token_deadline if route.deadline is None else route.deadline
        route = dataclasses.replace(route, deadline=deadline, race=race)
        outcome: Outcome | None = None
        with call.phase_until(deadline):  # Guard.aclose() ends it too
            outcome = await call_next(call, route)
        if outcome is not None:
            return outcome
        if race.winner is not None:  # the token came in time; the scope fired while losers were closed
            return race.winner
        return Failed(reason=ttft_timeout(call, "in-flight attempts were closed"))
