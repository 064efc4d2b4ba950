"""Paced retries spread past a Retry-After that many calls share: in virtual time on asyncio and trio, against a
server with room for a few calls at a time that refuses the rest with one Retry-After."""

from __future__ import annotations

import contextlib
import json
import random
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from llmguard_client import Guard, PhaseRecord, RetryPolicy, Tier, TTFTTimeout
from llmguard_client._layers.retry import PACED_SPREAD, Backoff, RetryLayer
from tests.virtual import BACKENDS, run_virtual

CHAT = "http://a.test/v1/chat/completions"
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
RETRY_AFTER = 2.0
REFUSAL = 0.01


@dataclass
class Capacity(httpx.AsyncBaseTransport):
    """Serves ``room`` calls at a time (each answered whole after ``takes`` s); refuses the rest with a 429 and
    ``Retry-After: 2``, answered after `REFUSAL` s (the calls sent together all meet the server before the first
    refusal is back). Notes each request's instant and whether it was served."""

    room: int = 2
    takes: float = 0.3
    busy: int = 0
    log: list[tuple[float, bool]] = field(default_factory=list)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        served = self.busy < self.room
        self.log.append((anyio.current_time(), served))
        if not served:
            await anyio.sleep(REFUSAL)
            return httpx.Response(429, headers={"retry-after": "2"}, json={"error": {"message": "busy"}})
        self.busy += 1
        try:
            await anyio.sleep(self.takes)
        finally:
            self.busy -= 1
        body = {"id": "c", "object": "chat.completion", "model": "m", "choices": [{"index": 0, "message": {}}]}
        return httpx.Response(200, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


def seeded_guard(server: Capacity, records: list[PhaseRecord], ttft: float) -> Guard:
    """A Guard over ``server`` alone whose retries draw from a seeded random source (reproducible instants)."""
    guard = Guard(
        ["http://a.test"],
        instrumentation=None,
        on_record=records.append,
        transport_factory=lambda replica: server,
        tiers={"default": Tier(ttft=ttft, total=ttft + 5.0)},
        hedge=None,
        failure_mode="response",
    )
    retry = next(layer for layer in guard.transport.pipeline.layers if isinstance(layer, RetryLayer))
    policy = RetryPolicy()
    retry.backoff = Backoff(policy.backoff_initial, policy.backoff_max, random.Random(5), policy.same_replica_backoff)
    return guard


async def burst(server: Capacity, calls: int, ttft: float) -> tuple[list[PhaseRecord], int, float]:
    """``calls`` calls sent at once; returns their records, how many were served, and when they were sent."""
    records: list[PhaseRecord] = []
    served = [0]
    async with seeded_guard(server, records, ttft) as guard, guard.http_client() as client:
        started = anyio.current_time()

        async def one() -> None:
            with contextlib.suppress(TTFTTimeout):  # a served retry whose answer came after the deadline
                response = await client.post(CHAT, json=BODY)
                served[0] += response.status_code == 200

        async with anyio.create_task_group() as group:
            for _ in range(calls):
                group.start_soon(one)
    return records, served[0], started


@BACKENDS
def test_calls_refused_with_one_retry_after_retry_at_spread_instants_and_more_are_served(backend: str) -> None:
    """Ten calls at once, room for two: eight are refused together with ``Retry-After: 2``. Each goes back no
    sooner than asked and at most half of it later, each at its own instant, and the server serves them as they
    come: all ten are served. (At one shared instant, two of each round's calls were served and the others refused
    together again: 2 + 2 + 2 of 10.)"""
    server = Capacity()

    async def main() -> None:
        records, served, started = await burst(server, 10, ttft=10.0)
        assert [ok for t, ok in server.log if t == started].count(False) == 8  # two served, eight refused together
        refused = started + REFUSAL
        latest = refused + RETRY_AFTER * (1 + PACED_SPREAD)
        retries = sorted(t for t, _ in server.log if started < t <= latest)
        assert len(retries) == 8 and len(set(retries)) == 8  # every refused call came back, each at its own instant
        assert all(refused + RETRY_AFTER <= t for t in retries)  # never sooner than the server asked
        assert served == 10 and all(r.status == "ok" and len(r.attempts) <= 3 for r in records)

    run_virtual(main, backend)


@BACKENDS
def test_a_paced_retry_is_spread_only_as_far_as_the_calls_deadline_leaves_room(backend: str) -> None:
    """A first-token deadline of 2.5 s leaves about half a second past the 2 s Retry-After: the retries spread
    within it, each at its own instant and none past the deadline; a call refused again has no room for another
    wait, and its answer is the server's 429, as it was before the spread."""
    server = Capacity(takes=0.05)

    async def main() -> None:
        records, served, started = await burst(server, 10, ttft=2.5)
        retries = sorted(t for t, _ in server.log if t > started)
        assert len(retries) == 8 and len(set(retries)) == 8
        assert all(started + REFUSAL + RETRY_AFTER <= t < started + 2.5 for t in retries)
        assert served > 4  # at one shared instant: two of the eight retries, 2 + 2 of 10
        assert all(len(r.attempts) <= 2 for r in records)  # no room for a third attempt within 2.5 s

    run_virtual(main, backend)


def test_the_spread_is_a_share_of_the_wait_from_the_seeded_source_bounded_by_the_maximum_and_the_room_left() -> None:
    draws = random.Random(11)
    cases = [(2.0, 10.0), (2.0, 0.3), (90.0, 100.0)]  # 90 s: at most the backoff's maximum (2 s) more
    expected = [draws.uniform(0.0, min(PACED_SPREAD * wait, 2.0, room)) for wait, room in cases]
    backoff = Backoff(0.05, 2.0, random.Random(11))
    assert [backoff.spread(wait, room) for wait, room in cases] == expected
    assert expected[1] <= 0.3 and expected[2] <= 2.0
    assert backoff.spread(2.0, 0.0) == 0.0 and backoff.spread(2.0, -1.0) == 0.0  # no room: the wait as asked
    assert backoff.spread(0.0, 5.0) == 0.0
    assert all(0.0 <= backoff.spread(2.0, 10.0) <= PACED_SPREAD * 2.0 for _ in range(1000))
