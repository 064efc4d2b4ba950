"""Routing against real loopback servers: one replica of three turns slow, the guard steers new calls
away from it, probes it, and brings it back once it is fast again."""

from __future__ import annotations

from typing import Any

import httpx

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
