"""Hedged rounds: exact instants in virtual time on both backends, and real loopback servers: first content
token wins, losers are closed."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import looptime
import pytest
import trio
import trio.lowlevel
import trio.testing

from llmguard_client import AllAttemptsFailed, BudgetPolicy, Guard, GuardClosed, HedgePolicy, PhaseRecord, Tier
from llmguard_client._routing.ttft_stats import TTFTStats
from tests.loopback import LoopbackServer, Script
from tests.virtual import BACKENDS, ConnectsInANursery, FakeReplica, Plan, now, run_virtual, virtual_guard

CHAT = "/v1/chat/completions"
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}


def make_guard(servers: list[LoopbackServer], records: list[PhaseRecord], **kwargs: Any) -> Guard:
    kwargs.setdefault("tiers", {"t": Tier(ttft=3.0, total=10.0, stall=2.0)})
    kwargs.setdefault("hedge", HedgePolicy(delay=0.2))
    return Guard(replicas=[s.url for s in servers], instrumentation=None, on_record=records.append, **kwargs)


def guard_for(fakes: dict[str, FakeReplica], records: list[PhaseRecord], **kwargs: Any) -> Guard:
    kwargs.setdefault("tiers", {"interactive": Tier(ttft=1.0, total=5.0, stall=0.5)})
    return virtual_guard(fakes, records, **kwargs)


@BACKENDS
def test_a_hedge_fires_at_exactly_its_delay(backend: str) -> None:
    fakes = {"http://a.test": FakeReplica("a", [Plan(first_token_after=5)]), "http://b.test": FakeReplica("b")}
    records: list[PhaseRecord] = []

    async def main() -> None:
        hedge = HedgePolicy(delay=0.2)
        async with guard_for(fakes, records, hedge=hedge) as guard, guard.http_client() as client:
            response = await client.post("http://a.test" + CHAT, json=BODY)
            assert response.status_code == 200 and b"b0" in response.content
            assert guard.snapshot().idle

    run_virtual(main, backend)
    primary, hedge_attempt = records[0].attempts
    assert hedge_attempt.start - primary.start == pytest.approx(0.2, abs=1e-9)
    assert (primary.outcome, hedge_attempt.outcome) == ("lost", "won")
    assert fakes["http://a.test"].open_streams == 0


@BACKENDS
@pytest.mark.parametrize("opted_in", [False, True], ids=["default", "non_streaming"])
def test_a_call_that_asks_for_no_stream_is_hedged_only_when_opted_in(backend: str, opted_in: bool) -> None:
    """Its answer comes whole: a hedge would race a whole generation, so by default it gets none."""
    slow = Plan(headers_after=3.0, stream=False)  # the whole answer after 3 s
    fakes = {"http://a.test": FakeReplica("a", [slow]), "http://b.test": FakeReplica("b", [slow])}
    records: list[PhaseRecord] = []

    async def main() -> None:
        hedge = HedgePolicy(delay=0.2, non_streaming=opted_in)
        tiers = {"interactive": Tier(ttft=10.0, total=20.0)}
        async with guard_for(fakes, records, hedge=hedge, tiers=tiers) as guard, guard.http_client() as client:
            response = await client.post("http://a.test" + CHAT, json={**BODY, "stream": False})
            assert response.status_code == 200

    run_virtual(main, backend)
    attempts = records[0].attempts
    if opted_in:
        assert [a.kind for a in attempts] == ["primary", "hedge"]
        assert attempts[1].start - attempts[0].start == pytest.approx(0.2, abs=1e-9)
    else:
        assert [a.kind for a in attempts] == ["primary"]
    assert sum(f.requests for f in fakes.values()) == len(attempts)


@BACKENDS
def test_a_probe_of_a_drained_replica_is_hedged_after_a_typical_ttft_not_the_p95(backend: str) -> None:
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(first_token_after=0.02)]),
        "http://slow.test": FakeReplica("slow", [Plan(first_token_after=20.0)]),  # cut off by the hedge's win
        "http://c.test": FakeReplica("c", [Plan(first_token_after=0.02)]),
    }
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"t": Tier(ttft=10.0, total=30.0, stall=10.0)}
        hedge = HedgePolicy(min_samples=20, min_delay=0.05)
        async with guard_for(fakes, records, tiers=tiers, hedge=hedge) as guard, guard.http_client() as client:
            replicas = guard._replica_set
            # Healthy replicas whose TTFT is 20 ms typically but 2 s at p95 (a fat tail), and a drained one.
            for state in (replicas.states[0], replicas.states[2]):
                for i in range(40):
                    guard.ttft_stats.observe(state.name, "t", True, 2.0 if i % 10 == 0 else 0.02)
            for _ in range(5):
                replicas.router.first_token(replicas.states[0], 0.0, 0.02)
                replicas.router.first_token(replicas.states[2], 0.0, 0.02)
                replicas.router.first_token(replicas.states[1], 0.0, 1.0)
            assert replicas.router.degraded("http://slow.test")
            assert guard.ttft_stats.hedge_delay("t", True) == pytest.approx(2.0)
            replicas.router.probe_every, replicas.router.probe_interval = 1, 0.0  # the next call is a probe
            response = await client.post("http://a.test" + CHAT, json=BODY)
            assert response.status_code == 200
            assert guard.snapshot().idle

    run_virtual(main, backend)
    primary, hedge_attempt = records[0].attempts
    assert (primary.replica, primary.outcome, hedge_attempt.outcome) == ("http://slow.test", "lost", "won")
    # After max(min_delay, the typical 20 ms), not after the p95's 2 s.
    assert hedge_attempt.start - primary.start == pytest.approx(0.05, abs=1e-9)
    assert fakes["http://slow.test"].open_streams == 0


def thinking_plans(n: int, stall_at: int) -> list[Plan]:
    """A reasoning model's answers: first tokens after 2.9-3.1 s, spread evenly (every call alike), and every 20th
    one (from ``stall_at``) stalled 20 s."""
    return [Plan(first_token_after=20.0 if i % 20 == stall_at else 2.9 + 0.2 * (i * 0.618034 % 1)) for i in range(n)]


@BACKENDS
def test_calls_whose_typical_ttft_is_above_max_delay_are_hedged_only_in_their_tail(backend: str) -> None:
    """Typically 3 s to a first token, over the 2 s ``max_delay``: hedging at the clamp would send every call
    twice for nothing (its hedge needs 3 s too). The stalled calls are still hedged, and their hedges win."""
    fakes = {
        "http://a.test": FakeReplica("a", thinking_plans(80, stall_at=9)),
        "http://b.test": FakeReplica("b", thinking_plans(80, stall_at=19)),
    }
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"t": Tier(ttft=60.0, total=120.0, stall=10.0)}
        async with guard_for(fakes, records, tiers=tiers) as guard, guard.http_client() as client:
            for _ in range(60):
                response = await client.post("http://a.test" + CHAT, json=BODY, headers={"x-llmguard-tier": "t"})
                assert response.status_code == 200
            assert guard.snapshot().idle
            assert guard.ttft_stats.hedge_delay("t", True) > 3.0  # the p95, not clamped to max_delay

    run_virtual(main, backend)
    rescued = [r for r in records if r.hedged and r.attempts[-1].outcome == "won"]
    lost = [r for r in records if r.hedged and r.attempts[0].outcome == "won"]
    assert all(r.ttft is not None and r.ttft < 10.0 for r in records)  # no call waited out its 20 s stall
    assert len(rescued) >= 2
    # Hedges that lost to their primary: the first calls, before the warm-up knows the TTFT is 3 s, then
    # about one call in 20 (those above the p95). At the clamp every call was hedged, and nearly every hedge lost.
    assert len(lost) <= TTFTStats.MIN_WARMUP_SAMPLES + 3


@dataclass
class Prefilling(FakeReplica):
    """A `FakeReplica` whose first token comes after a prefill as long as its prompt: 10 ms plus 2 us a
    character, each call up to 20 % slower than that (spread evenly)."""

    def plan_for(self, request: httpx.Request) -> Plan:
        chars = len(json.loads(request.content)["messages"][0]["content"])
        return Plan(first_token_after=(0.01 + 2e-6 * chars) * (1 + 0.2 * (self.requests * 0.618034 % 1)))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.plans = [self.plan_for(request)]
        return await super().handle_async_request(request)


async def send_prompt(client: httpx.AsyncClient, chars: int, key: str | None = None) -> None:
    """One streamed call of tier ``t`` with a prompt of ``chars`` characters (keyed by ``key``), answered 200."""
    body = {**BODY, "messages": [{"role": "user", "content": "x" * chars}]}
    headers = {"x-llmguard-tier": "t", **({"x-llmguard-key": key} if key is not None else {})}
    assert (await client.post("http://a.test" + CHAT, json=body, headers=headers)).status_code == 200


def run_prompts(
    backend: str, prompts: list[tuple[int, str | None]], check: Callable[[Guard], None] = lambda guard: None
) -> list[PhaseRecord]:
    """Each prompt (its characters, its key) sent in turn through a Guard over two `Prefilling` replicas, in virtual
    time; ``check`` is given the Guard, still open, after the last; returns the calls' records."""
    fakes = {"http://a.test": Prefilling("a"), "http://b.test": Prefilling("b")}
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"t": Tier(ttft=5.0, total=10.0, stall=5.0)}
        async with guard_for(fakes, records, tiers=tiers) as guard, guard.http_client() as client:
            for chars, key in prompts:
                await send_prompt(client, chars, key)
            assert guard.snapshot().idle
            check(guard)

    run_virtual(main, backend)
    return records


