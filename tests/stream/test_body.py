"""How a delivered body's end is recorded when its caller stops reading it: a read cancelled, or the body closed
early (virtual time, both backends, both cohorts)."""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import anyio
import pytest

from llmguard_client import PhaseRecord, Tier
from tests.virtual import BACKENDS, FakeReplica, Plan, run_virtual, virtual_guard

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
