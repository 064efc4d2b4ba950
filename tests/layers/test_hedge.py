"""Hedged rounds against real loopback servers: first content token wins, losers are closed."""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx
import pytest

from llmguard_client import AllAttemptsFailed, BudgetPolicy, Guard, HedgePolicy, PhaseRecord, Tier
from tests.loopback import LoopbackServer, Script

CHAT = "/v1/chat/completions"
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}


def make_guard(servers: list[LoopbackServer], records: list[PhaseRecord], **kwargs: Any) -> Guard:
    kwargs.setdefault("tiers", {"t": Tier(ttft=3.0, total=10.0, stall=2.0)})
    kwargs.setdefault("hedge", HedgePolicy(delay=0.2))
    return Guard(replicas=[s.url for s in servers], instrumentation=None, on_record=records.append, **kwargs)


async def test_hedge_fires_at_the_delay_on_another_replica_and_wins(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(stall_before_first=3.0, tokens=5)  # the first pick is replica 0 (round-robin start)
    servers[1].script = Script(tokens=8)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard, guard.http_client() as client:
        started = time.monotonic()
        async with client.stream("POST", servers[0].url + CHAT, json=BODY) as response:
            body = (await response.aread()).decode()
        ttft = records[0].ttft
    primary, hedge = records[0].attempts
    assert (primary.kind, primary.replica, primary.outcome) == ("primary", servers[0].url, "lost")
    assert (hedge.kind, hedge.replica, hedge.outcome) == ("hedge", servers[1].url, "won")
    # The delay runs from the round's start; the primary's record starts when its task first runs, a few ms
    # later on a busy machine. The exact instant is asserted in virtual time (test_deadline.py).
    assert 0.2 - 0.1 <= hedge.start - primary.start < 0.2 + 0.3  # generous: loop lag on a shared machine
    assert ttft is not None and ttft < 0.5 and time.monotonic() - started < 1.0
    # The winner's stream is delivered intact and in order.
    tokens = [part.split('"')[0] for part in body.split('"content": "')[2:]]
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
        server.script = Script(stall_before_first=0.4, reset_after_tokens=0)
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
