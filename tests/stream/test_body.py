"""How a delivered body ends: its record when its caller stops reading it (a read cancelled, or the body closed
early, both cohorts), and what is left of it after the end marker, read as without a guard (virtual time, both
backends)."""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import anyio
import httpx
import pytest

from llmguard_client import ContinuationPolicy, PhaseRecord, StallTimeout, Tier, TotalTimeout
from tests.virtual import BACKENDS, FakeReplica, Plan, now, run_virtual, virtual_guard

CHAT = "/v1/chat/completions"
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
A = "http://a.test"
COHORTS = pytest.mark.parametrize("rollout", [1.0, 0.0], ids=["guarded", "control"])


def run(rollout: float, backend: str, read: Any) -> PhaseRecord:
    """One stream of 50 tokens 0.5 s apart, read by ``read(response)`` and closed; its record."""
    records: list[PhaseRecord] = []
    fakes = {A: FakeReplica("a", [Plan(tokens=50, gap=0.5)])}

    async def main() -> None:
        guard = virtual_guard(fakes, records, tiers={"i": Tier(ttft=10.0, total=60.0, stall=5.0)}, rollout=rollout)
        async with guard, guard.http_client() as client:
            async with client.stream("POST", A + CHAT, json=BODY) as response:
                await read(response)
            assert guard.snapshot().idle and fakes[A].open_streams == 0

    run_virtual(main, backend)
    (record,) = records
    assert record.cohort == ("guarded" if rollout else "control")
    return record


@COHORTS
@BACKENDS
def test_a_read_cancelled_mid_stream_is_a_cancellation_by_the_caller(backend: str, rollout: float) -> None:
    """The caller's task (here a scope of its own) cancelled while it reads after the first token: the call is
    ``cancelled``, as one cancelled before its first token is, not a stream closed early."""

    async def read(response: Any) -> None:
        async with aclosing(response.aiter_raw()) as chunks:
            with anyio.move_on_after(2.0) as scope:
                async for _ in chunks:
                    pass
        assert scope.cancelled_caught

    record = run(rollout, backend, read)
    assert (record.status, record.cause) == ("cancelled", "cancelled_by_caller")
    assert record.first_token is not None and record.attempts[-1].outcome in ("won", "cancelled")


@COHORTS
@BACKENDS
def test_a_stream_closed_early_without_a_cancellation_is_abandoned(backend: str, rollout: float) -> None:
    async def read(response: Any) -> None:
        async with aclosing(aiter(response.stream)) as chunks:  # closed at once on trio too
            await anext(chunks)

    record = run(rollout, backend, read)
    assert (record.status, record.cause) == ("abandoned", "closed_by_caller")


def learned_time_per_token(backend: str, plan: Plan, pause: float) -> float:
    """The time per token the router learns from 3 streams answered by ``plan``, each read by a caller that pauses
    ``pause`` seconds after every chunk (forwarding it to a slow websocket, say)."""
    fakes = {A: FakeReplica("a", [plan])}
    learned: list[float | None] = []

    async def main() -> None:
        guard = virtual_guard(fakes, [], tiers={"i": Tier(ttft=10.0, total=120.0, stall=5.0)})
        async with guard, guard.http_client() as client:
            for _ in range(3):
                async with client.stream("POST", A + CHAT, json=BODY) as response:
                    async for _ in response.aiter_raw():
                        await anyio.sleep(pause)
            (state,) = guard._replica_set.router.states
            learned.append(state.health.tpot)

    run_virtual(main, backend)
    (tpot,) = learned
    assert tpot is not None
    return tpot


@BACKENDS
def test_a_callers_pauses_between_reads_are_not_the_replicas_time_per_token(backend: str) -> None:
    """The body reads the replica only when its caller asks: a stream sent at once but read one chunk a second took
    the replica no time per token (it was learned as 1 s per token, and such a replica drained)."""
    assert learned_time_per_token(backend, Plan(tokens=20), pause=1.0) == 0.0


@BACKENDS
def test_a_replica_slow_per_token_is_learned_slow_by_a_caller_reading_at_once(backend: str) -> None:
    assert learned_time_per_token(backend, Plan(tokens=20, gap=0.05), pause=0.0) == pytest.approx(0.05, abs=1e-6)
    # This replica makes each token only when it is read: every read waits its gap, however the caller paces them.
    assert learned_time_per_token(backend, Plan(tokens=20, gap=0.05), pause=1.0) == pytest.approx(0.05, abs=1e-6)


def read_to_the_end(
    plan: Plan, tier: Tier, backend: str, body: dict[str, Any] = BODY, **guard_kwargs: Any
) -> tuple[str, float, PhaseRecord]:
    """One stream read to its end through a Guard with one tier: the text, the virtual seconds it took, its record."""
    records: list[PhaseRecord] = []
    fakes = {A: FakeReplica("a", [plan]), "http://b.test": FakeReplica("b")}
    out: list[Any] = []

    async def main() -> None:
        guard = virtual_guard(fakes, records, tiers={"i": tier}, hedge=None, **guard_kwargs)
        async with guard, guard.http_client() as client:
            start = now()
            async with client.stream("POST", A + CHAT, json=body) as response:
                out.append((await response.aread()).decode())
            out.append(now() - start)
            assert guard.snapshot().idle and fakes[A].open_streams == 0

    run_virtual(main, backend)
    assert fakes["http://b.test"].requests == 0
    (record,) = records
    return out[0], out[1], record