@BACKENDS
def test_long_prompts_slow_by_their_prefill_are_not_hedged_for_it(backend: str) -> None:
    """One call in ten has a 40,000-character prompt (a first token after ~0.1 s, against ~0.01 s): one TTFT
    window for all of them hedged more than half of the long calls at the short ones' p95 (12 of 20 here), and every
    such hedge lost, its replica prefilling as long for nothing. Each prompt size is now judged against its own."""
    records = run_prompts(backend, [(40_000 if i % 10 == 5 else 100, None) for i in range(200)])
    long_calls = records[5::10]
    hedged = [r for r in long_calls if r.hedged]
    # Before the size class has three first tokens, a long call is judged with all calls (hedged like before).
    assert len(hedged) <= TTFTStats.MIN_WARMUP_SAMPLES
    assert all(r.attempts[0].outcome == "won" for r in hedged)  # a hedge of a long prompt never won


@BACKENDS
def test_a_replica_given_the_long_prompts_is_not_taken_for_a_slow_one(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One tenant's long prompts (one call in four, ~0.1 s to a first token against ~0.01 s) all go to the replica
    that holds their cache (affinity): judged by raw first tokens it looked several times slower than the other, and
    the tenant's calls were moved off it, away from their cache. Each first token is now judged against its prompt
    size's: the replica is neither drained nor left."""

    def neither_drained(guard: Guard) -> None:
        assert not any(r.drained for r in guard.snapshot().replicas)

    prompts = [(40_000, "tenant") if i % 4 == 3 else (100, None) for i in range(120)]
    with caplog.at_level(logging.WARNING, logger="llmguard_client"):
        records = run_prompts(backend, prompts, neither_drained)
    assert [r.message for r in caplog.records if "degraded" in r.message] == []  # never drained meanwhile
    long_calls = records[3::4]
    assert len({r.replica for r in long_calls[1:]}) == 1  # the tenant's calls kept to its replica


MARK: contextvars.ContextVar[str] = contextvars.ContextVar("MARK", default="not the caller's")
"""Set by the caller around its call: what an attempt's transport reads from its context."""


@dataclass
class MarkReading(FakeReplica):
    """A `FakeReplica` that keeps what `MARK` read in each request's context."""

    marks: list[str] = field(default_factory=list)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.marks.append(MARK.get())
        return await super().handle_async_request(request)


def queue_race(
    backend: str, reports: dict[str, float], after: float = 0.1, *, reported_before: bool = True
) -> tuple[PhaseRecord, Guard]:
    """One call whose primary (a) gets its first token after 5 s, hedged after 1 s; ``after`` seconds in,
    each replica named in ``reports`` (b first) reports that many requests queued at its server. With
    ``reported_before``, both servers reported empty queues as the call began (as they do every poll)."""
    fakes = {"http://a.test": MarkReading("a", [Plan(first_token_after=5)]), "http://b.test": MarkReading("b")}
    records: list[PhaseRecord] = []
    tiers = {"interactive": Tier(ttft=3.0, total=10.0, stall=2.0)}
    guard = guard_for(fakes, records, tiers=tiers, hedge=HedgePolicy(delay=1.0))

    async def main() -> None:
        async with guard, guard.http_client() as client:

            async def call() -> None:
                MARK.set("the caller's")
                assert (await client.post("http://a.test" + CHAT, json=BODY)).status_code == 200

            router, (a, b) = guard._replica_set.router, guard._replica_set.states
            for state in (a, b) if reported_before else ():
                router.server_load(state, now(), waiting=0.0, kv_usage=None, fresh_for=9)
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await anyio.sleep(after)
                for state in (b, a):
                    if state.name in reports:
                        waiting = reports[state.name]
                        router.server_load(state, now(), waiting=waiting, kv_usage=None, fresh_for=9)
            assert guard.snapshot().idle

    run_virtual(main, backend)
    assert fakes["http://a.test"].open_streams == fakes["http://b.test"].open_streams == 0
    # Every attempt, the hedge sent from the reporter's task included, runs in the caller's context.
    assert fakes["http://a.test"].marks + fakes["http://b.test"].marks == ["the caller's"] * len(records[0].attempts)
    return records[0], guard


@BACKENDS
def test_a_queue_reported_at_the_primarys_server_sends_the_hedge_at_once(backend: str) -> None:
    record, guard = queue_race(backend, {"http://b.test": 0.0, "http://a.test": 4.0})  # Router.HEDGE_QUEUE
    primary, hedge_attempt = record.attempts
    assert (primary.outcome, hedge_attempt.replica, hedge_attempt.outcome) == ("lost", "http://b.test", "won")
    assert hedge_attempt.start - primary.start == pytest.approx(0.1, abs=1e-9)  # not after the 1 s delay
    assert not guard._replica_set.router._queue_watchers  # the round stopped watching as it ended


@BACKENDS
def test_a_short_queue_or_one_everywhere_is_no_reason_to_hedge_before_the_delay(backend: str) -> None:
    for reports in (
        {"http://b.test": 0.0, "http://a.test": 3.0},  # what a healthy engine shows between two steps
        {"http://b.test": 2.0, "http://a.test": 5.0},  # no other server reports none
        {"http://b.test": 0.0},
    ):
        record, guard = queue_race(backend, reports)
        primary, hedge_attempt = record.attempts
        assert hedge_attempt.start - primary.start == pytest.approx(1.0, abs=1e-9), reports  # at the delay
        assert not guard._replica_set.router._queue_watchers


@BACKENDS
def test_a_call_cancelled_by_its_caller_stops_watching_its_replicas_queue(backend: str) -> None:
    fakes = {"http://a.test": FakeReplica("a", [Plan(first_token_after=5)]), "http://b.test": FakeReplica("b")}
    records: list[PhaseRecord] = []

    async def main() -> None:
        async with guard_for(fakes, records, hedge=HedgePolicy(delay=1.0)) as guard, guard.http_client() as client:
            router = guard._replica_set.router
            for state in guard._replica_set.states:
                router.server_load(state, now(), waiting=0.0, kv_usage=None, fresh_for=9)
            with anyio.move_on_after(0.5):
                await client.post("http://a.test" + CHAT, json=BODY)
            assert not router._queue_watchers
            assert guard.snapshot().idle

    run_virtual(main, backend)
    assert records[0].status == "cancelled"


@BACKENDS
def test_a_call_sent_before_any_server_reported_its_queue_is_not_watched(backend: str) -> None:
    record, guard = queue_race(backend, {"http://b.test": 0.0, "http://a.test": 5.0}, reported_before=False)
    assert record.attempts[1].start - record.attempts[0].start == pytest.approx(1.0, abs=1e-9)
    assert not guard._replica_set.router._queue_watchers


@BACKENDS
def test_a_queue_reported_after_the_round_is_decided_changes_nothing(backend: str) -> None:
    record, guard = queue_race(backend, {"http://b.test": 0.0, "http://a.test": 5.0}, after=6.0)
    assert [(a.replica, a.outcome) for a in record.attempts] == [("http://a.test", "lost"), ("http://b.test", "won")]
    assert record.attempts[1].start - record.attempts[0].start == pytest.approx(1.0, abs=1e-9)
    assert not guard._replica_set.router._queue_watchers


@BACKENDS
def test_a_failed_hedge_fires_the_next_one_at_its_failure(backend: str) -> None:
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(first_token_after=5)]),
        "http://b.test": FakeReplica("b", [Plan(status=500, headers_after=0.05)]),
        "http://c.test": FakeReplica("c"),
    }
    records: list[PhaseRecord] = []

    async def main() -> None:
        hedge = HedgePolicy(delay=0.2, max_hedges=2)
        async with guard_for(fakes, records, hedge=hedge) as guard, guard.http_client() as client:
            replicas = guard._replica_set  # the hedge order: b has the best recent TTFT, then c
            replicas.router.first_token(replicas.states[1], 0.0, 0.01)
            replicas.router.first_token(replicas.states[2], 0.0, 0.02)
            response = await client.post("http://a.test" + CHAT, json=BODY)
            assert response.status_code == 200 and b"c0" in response.content
            assert guard.snapshot().idle

    run_virtual(main, backend)
    primary, first_hedge, second_hedge = records[0].attempts
    assert (first_hedge.replica, first_hedge.error) == ("http://b.test", "http_500")
    assert first_hedge.start - primary.start == pytest.approx(0.2, abs=1e-9)
    assert first_hedge.finish is not None
    assert first_hedge.finish - first_hedge.start == pytest.approx(0.05, abs=1e-9)
    assert second_hedge.start == pytest.approx(first_hedge.finish, abs=1e-9)  # not another 0.2 s later
    assert (second_hedge.replica, second_hedge.outcome, primary.outcome) == ("http://c.test", "won", "lost")


