"""Routing against real loopback servers: one replica of three turns slow, the guard steers new calls
away from it, probes it, and brings it back once it is fast again."""

from __future__ import annotations

from typing import Any

from llmguard_client import Guard, PhaseRecord, Tier
from tests.loopback import LoopbackServer, Script

CHAT = "/v1/chat/completions"
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}


async def test_new_calls_steer_away_from_a_slow_replica_and_return_when_it_recovers(
    servers: list[LoopbackServer],
) -> None:
    slow = servers[1]
    slow.script = Script(stall_before_first=0.15, tokens=5)  # ~50x the others' first token
    records: list[PhaseRecord] = []
    guard = Guard(
        replicas=[s.url for s in servers],
        tiers={"t": Tier(ttft=3.0, total=10.0, stall=2.0)},
        hedge=None,
        instrumentation=None,
        on_record=records.append,
    )
    router = guard.transport.hedger.replicas.router
    async with guard, guard.http_client() as client:
        for _ in range(30):
            async with client.stream("POST", servers[0].url + CHAT, json=BODY) as response:
                assert response.status_code == 200
                await response.aread()
        assert router.degraded(slow.url)
        # One call found it slow; with the default probe pacing (one call in 50) none went there since.
        assert len(slow.received) == 1
        assert len(servers[0].received) + len(servers[2].received) == 29
        assert all(r.status == "ok" for r in records)

        slow.script = Script(tokens=5)  # it recovers
        router.probe_every, router.probe_interval = 5, 0.0  # probe often, so the test stays short
        for _ in range(40):
            async with client.stream("POST", servers[0].url + CHAT, json=BODY) as response:
                await response.aread()
        assert not router.degraded(slow.url)
        # A probe or two saw it fast; once back it takes its share of the remaining calls.
        assert len(slow.received) >= 1 + 8
    assert [s.in_flight for s in guard.transport.hedger.replicas.states] == [0, 0, 0]