@BACKENDS
@pytest.mark.parametrize(
    "tier", [Tier(ttft=1.0, total=30.0, stall=0.5), Tier(ttft=1.0, total=1.5, stall=None)], ids=["stall", "total"]
)
def test_a_body_held_open_after_its_end_marker_is_read_to_its_end_as_without_a_guard(tier: Tier, backend: str) -> None:
    """The whole answer and ``[DONE]`` came at once; the server (or a proxy) holds the body open 3 s more. Without a
    guard the caller reads to the body's end; the tier's stall and total deadlines, which end an unfinished answer,
    do not turn this complete one into a timeout (before: `StallTimeout` at 0.5 s, `TotalTimeout` at 1.5 s)."""
    text, took, record = read_to_the_end(Plan(open_after_done=3.0), tier, backend)
    assert text.endswith("data: [DONE]\n\n") and took == pytest.approx(3.0, abs=1e-9)
    assert (record.status, record.completion_tokens) == ("ok", 5)


@BACKENDS
def test_a_usage_event_and_done_after_the_finish_reason_are_read_whatever_the_stall(backend: str) -> None:
    """The finish reason ends the answer (the protocol's end marker); ``[DONE]`` comes 2 s later, past the 0.5 s
    stall: it is read, as without a guard."""
    text, took, record = read_to_the_end(Plan(before_done=2.0), Tier(ttft=1.0, total=30.0, stall=0.5), backend)
    assert text.endswith("data: [DONE]\n\n") and took == pytest.approx(2.0, abs=1e-9)
    assert record.status == "ok"


@BACKENDS
def test_a_break_after_the_end_marker_is_not_continued(backend: str) -> None:
    """A whole answer has nothing left to continue: the connection's break after ``[DONE]`` reaches the caller as
    it would without a guard, and no other replica is asked to go on with it."""
    plan = Plan(open_after_done=0.2, reset_after_done=True)
    with pytest.raises(httpx.ReadError):
        read_to_the_end(plan, Tier(ttft=1.0, total=30.0, stall=5.0), backend, continuation=ContinuationPolicy())


TWO_CHOICES = {**BODY, "n": 2}
STALL = Tier(ttft=1.0, total=30.0, stall=0.5)


@BACKENDS
@pytest.mark.parametrize(
    ("plan", "tier", "error"),
    [
        (Plan(second_choice_after=3.0), STALL, StallTimeout),
        (Plan(tokens=3, gap=0.4, second_choice_after=0.4), Tier(ttft=1.0, total=1.5, stall=None), TotalTimeout),
    ],
    ids=["stall", "total"],
)
def test_with_n_2_the_deadlines_watch_a_second_choice_that_begins_after_the_first_finished(
    plan: Plan, tier: Tier, error: type[Exception], backend: str
) -> None:
    """``n=2``: the first choice finishes before the second sends its first chunk (3 s later; or, tokens 0.4 s apart,
    the first's finish at 0.8 s and the second's tokens at 1.2 and 1.6 s). The answer is not complete until both have
    finished, so the tier's stall (0.5 s) and total (1.5 s) deadlines still end it (before: the first choice's finish
    ended the answer, the second not yet seen, and the caller read on without a deadline)."""
    with pytest.raises(error):
        read_to_the_end(plan, tier, backend, TWO_CHOICES)


@BACKENDS
def test_with_n_2_the_answer_is_complete_when_the_second_choice_has_finished(backend: str) -> None:
    """Both choices within the stall, then ``[DONE]`` 2 s after the second's finish: past the end marker, read as
    without a guard."""
    plan = Plan(second_choice_after=0.4, gap=0.4, before_done=2.0)
    text, took, record = read_to_the_end(plan, STALL, backend, TWO_CHOICES)
    assert text.endswith("data: [DONE]\n\n") and took == pytest.approx(0.4 + 8 * 0.4 + 2.0, abs=1e-9)
    assert (record.status, record.finish_reasons) == ("ok", ("stop", "stop"))


@BACKENDS
def test_a_server_that_sends_one_choice_of_the_3_asked_for_ends_with_done(backend: str) -> None:
    text, _, record = read_to_the_end(Plan(), STALL, backend, {**BODY, "n": 3})
    assert text.endswith("data: [DONE]\n\n") and record.status == "ok"


@COHORTS
@BACKENDS
def test_with_n_2_a_body_closed_after_the_first_choice_finished_is_abandoned(backend: str, rollout: float) -> None:
    """The caller stops reading at choice 0's finish reason, choice 1 not begun: its answer was not complete, in
    either cohort (before: recorded ``ok``, as if it stopped at the end marker)."""
    records: list[PhaseRecord] = []
    fakes = {A: FakeReplica("a", [Plan(second_choice_after=0.2)])}

    async def main() -> None:
        guard = virtual_guard(fakes, records, tiers={"i": STALL}, rollout=rollout)
        async with guard, guard.http_client() as client:
            async with client.stream("POST", A + CHAT, json=TWO_CHOICES) as response:
                async with aclosing(aiter(response.stream)) as chunks:  # closed at once on trio too
                    async for chunk in chunks:
                        if b'"finish_reason": "stop"' in chunk:
                            break
            assert guard.snapshot().idle and fakes[A].open_streams == 0

    run_virtual(main, backend)
    (record,) = records
    assert (record.status, record.cause) == ("abandoned", "closed_by_caller")