@BACKENDS
def test_a_hedge_answering_while_the_guard_closes_is_closed_and_never_wins(backend: str) -> None:
    """The primary fails at 0.15 s and closing its connection takes 1 s; ``Guard.aclose()`` at 0.3 s
    aborts the call while that close runs, and the hedge's replica answers at 0.5 s, after the call's
    lease was closed. That answer must be closed (abort cancels the hedge's task), never delivered."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(headers_after=0.15, reset_after_tokens=0, close_takes=1.0)]),
        "http://b.test": FakeReplica("b", [Plan(headers_after=0.4)]),
    }
    records: list[PhaseRecord] = []

    async def main() -> None:
        guard = guard_for(fakes, records, tiers={"i": Tier(ttft=5.0, total=10.0)}, hedge=HedgePolicy(delay=0.1))
        async with guard.http_client() as client:

            async def call() -> None:
                with pytest.raises(GuardClosed):
                    await client.post("http://a.test" + CHAT, json=BODY)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await anyio.sleep(0.3)
                await guard.aclose()
            await anyio.sleep(2.0)  # anything still running would have finished by now

    run_virtual(main, backend)
    assert fakes["http://b.test"].open_streams == 0 and fakes["http://a.test"].open_streams == 0
    assert records[0].status == "error" and records[0].cause == "guard_closed"
    assert "won" not in [a.outcome for a in records[0].attempts]


@BACKENDS
def test_a_hedge_cancelled_while_connecting_is_recorded_lost_even_if_its_cancellation_comes_in_a_group(
    backend: str,
) -> None:
    """The hedge fires at 0.2 s, the primary's first token comes at 0.21 s while the hedge still connects: the
    final record says the hedge lost at that instant, never "pending" with no end."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(first_token_after=0.21)]),
        "http://b.test": ConnectsInANursery("b"),
    }
    records: list[PhaseRecord] = []

    async def main() -> None:
        async with guard_for(fakes, records, hedge=HedgePolicy(delay=0.2)) as guard, guard.http_client() as client:
            response = await client.post("http://a.test" + CHAT, json=BODY)
            assert response.status_code == 200 and b"a0" in response.content
            assert guard.snapshot().idle

    run_virtual(main, backend)
    primary, hedge_attempt = records[0].attempts
    assert (records[0].status, primary.outcome, hedge_attempt.outcome) == ("ok", "won", "lost")
    assert fakes["http://b.test"].requests == 1 and hedge_attempt.sent is None
    assert hedge_attempt.finish is not None and primary.first_token is not None
    assert hedge_attempt.finish == pytest.approx(primary.first_token, abs=1e-9)


