"""Cache affinity through a real Guard on loopback servers: the key picks the replica, fleet-wide; the key's
header never reaches a replica; a keyed call's hedge goes to the key's second replica; a hot key spills."""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import anyio
import httpx
import pytest

from llmguard_client import AffinityPolicy, Guard, HedgePolicy, PhaseRecord, Tier
from llmguard_client._core import request as request_module
from llmguard_client._routing.affinity import routing as affinity_routing
from llmguard_client._routing.affinity.hashing import affinity_order
from llmguard_client._routing.router import Router
from tests.loopback import LoopbackServer, Script

CHAT = "/v1/chat/completions"
TIERS = {"t": Tier(ttft=20.0, total=30.0, stall=10.0)}


@pytest.fixture(autouse=True)
def no_draining_by_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about where keys go, among replicas that are all healthy; on a loaded machine one loopback
    server can answer 4x slower than another for a while, which the router would rightly drain (and affinity then
    rightly avoid). Raise the router's floors so speed alone never drains one here."""
    monkeypatch.setattr(Router, "TTFT_FLOOR", 60.0)
    monkeypatch.setattr(Router, "TPOT_FLOOR", 60.0)


def body(user: str = "x", system: str = "you are terse") -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return {"model": "m", "messages": messages, "stream": True, "max_tokens": 3}


async def send(client: httpx.AsyncClient, url: str, payload: dict[str, Any], **headers: str) -> PhaseRecord:
    async with client.stream("POST", url + CHAT, json=payload, headers=headers) as response:
        assert response.status_code == 200
        await response.aread()
        record: PhaseRecord = response.extensions["llmguard"]
        return record


async def test_the_same_key_picks_the_same_replica_in_two_guards(
    servers: list[LoopbackServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new key is placed among the replicas tied for the least cost; on a busy machine one loopback replica's
    # measured TTFT can fall outside the tie by scheduling noise alone. Every replica ties here, so the key's
    # order alone decides, as it does between two processes that measured the same replicas alike.
    monkeypatch.setattr(Router, "TIE_SECONDS", 60.0)
    urls = [s.url for s in servers]
    keys = [f"conversation-{i}" for i in range(12)]
    chosen: list[list[str | None]] = []
    for listed in (urls, list(reversed(urls))):  # two processes of a fleet, configured in another order
        # A slack above the test's calls: new keys are placed by their order alone, never by the recent calls.
        policy = AffinityPolicy(auto=False, load_slack=len(keys))
        async with Guard(listed, TIERS, hedge=None, instrumentation=None, affinity=policy) as guard:
            async with guard.http_client() as client:
                records = [await send(client, urls[0], body(), **{"x-llmguard-session": k}) for k in keys]
                chosen.append([r.replica for r in records])
    assert chosen[0] == chosen[1] == [affinity_order(k, urls)[0] for k in keys]
    received = [r for s in servers for r in s.received if r.path == CHAT]
    assert len(received) == 2 * len(keys)
    assert all("x-llmguard-session" not in r.headers for r in received)  # the guard's own header stays home


async def test_auto_keys_and_sessions_keep_a_conversation_on_one_replica(servers: list[LoopbackServer]) -> None:
    urls = [s.url for s in servers]
    async with Guard(urls, TIERS, hedge=None, instrumentation=None, affinity="auto") as guard:
        async with guard.http_client() as client:
            # The same system prompt and first user message: one replica, turn after turn.
            auto = {(await send(client, urls[0], body(system="conv A"))).replica for _ in range(6)}
            with guard.session("user-7"):
                session = {(await send(client, urls[0], body(user=f"turn {i}"))).replica for i in range(6)}
    assert len(auto) == 1
    # A session key too; its first call was placed by the recent calls (conv A's six took one replica), then
    # every call followed it.
    assert len(session) == 1


async def test_a_keyed_call_parses_its_body_once(
    servers: list[LoopbackServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[bytes] = []
    loads = json.loads

    def counting(raw: bytes) -> Any:
        parsed.append(raw)
        return loads(raw)

    monkeypatch.setattr(request_module, "json", type("json", (), {"loads": staticmethod(counting)}))
    monkeypatch.setattr(affinity_routing, "auto_key", lambda body: pytest.fail("the body was parsed again"))
    urls = [s.url for s in servers]
    async with Guard(urls, TIERS, hedge=None, instrumentation=None, affinity="auto") as guard:
        async with guard.http_client() as client:
            keyed = {(await send(client, urls[0], body(system="conv B"))).replica for _ in range(2)}
    assert len(parsed) == 2 and len(keyed) == 1  # one parse per call: its facts and its key both read it


async def test_without_affinity_the_same_conversation_spreads(servers: list[LoopbackServer]) -> None:
    urls = [s.url for s in servers]
    async with Guard(urls, TIERS, hedge=None, instrumentation=None, affinity=None) as guard:
        async with guard.http_client() as client:
            with guard.session("user-7"):  # accepted, and ignored
                replicas = {(await send(client, urls[0], body())).replica for _ in range(6)}
    assert replicas == set(urls)


async def test_a_keyed_calls_hedge_goes_to_the_keys_second_replica(servers: list[LoopbackServer]) -> None:
    urls = [s.url for s in servers]
    key = "conversation-hedged"
    first, second, _ = affinity_order(key, urls)
    by_url = {s.url: s for s in servers}
    by_url[first].script = Script(stall_before_first=1.0, tokens=3)  # slow: the hedge fires and wins
    hedge = HedgePolicy(delay=0.05)
    async with Guard(urls, TIERS, hedge=hedge, instrumentation=None, affinity="explicit") as guard:
        async with guard.http_client() as client:
            record = await send(client, urls[0], body(), **{"x-llmguard-session": key})
    assert [(a.kind, a.replica) for a in record.attempts] == [("primary", first), ("hedge", second)]
    assert record.replica == second


async def test_a_hot_key_spills_within_the_load_bound(servers: list[LoopbackServer]) -> None:
    """One key, 200 concurrent calls: its home (its first replica, where an earlier call of it was answered) takes
    its share and no more; the rest spill."""
    urls = [s.url for s in servers]
    for server in servers:
        server.script = Script(stall_before_first=3.0, tokens=2)  # long enough for all 200 to be in flight
    policy = AffinityPolicy(auto=False, load_factor=1.25, load_slack=0)
    peak: dict[str, int] = {}
    async with Guard(urls, TIERS, hedge=None, instrumentation=None, affinity=policy) as guard:
        replicas = guard._replica_set
        replicas.served("hot", next(s for s in replicas.states if s.name == affinity_order("hot", urls)[0]))
        async with guard.http_client() as client, anyio.create_task_group() as tg:
            for _ in range(200):
                tg.start_soon(functools.partial(send, client, urls[0], body(), **{"x-llmguard-session": "hot"}))
            states = guard._replica_set.states
            for _ in range(2000):  # at most ~20 s for the 200 calls to be sent
                if sum(s.in_flight for s in states) == 200:
                    break
                await anyio.sleep(0.01)
            peak = {s.name: s.in_flight for s in states}
    assert sum(peak.values()) == 200, "the 200 calls were not all in flight at once"
    assert max(peak.values()) <= math.ceil(1.25 * 200 / 3)
    assert max(peak, key=lambda n: peak[n]) == affinity_order("hot", urls)[0]
    assert sum(len(s.received) for s in servers) == 200
