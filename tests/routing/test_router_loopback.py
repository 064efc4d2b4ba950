"""Routing against real loopback servers: one replica of three turns slow, the guard steers new calls
away from it, probes it, and brings it back once it is fast again."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from llmguard_client import Guard, PhaseRecord, Tier
from tests.loopback import LoopbackServer, Script

CHAT = "/v1/chat/completions"
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}


async def test_new_calls_steer_away_from_a_slow_replica_and_return_when_it_recovers(
    servers: list[LoopbackServer],
) -> None:
    slow = servers[1]
    slow.script = Script(stall_before_first=0.4, tokens=5)  # ~100x the others' first token
    records: list[PhaseRecord] = []
    guard = Guard(
        replicas=[s.url for s in servers],
        tiers={"t": Tier(ttft=3.0, total=10.0, stall=2.0)},
        hedge=None,
        instrumentation=None,
        on_record=records.append,
    )
    router = guard._replica_set.router
    async with guard, guard.http_client() as client:
        for _ in range(30):
            async with client.stream("POST", servers[0].url + CHAT, json=BODY) as response:
                assert response.status_code == 200
                await response.aread()
        assert router.degraded(slow.url)
        # The calls that measured it (Router.MIN_SAMPLES: it is judged on no fewer); with the default probe
        # pacing (one call in 50) none went there since.
        assert len(slow.received) <= router.MIN_SAMPLES
        assert len(servers[0].received) + len(servers[2].received) == 30 - len(slow.received)
        assert all(r.status == "ok" for r in records)

        slow.script = Script(tokens=5)  # it recovers
        router.probe_every, router.probe_interval = 5, 0.0  # probe often, so the test stays short
        for _ in range(40):
            async with client.stream("POST", servers[0].url + CHAT, json=BODY) as response:
                await response.aread()
        assert not router.degraded(slow.url)
        # A probe or two saw it fast; once back it takes its share of the remaining calls.
        assert len(slow.received) >= 2 + 8
    assert [s.in_flight for s in guard._replica_set.states] == [0, 0, 0]


async def test_a_replica_that_breaks_streams_after_the_first_token_is_drained(servers: list[LoopbackServer]) -> None:
    """Mid-stream failures reach the replica's health through the delivered body's end (they cannot be
    retried: the caller already has tokens), so later calls avoid the replica that causes them."""
    breaking = servers[0]
    breaking.script = Script(tokens=6, reset_after_tokens=2)
    records: list[PhaseRecord] = []
    guard = Guard(
        replicas=[s.url for s in servers],
        tiers={"t": Tier(ttft=3.0, total=10.0, stall=2.0)},
        hedge=None,
        instrumentation=None,
        on_record=records.append,
    )
    router = guard._replica_set.router
    failed = 0
    async with guard, guard.http_client() as client:
        for _ in range(30):
            try:
                async with client.stream("POST", servers[1].url + CHAT, json=BODY) as response:
                    await response.aread()
            except httpx.HTTPError:
                failed += 1
    # Every call it took broke, and the failure rate (x10 in its cost) keeps the calls away after one or two.
    assert failed == len(breaking.received) <= 3
    assert breaking.url in {s.name for s in router.states if s.health.failure > 0}
    assert sum(r.status == "ok" for r in records) == 30 - failed
    assert [s.in_flight for s in guard._replica_set.states] == [0, 0, 0]


NOT_FOUND = Script(status=404, body={"error": {"message": "The model `m` does not exist.", "code": 404}})
"""vLLM's answer for a model it does not serve (a rollout renaming the served model), sent at once."""


def unhedged(servers: list[LoopbackServer]) -> Guard:
    """A Guard over ``servers`` without hedging (each call's requests are its own)."""
    return Guard(
        replicas=[s.url for s in servers],
        tiers={"t": Tier(ttft=3.0, total=10.0, stall=2.0)},
        hedge=None,
        instrumentation=None,
    )


async def test_a_replica_that_answers_404_to_every_call_is_drained_while_the_others_serve(
    servers: list[LoopbackServer], caplog: pytest.LogCaptureFixture
) -> None:
    """Answered at once, its 404s kept it at 0 calls in flight, the cheapest replica: it drew the calls (99 % of
    three looping callers' calls failed, a third of one caller's). Now its third rejection in a row drains it,
    then it takes probes only, and a probe's 404 (the drained replica's, not the call's) is retried on another
    replica: its callers got two 404s in all; no circuit opens."""
    caplog.set_level("WARNING", logger="llmguard_client")
    rejecting = servers[2]
    rejecting.script = NOT_FOUND
    guard = unhedged(servers)
    router = guard._replica_set.router
    statuses: list[int] = []
    async with guard, guard.http_client() as client:

        async def call() -> None:
            async with client.stream("POST", servers[0].url + CHAT, json=BODY) as response:
                await response.aread()
                statuses.append(response.status_code)

        # Drained at its third rejection in a row.
        while not router.degraded(rejecting.url) and len(statuses) < 5000:
            await call()
        for _ in range(150):
            await call()
        snapshot = guard.snapshot()
    assert router.degraded(rejecting.url)
    assert statuses.count(404) == router.REJECTIONS_IN_A_ROW - 1 < len(rejecting.received)
    assert statuses.count(200) == len(statuses) - statuses.count(404)
    assert [(r.drained, r.healthy, r.circuit_open_for) for r in snapshot.replicas] == [
        (False, True, 0.0),
        (False, True, 0.0),
        (True, True, 0.0),
    ]
    [line] = [r.getMessage() for r in caplog.records if "drained" in r.getMessage()]
    assert f"replica {rejecting.url} answers 404 to what the others serve" in line


async def test_when_every_replica_answers_404_every_caller_gets_it_and_nothing_is_drained(
    servers: list[LoopbackServer],
) -> None:
    """The caller's own fault (a wrong model name): every replica rejects alike, so none is drained, no circuit
    opens and no call is refused: each gets the server's 404, as without the guard."""
    for server in servers:
        server.script = NOT_FOUND
    guard = unhedged(servers)
    async with guard, guard.http_client() as client:
        for _ in range(30):
            async with client.stream("POST", servers[0].url + CHAT, json=BODY) as response:
                await response.aread()
                assert response.status_code == 404
        snapshot = guard.snapshot()
    assert sum(len(s.received) for s in servers) == 30  # none retried
    assert all(s.health.rejection > guard._replica_set.router.DRAIN_FAILURE for s in guard._replica_set.states)
    assert [(r.drained, r.healthy, r.circuit_open_for) for r in snapshot.replicas] == [(False, True, 0.0)] * 3
    assert not snapshot.panic