@BACKENDS
@pytest.mark.parametrize(
    ("hedged_to", "spent"),
    [
        pytest.param(lambda: ConnectsInANursery("b"), 0, id="still-connecting"),
        pytest.param(lambda: FakeReplica("b", [Plan(first_token_after=5)]), 1, id="answered"),
    ],
)
def test_a_hedge_that_lost_before_its_request_was_written_gives_its_ticket_back(
    backend: str, hedged_to: Any, spent: int
) -> None:
    """The primary wins while the hedge still connects (a replica blackholed, say): no server saw the hedge, so
    the budget gets its ticket back at once. A hedge that reached its server and lost stays spent."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(first_token_after=0.21, tokens=50, gap=0.1)]),
        "http://b.test": hedged_to(),
    }
    records: list[PhaseRecord] = []

    async def main() -> None:
        async with guard_for(fakes, records, hedge=HedgePolicy(delay=0.2)) as guard, guard.http_client() as client:
            async with client.stream("POST", "http://a.test" + CHAT, json=BODY) as response:
                budget = guard.snapshot().budget  # the winner streams on for 5 s: the ticket is back before its end
                assert (
                    response.status_code == 200 and budget is not None and (budget.spent, budget.pending) == (spent, 0)
                )
            assert guard.snapshot().idle

    run_virtual(main, backend)
    assert [a.outcome for a in records[0].attempts] == ["won", "lost"]


@BACKENDS
@pytest.mark.parametrize(("max_attempts", "requests"), [(None, 3), ("2", 2), ("1", 1)])
def test_max_attempts_counts_hedges_among_the_requests(backend: str, max_attempts: str | None, requests: int) -> None:
    """Every answer is a 500 after 1 s, longer than the hedge delay: the first round sends its primary and a hedge,
    and the call sends ``max_attempts`` requests in all, hedges included (3 by default; 1 switches both hedges
    and retries off), not a round of two for each attempt it is allowed."""
    slow_500 = [Plan(status=500, headers_after=1.0)]
    fakes = {"http://a.test": FakeReplica("a", slow_500), "http://b.test": FakeReplica("b", slow_500)}
    records: list[PhaseRecord] = []
    headers = {} if max_attempts is None else {"x-llmguard-max-attempts": max_attempts}

    async def main() -> None:
        tiers = {"t": Tier(ttft=10.0, total=20.0)}
        async with (
            guard_for(fakes, records, hedge=HedgePolicy(delay=0.2), tiers=tiers) as guard,
            guard.http_client() as client,
        ):
            response = await client.post("http://a.test" + CHAT, json=BODY, headers=headers)
            assert response.status_code == 500

    run_virtual(main, backend)
    assert fakes["http://a.test"].requests + fakes["http://b.test"].requests == requests
    assert len(records[0].attempts) == requests


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt (Python's default, which trio and ``asyncio.run`` build on)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@BACKENDS
@pytest.mark.usefixtures("ctrl_c_raises")
def test_ctrl_c_while_a_hedge_waits_for_its_first_token_reaches_the_caller_as_keyboard_interrupt(backend: str) -> None:
    """SIGINT once the primary and its hedge are both in flight: the caller's ``except KeyboardInterrupt``
    catches it, as it does without the guard. Each backend delivers it its own way: trio raises it in the
    main task (the caller's, waiting in the round), ``asyncio.run`` cancels the main task and raises it."""
    slow = Plan(first_token_after=10.0)
    fakes = {"http://a.test": FakeReplica("a", [slow]), "http://b.test": FakeReplica("b", [slow])}
    records: list[PhaseRecord] = []

    async def ctrl_c_once_both_are_asked() -> None:
        while sum(f.requests for f in fakes.values()) < 2:  # noqa: ASYNC110 - the fakes signal nothing
            await anyio.sleep(0.01)
        signal.raise_signal(signal.SIGINT)

    interrupters: list[asyncio.Task[None]] = []  # the loop keeps only weak references to its tasks

    async def main() -> None:
        async with guard_for(fakes, records, hedge=HedgePolicy(delay=0.2)) as guard, guard.http_client() as client:
            if backend == "trio":  # a system task is shielded from Ctrl-C: trio delivers it to the main task
                trio.lowlevel.spawn_system_task(ctrl_c_once_both_are_asked)
            else:
                interrupters.append(asyncio.create_task(ctrl_c_once_both_are_asked()))
            await client.post("http://a.test" + CHAT, json=BODY)

    def run() -> None:
        if backend == "trio":
            trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
        else:
            with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=1000.0)) as runner:
                runner.run(main())

    try:
        run()
    except BaseException as exc:  # a KeyboardInterrupt must not end the test session
        caught: BaseException | None = exc
    else:
        caught = None
    assert type(caught) is KeyboardInterrupt, repr(caught)
    assert [f.requests for f in fakes.values()] == [1, 1]


async def test_hedge_fires_at_the_delay_on_another_replica_and_wins(servers: list[LoopbackServer]) -> None:
    # The primary holds back 30 s, 150x the hedge delay: the bounds below only tell "hedged at its delay" from
    # "waited for the primary"; the exact instant is asserted in virtual time (test_a_hedge_fires_at_exactly_its_delay).
    servers[0].script = Script(stall_before_first=30.0, tokens=5)  # the first pick is replica 0 (round-robin start)
    servers[1].script = Script(tokens=8)
    records: list[PhaseRecord] = []
    tiers = {"t": Tier(ttft=20.0, total=40.0, stall=10.0)}
    async with make_guard(servers[:2], records, tiers=tiers) as guard, guard.http_client() as client:
        started = time.monotonic()
        async with client.stream("POST", servers[0].url + CHAT, json=BODY) as response:
            body = (await response.aread()).decode()
        ttft = records[0].ttft
    primary, hedge = records[0].attempts
    assert (primary.kind, primary.replica, primary.outcome) == ("primary", servers[0].url, "lost")
    assert (hedge.kind, hedge.replica, hedge.outcome) == ("hedge", servers[1].url, "won")
    # The delay runs from the round's start; the primary's record starts when its task first runs, a few ms
    # later on a busy machine.
    assert 0.2 - 0.1 <= hedge.start - primary.start < 3.0
    assert ttft is not None and ttft < 3.0 and time.monotonic() - started < 10.0
    # The winner's stream is delivered intact and in order.
    chunks = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
    tokens = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]][1:-1]
    assert tokens == [f" t{i}" for i in range(8)]
    assert body.rstrip().endswith("data: [DONE]")
    # The loser's server saw the disconnect; the winner's finished.
    assert servers[0].wait_for(lambda: servers[0].disconnects == 1)
    assert servers[1].completed == 1 and servers[1].disconnects == 0


async def test_no_hedge_when_the_first_token_comes_in_time(servers: list[LoopbackServer]) -> None:
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard, guard.http_client() as client:
        for _ in range(3):
            await client.post(servers[0].url + CHAT, json=BODY)
    assert all(len(r.attempts) == 1 for r in records)
    assert sum(len(s.received) for s in servers) == 3


async def test_a_failed_attempt_fires_the_next_hedge_at_once(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(stall_before_first=3.0)
    servers[1].script = Script(status=500)
    servers[2].script = Script(tokens=3)
    records: list[PhaseRecord] = []
    delay = 0.4  # long enough that loop lag on a busy machine is not mistaken for a second delay
    hedge = HedgePolicy(delay=delay, max_hedges=2)
    guard = make_guard(servers, records, hedge=hedge)
    # Make the hedge order deterministic: replica 1 has the best recent TTFT, then replica 2.
    replicas = guard._replica_set
    replicas.router.first_token(replicas.states[1], 0.0, 0.01)
    replicas.router.first_token(replicas.states[2], 0.0, 0.02)
    async with guard, guard.http_client() as client:
        response = await client.post(servers[0].url + CHAT, json=BODY)
    assert response.status_code == 200
    primary, first_hedge, second_hedge = records[0].attempts
    assert (first_hedge.replica, first_hedge.outcome, first_hedge.error) == (servers[1].url, "failed", "http_500")
    assert (second_hedge.replica, second_hedge.outcome) == (servers[2].url, "won")
    assert first_hedge.finish is not None
    # At once, not after another full delay; the exact instant is asserted in virtual time (test_deadline.py).
    assert second_hedge.start - first_hedge.finish < delay
    assert primary.outcome == "lost"


async def test_both_fail_gives_one_error_listing_both_attempts(servers: list[LoopbackServer]) -> None:
    for server in servers[:2]:
        server.script = Script(stall_before_first=0.4, malformed_at=0)  # (a cut would meet the caller reading it)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records, retry=None) as guard, guard.http_client() as client:
        with pytest.raises(AllAttemptsFailed) as caught:
            await client.post(servers[0].url + CHAT, json=BODY)
    message = str(caught.value)
    assert "2 attempt(s)" in message
    assert f"primary {servers[0].url}: failed" in message and f"hedge {servers[1].url}: failed" in message
    assert isinstance(caught.value, httpx.TransportError)
    assert [a.outcome for a in records[0].attempts] == ["failed", "failed"]


async def test_caller_cancel_mid_hedge_closes_both(servers: list[LoopbackServer]) -> None:
    for server in servers[:2]:
        server.script = Script(stall_before_first=5.0)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard, guard.http_client() as client:
        with anyio.move_on_after(0.5):
            await client.post(servers[0].url + CHAT, json=BODY)
        assert [r.in_flight for r in guard.snapshot().replicas] == [0, 0]
    assert [a.outcome for a in records[0].attempts] == ["cancelled", "cancelled"]
    assert records[0].status == "cancelled"
    for server in servers[:2]:
        assert server.wait_for(lambda s=server: s.disconnects == 1)  # type: ignore[misc]


async def test_no_hedge_without_budget(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(stall_before_first=0.5)
    records: list[PhaseRecord] = []
    budget = BudgetPolicy(ratio=0.0, floor=0)
    async with make_guard(servers[:2], records, budget=budget) as guard, guard.http_client() as client:
        await client.post(servers[0].url + CHAT, json=BODY)
        assert guard.budget is not None and guard.budget.refused == 1
    assert len(records[0].attempts) == 1 and records[0].attempts[0].outcome == "won"
    assert servers[1].received == []


async def test_non_generation_paths_are_not_hedged(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(stall_before_first=0.5)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard, guard.http_client() as client:
        await client.post(servers[0].url + "/v1/files", json=BODY)
    assert len(records[0].attempts) == 1


@BACKENDS
def test_a_call_beside_every_replicas_path_is_not_hedged(backend: str) -> None:
    """Two deployments of one resource are the replicas; a streamed call to a third deployment (a path under
    neither) goes to that one deployment whichever replica sends it, so a hedge would be a second request to the same
    place, billed twice and no faster: a slow first token is waited for, one request. (It was hedged through the
    other replica after the hedge delay.)"""
    fakes = {
        url: FakeReplica(url[-4:], [Plan(first_token_after=2.0)])
        for url in ("http://a.test/openai/deployments/east", "http://a.test/openai/deployments/west")
    }
    records: list[PhaseRecord] = []

    async def main() -> None:
        async with virtual_guard(fakes, records, hedge=HedgePolicy(delay=0.1)) as virtual:
            async with virtual.http_client() as client:
                body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
                url = "http://a.test/openai/deployments/gpt35/chat/completions?api-version=2024-10-21"
                async with client.stream("POST", url, json=body) as response:
                    assert response.status_code == 200
                    await response.aread()

    run_virtual(main, backend)
    (record,) = records
    assert len(record.attempts) == 1 and sum(f.requests for f in fakes.values()) == 1
