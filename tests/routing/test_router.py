"""The router: least-cost choice, power of two choices, draining a degraded replica to probes and
bringing it back, mid-stream failures, rate-limit headers. Every test passes ``now``; nothing sleeps (a
whole Guard's calls run in virtual time)."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import pytest

from llmguard_client import PhaseRecord, Tier
from llmguard_client._core.transport import _stream_outcome
from llmguard_client._routing.router import ReplicaHealth, Router
from llmguard_client.protocols import reader_for
from tests.virtual import BACKENDS, FakeReplica, Plan, run_virtual, virtual_guard

NOW = 1000.0
FAST, SLOW = 0.020, 0.200  # seconds to first token: a healthy replica and one 10x slower
CHAT = "http://a.test/v1/chat/completions"
STREAMED = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}


@dataclass(eq=False)
class Fake:
    name: str
    in_flight: int = 0
    cooling_until: float = 0.0
    health: ReplicaHealth = field(default_factory=ReplicaHealth)

    def cooling(self, now: float) -> bool:
        return now < self.cooling_until


def cluster(n: int = 3, **kwargs: object) -> tuple[Router[Fake], list[Fake]]:
    states = [Fake(f"r{i}") for i in range(n)]
    return Router(states, rng=random.Random(0), **kwargs), states  # type: ignore[arg-type]


def warm(router: Router[Fake], states: list[Fake], ttfts: list[float], tpot: float = 0.01, calls: int = 10) -> None:
    """``calls`` complete calls on every replica, at the given TTFTs and ``tpot`` for all."""
    for _ in range(calls):
        for state, ttft in zip(states, ttfts, strict=True):
            router.first_token(state, NOW, ttft)
            router.stream_finished(state, NOW, ok=True, tokens=21, duration=20 * tpot)


async def stream_calls(client: httpx.AsyncClient, n: int) -> None:
    """``n`` streamed calls one after another, each read to its end."""
    for _ in range(n):
        async with client.stream("POST", CHAT, json=STREAMED) as response:
            await response.aread()


def picks(router: Router[Fake], states: list[Fake], n: int, now: float = NOW) -> Counter[str]:
    out: Counter[str] = Counter()
    for _ in range(n):
        chosen = router.pick(now, states)
        assert chosen is not None
        out[chosen.name] += 1
    return out


# --- scoring -------------------------------------------------------------------------------------------


def test_with_nothing_known_the_least_loaded_wins_and_equals_take_turns() -> None:
    router, (r0, r1, r2) = cluster()
    assert picks(router, [r0, r1, r2], 6) == {"r0": 2, "r1": 2, "r2": 2}
    r0.in_flight, r1.in_flight, r2.in_flight = 2, 0, 1
    assert router.pick(NOW, [r0, r1, r2]) is r1


def test_a_faster_replica_wins_at_equal_load_and_load_evens_it_out() -> None:
    router, states = cluster(2)
    r0, r1 = states
    warm(router, states, [0.02, 0.05], tpot=0.001)  # expected 41 ms vs 71 ms (21 tokens): not a tie
    assert router.pick(NOW, states) is r0
    r0.in_flight = 2  # 3 x 41 ms = 123 ms > 71 ms
    assert router.pick(NOW, states) is r1


def test_costs_within_the_tie_band_take_turns() -> None:
    router, states = cluster(2)
    warm(router, states, [0.020, 0.022])  # 2 ms apart on 0.2 s: noise, not a difference
    assert picks(router, states, 4) == {"r0": 2, "r1": 2}


def test_failures_raise_the_cost_and_fade() -> None:
    router, states = cluster(2)
    r0, r1 = states
    warm(router, states, [FAST, FAST])
    for _ in range(2):
        router.failed(r0, NOW)  # failure rate 0.19: cost x 2.9
    r1.in_flight = 1  # cost x 2
    assert router.pick(NOW, states) is r1
    later = NOW + 2 * router.FAILURE_HALF_LIFE  # rate / 4: cost x 1.5
    assert router.pick(later, states) is r0


def test_a_cooling_replica_only_loses_ties() -> None:
    router, states = cluster(2)
    r0, r1 = states
    r0.cooling_until = NOW + 5
    assert picks(router, states, 3) == {"r1": 3}
    r1.in_flight = 2
    assert router.pick(NOW, states) is r0


# --- power of two choices ---------------------------------------------------------------------------


def test_up_to_three_replicas_every_one_is_compared() -> None:
    router, states = cluster(3)
    warm(router, states, [0.10, 0.02, 0.20], tpot=0.001)
    assert picks(router, states, 20) == {"r1": 20}


def test_above_the_full_scan_limit_two_are_drawn_and_the_worst_never_wins() -> None:
    router, states = cluster(5)
    warm(router, states, [0.05, 0.10, 0.16, 0.24, 0.34], tpot=0.0)  # each beyond the tie band of the last
    counts = picks(router, states, 1000)
    assert "r4" not in counts  # every pair that holds it holds a better one
    # P(best of a random pair is r_i) = (4 - i) / 10: 400, 300, 200, 100
    assert counts["r0"] > counts["r1"] > counts["r2"] > counts["r3"] > 0
    assert counts["r0"] == pytest.approx(400, abs=60)


def test_full_scan_limit_is_configurable_and_validated() -> None:
    router, states = cluster(5, full_scan_up_to=5)
    warm(router, states, [0.34, 0.24, 0.16, 0.10, 0.05], tpot=0.0)
    assert picks(router, states, 10) == {"r4": 10}
    with pytest.raises(ValueError, match="full_scan_up_to must be an int >= 2"):
        Router([], full_scan_up_to=1)
    with pytest.raises(ValueError, match="probe_interval must be a positive number"):
        Router([], probe_interval=0)
    with pytest.raises(ValueError, match="probe_every must be an int >= 1"):
        Router([], probe_every=0)


# --- drain, probes, recovery -------------------------------------------------------------------------


def test_a_replica_10x_slower_to_first_token_is_drained_within_a_few_calls() -> None:
    router, states = cluster()
    r0, r1, r2 = states
    warm(router, [r0, r2], [FAST, FAST])
    drained_after = None
    for call in range(1, 10):
        router.first_token(r1, NOW, SLOW)
        if r1.health.drained:
            drained_after = call
            break
    assert drained_after is not None and drained_after <= 4
    assert router.degraded("r1") and not router.degraded("r0") and not router.degraded("nope")
    assert "r1" not in picks(router, states, 49)


def test_one_straggler_among_a_fresh_replicas_first_calls_does_not_drain_it() -> None:
    """A healthy replica whose first call took 516 ms (the others' 20 ms) is judged on its first samples'
    median, not on that one: it is never drained and keeps its share of the calls."""
    router, states = cluster()
    r1 = states[1]
    served: Counter[str] = Counter()
    for call in range(30):
        chosen = router.pick(NOW + call, states)
        assert chosen is not None
        served[chosen.name] += 1
        ttft = 0.516 if chosen is r1 and served["r1"] == 1 else FAST
        router.first_token(chosen, NOW + call, ttft)
        router.stream_finished(chosen, NOW + call, ok=True, tokens=21, duration=20 * 0.01)
        assert not r1.health.drained
    assert r1.health.ttft == pytest.approx(FAST, rel=0.5)
    assert served["r1"] >= 8


@BACKENDS
def test_a_fresh_guard_keeps_a_healthy_replica_after_one_straggler(backend: str) -> None:
    """The same through a whole Guard, hedging on, in virtual time: 30 calls, the second replica's first answer
    a 516 ms straggler; it is not judged degraded, and it answers its share of the calls."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(first_token_after=0.02)]),
        "http://b.test": FakeReplica("b", [Plan(first_token_after=0.516), Plan(first_token_after=0.02)]),
        "http://c.test": FakeReplica("c", [Plan(first_token_after=0.02)]),
    }
    records: list[PhaseRecord] = []

    async def main() -> None:
        guard = virtual_guard(fakes, records, tiers={"t": Tier(ttft=5.0, total=10.0)})
        async with guard, guard.http_client() as client:
            await stream_calls(client, 30)
            assert not guard._replica_set.router.degraded("http://b.test")

    run_virtual(main, backend)
    winners = Counter(a.replica for r in records for a in r.attempts if a.outcome == "won")
    assert winners["http://b.test"] >= 6


def test_a_replica_5x_slower_per_token_is_drained() -> None:
    router, states = cluster()
    warm(router, states, [FAST, FAST, FAST], tpot=0.01)
    streams = 0
    while not states[2].health.drained and streams < 20:
        router.stream_finished(states[2], NOW, ok=True, tokens=21, duration=20 * 0.05)
        streams += 1
    assert states[2].health.drained and streams <= 8  # the EWMA climbs x1.6 a stream at most, to 4x


def test_a_busy_clients_late_reads_of_short_streams_drain_no_replica() -> None:
    """Measured on a CPU-bound client (two identical loopback replicas, 3-token streams, 50 calls at a time):
    first tokens about 100 ms after the request on either replica (the client's event loop is that late), the
    rest of a stream mostly read within 1 ms of its first token, but read one pass of the loop later, 60-120 ms,
    now and then, for a run of streams in a row. Spread over 3 tokens a run of those raised one replica's
    per-token estimate to 7-37 ms against the median's 0-2 ms, and it was drained, both replicas in turn."""
    router, states = cluster(2)
    for _ in range(10):
        for state in states:
            router.first_token(state, NOW, 0.1)
            router.stream_finished(state, NOW, ok=True, tokens=4, duration=0.0008)
    for _ in range(12):  # one replica's streams end during the loop's late passes
        router.stream_finished(states[0], NOW, ok=True, tokens=4, duration=0.12)
    assert states[0].health.tpot is not None and states[0].health.tpot > 0.03  # it reads as ~100x slower per token
    assert not states[0].health.drained and router.epoch == 0  # costed by it, not drained


async def read_slowly(client: httpx.AsyncClient, pause: float) -> None:
    """One streamed call read by a caller that pauses ``pause`` seconds after every chunk (forwarding it to a slow
    websocket, say)."""
    async with client.stream("POST", CHAT, json=STREAMED) as response:
        async for _ in response.aiter_raw():
            await anyio.sleep(pause)


@BACKENDS
def test_callers_reading_slowly_do_not_drain_the_fastest_replica(backend: str) -> None:
    """Every replica sends its answer at once; the fastest's first token takes 20 ms, the others' 300 ms. Callers
    that read one chunk a second paced the streams, not the replica: it was learned as ~1 s per token against the
    others' ~0 (their few slow-read calls came after the drain), drained, and fresh calls went to the 300 ms ones."""
    a, b, c = "http://a.test", "http://b.test", "http://c.test"
    fakes = {
        a: FakeReplica("a", [Plan(first_token_after=0.02)]),
        b: FakeReplica("b", [Plan(first_token_after=0.3)]),
        c: FakeReplica("c", [Plan(first_token_after=0.3)]),
    }

    async def main() -> None:
        guard = virtual_guard(fakes, [], tiers={"t": Tier(ttft=5.0, total=60.0, stall=5.0)})
        router = guard._replica_set.router
        async with guard, guard.http_client() as client:
            await stream_calls(client, 20)
            for _ in range(2):
                async with anyio.create_task_group() as group:
                    for _ in range(12):
                        group.start_soon(read_slowly, client, 1.0)
            assert not router.degraded(a)
            assert [s.health.tpot for s in router.states] == [0.0, 0.0, 0.0]
            before = fakes[a].requests
            await stream_calls(client, 10)
            assert fakes[a].requests - before == 10

    run_virtual(main, backend)


def one_slow_per_token(first_token: float, gap: float, slow_gap: float) -> dict[str, FakeReplica]:
    """Replicas a, b and c (``http://c.test``), the same first token, 20 tokens; c ``slow_gap`` s per token, the others
    ``gap``."""
    plan = {
        name: Plan(first_token_after=first_token, tokens=20, gap=slow_gap if name == "c" else gap) for name in "abc"
    }
    return {f"http://{name}.test": FakeReplica(name, [p]) for name, p in plan.items()}


@BACKENDS
def test_a_replica_slow_per_token_is_drained_through_a_guard(backend: str) -> None:
    """The same first token everywhere, one replica 100 ms per token against the others' 10 ms, callers reading at
    once: it is drained for its time per token."""
    slow = "http://c.test"
    fakes = one_slow_per_token(first_token=0.02, gap=0.01, slow_gap=0.1)

    async def main() -> None:
        guard = virtual_guard(fakes, [], tiers={"t": Tier(ttft=5.0, total=60.0, stall=5.0)}, hedge=None)
        router = guard._replica_set.router
        async with guard, guard.http_client() as client:
            await stream_calls(client, 12)
            assert router.degraded(slow)
            assert [s.health.tpot for s in router.states] == pytest.approx([0.01, 0.01, 0.1], abs=1e-6)

    run_virtual(main, backend)


@BACKENDS
def test_a_replica_drained_for_its_time_per_token_is_probed_once_in_probe_every_calls(backend: str) -> None:
    """The same first token everywhere; one replica 60 ms per token against the others' 3 ms; one caller's 40 calls
    in sequence, pausing 30 ms per chunk. The slow one is drained after its 3 samples; each probe of it is a whole
    answer at its pace, and one every 2 s (``probe_interval``) was a third of this caller's calls: 13 of 40, against
    3 before its time per token was measured without the caller's pauses (then 2x, not drained, costed away)."""
    slow = "http://c.test"
    fakes = one_slow_per_token(first_token=0.01, gap=0.003, slow_gap=0.06)

    async def main() -> None:
        guard = virtual_guard(fakes, [], tiers={"t": Tier(ttft=5.0, total=60.0, stall=5.0)})
        router = guard._replica_set.router
        async with guard, guard.http_client() as client:
            for _ in range(40):
                await read_slowly(client, 0.03)
            assert router.degraded(slow)
            assert fakes[slow].requests <= router.MIN_SAMPLES + 1  # its samples, then a probe in 50 calls at most

    run_virtual(main, backend)


def test_a_replica_slower_per_token_by_more_than_a_first_token_over_a_short_answer_is_drained() -> None:
    """Short answers are still judged per token: 3 tokens 200 ms apart where the others take 10 ms add 380 ms to
    a call whose first token takes 100 ms."""
    router, states = cluster()
    for _ in range(10):
        for state in states:
            router.first_token(state, NOW, 0.1)
            router.stream_finished(state, NOW, ok=True, tokens=3, duration=2 * 0.01)
    for _ in range(8):
        router.stream_finished(states[2], NOW, ok=True, tokens=3, duration=2 * 0.2)
    assert states[2].health.drained


@BACKENDS
def test_a_busy_client_reading_streams_late_keeps_both_replicas(backend: str) -> None:
    """A whole Guard over two identical replicas in virtual time, 400 calls 16 at a time, 3-token answers, first
    tokens after 80 ms; the client is busy a seventh of the time, and a call that finds it busy reads the rest of
    its stream 100 ms late (one pass of a busy event loop). Neither replica is drained and each answers its
    share; before, the late reads of 3-token streams drained one replica after the other."""
    fakes = {f"http://{n}.test": FakeReplica(n, [Plan(first_token_after=0.08, tokens=3)]) for n in "ab"}
    records: list[PhaseRecord] = []

    async def main() -> None:
        guard = virtual_guard(fakes, records, tiers={"t": Tier(ttft=5.0, total=10.0)})
        async with guard, guard.http_client() as client:
            limit = anyio.Semaphore(16)

            async def one() -> None:
                async with limit, client.stream("POST", CHAT, json=STREAMED) as response:
                    read_late = int(anyio.current_time() * 10) % 7 == 0  # the client is busy now
                    async for _ in response.aiter_raw():
                        if read_late:
                            await anyio.sleep(0.1)
                            read_late = False

            async with anyio.create_task_group() as tasks:
                for _ in range(400):
                    tasks.start_soon(one)
            assert guard._replica_set.router.epoch == 0  # nothing drained, ever

    run_virtual(main, backend)
    winners = Counter(a.replica for r in records for a in r.attempts if a.outcome == "won")
    assert min(winners.values()) >= 160, winners


def test_a_replica_3x_slower_is_not_drained_only_costed() -> None:
    router, states = cluster()
    warm(router, states, [FAST, FAST, 3 * FAST], tpot=0.01)
    for _ in range(30):
        router.stream_finished(states[2], NOW, ok=True, tokens=21, duration=20 * 0.03)
    assert not states[2].health.drained
    states[0].in_flight = states[1].in_flight = 4  # 5 x 0.18 s against 1 x 0.54 s
    assert router.pick(NOW, states) is states[2]


def test_no_replica_is_drained_for_speed_while_one_signals_overload() -> None:
    """Under overload, queues make replicas slow by turns: that is load, not a degraded replica."""
    router, states = cluster()
    warm(router, states, [FAST, FAST, FAST])
    states[2].cooling_until = NOW + 3  # a 429 with Retry-After
    for _ in range(6):
        router.first_token(states[1], NOW, SLOW)
    assert not states[1].health.drained
    router.first_token(states[1], NOW + 3, SLOW)  # the cool-down is over: now it is a slow replica
    assert states[1].health.drained
    states[0].cooling_until = NOW + 10
    router.stream_finished(states[0], NOW + 3, ok=False, tokens=3, duration=0.1)
    router.stream_finished(states[0], NOW + 3, ok=False, tokens=3, duration=0.1)
    assert router.max_drained == 1 and not states[0].health.drained  # failures still count, but one at most


def test_one_straggler_does_not_drain_a_healthy_replica() -> None:
    router, states = cluster()
    warm(router, states, [FAST, FAST, FAST])
    router.first_token(states[0], NOW, 2.0)  # a 2 s stall: clipped to 4x the estimate
    assert states[0].health.ttft == pytest.approx(FAST * 1.6)
    router.first_token(states[0], NOW, 2.0)  # even two in a row
    assert not states[0].health.drained


def with_r1_drained(**kwargs: Any) -> tuple[Router[Fake], list[Fake]]:
    """Three replicas, r1 drained for speed at ``NOW`` (``kwargs``: the router's)."""
    router, states = cluster(**kwargs)
    r0, r1, r2 = states
    warm(router, [r0, r2], [FAST, FAST])
    for _ in range(5):
        router.first_token(r1, NOW, SLOW)
    assert r1.health.drained
    return router, states


def test_a_drained_replica_gets_one_probe_per_probe_every_calls_and_interval() -> None:
    router, states = with_r1_drained(probe_every=10, probe_interval=1.0)
    r1 = states[1]
    assert "r1" not in picks(router, states, 30, now=NOW + 0.4)  # the first probe waits half a second
    assert picks(router, states, 30, now=NOW + 0.5)["r1"] == 1  # one probe, then a wait twice as long
    assert "r1" not in picks(router, states, 30, now=NOW + 1.4)
    assert picks(router, states, 30, now=NOW + 1.5)["r1"] == 1  # 1 s later: probe_interval, the most it waits
    assert "r1" not in picks(router, states, 30, now=NOW + 2.4)
    now, probes = NOW + 2.5, 0
    for _ in range(100):  # 10 s of calls at 10 per second: one probe per 10 calls at most
        now += 0.1
        probes += router.pick(now, states) is r1
    assert 9 <= probes <= 10


def test_a_drained_replica_is_probed_on_time_when_few_calls_come() -> None:
    """One call a second against one probe in `probe_every` (10) calls: the probes still come when they are due,
    up to one per ``probe_interval``, not one per 10 s (a replica back from a restart waited ~50 s at the default)."""
    router, states = with_r1_drained(probe_every=10, probe_interval=2.0)
    probed = [t for t in range(1, 11) if router.pick(NOW + t, states) is states[1]]
    assert probed == [1, 3, 5, 7, 9]


def test_hedges_sent_to_a_drained_replica_do_not_put_its_probe_off() -> None:
    """In a cluster of two the drained replica is where every hedge goes; hedges that lose before their request is
    written teach nothing, and they came often enough to keep its first probe away for good."""
    router, states = cluster(n=2, probe_every=10, probe_interval=1.0)
    r0, r1 = states
    warm(router, [r0], [FAST])
    for _ in range(5):
        router.first_token(r1, NOW, SLOW)
    assert r1.health.drained
    now, probes = NOW, 0
    for _ in range(40):  # 2 s of calls at 20 a second, each hedged to the drained replica
        now += 0.05
        probes += router.pick(now, states) is r1
        assert router.pick_hedge(now, [r1]) is r1
    assert probes >= 2  # after 0.5 s, then 1 s after that, as without hedges


def test_a_drained_replica_that_recovers_is_brought_back() -> None:
    router, states = cluster()
    r1 = states[1]
    warm(router, states, [FAST, FAST, FAST])
    for _ in range(5):
        router.first_token(r1, NOW, SLOW)
    assert r1.health.drained
    router.first_token(r1, NOW + 1, FAST)  # a probe in time: its first token is the estimate at once
    assert not r1.health.drained
    assert (r1.health.ttft, r1.health.tpot) == (None, None)  # measured afresh from here
    assert "r1" in picks(router, states, 6, now=NOW + 20)


def test_a_replica_drained_for_its_time_per_token_is_probed_once_in_probe_every_calls_however_few_come() -> None:
    """Its probe is a whole answer at its pace: one call a second gets one in ``probe_every`` (10), not one every
    ``probe_interval`` (2 s); a probe whose time per token is in time brings it back at once, as a first token in
    time does."""
    router, states = cluster(probe_every=10, probe_interval=2.0)
    r1 = states[1]
    warm(router, states, [FAST, FAST, FAST], tpot=0.01)
    for _ in range(8):
        router.stream_finished(r1, NOW, ok=True, tokens=21, duration=20 * 0.2)
    assert r1.health.drained
    probed = [t for t in range(1, 31) if router.pick(NOW + t, states) is r1]
    assert probed == [10, 20, 30]  # a call a second: one in 10, where one every 2 s came before
    router.first_token(r1, NOW + 30, FAST)  # its first token in time: its time per token still keeps it drained
    assert r1.health.drained
    router.stream_finished(r1, NOW + 31, ok=True, tokens=21, duration=20 * 0.01)
    assert not r1.health.drained


def test_a_replica_the_costs_keep_away_is_judged_when_the_others_are_measured() -> None:
    """It gets no calls of its own to be judged by: the others' events reassess it too."""
    router, states = cluster()
    for _ in range(router.MIN_SAMPLES):
        router.stream_finished(states[0], NOW, ok=True, tokens=21, duration=20 * 0.05)  # 50 ms per token
    assert not states[0].health.drained  # nothing to compare with yet
    for state in states[1:]:
        router.stream_finished(state, NOW, ok=True, tokens=21, duration=20 * 0.01)
    assert states[0].health.drained


def test_no_more_than_a_minority_is_drained() -> None:
    router, states = cluster(3)
    warm(router, states, [FAST, FAST, FAST])
    for state in states[1:]:
        for _ in range(6):
            router.first_token(state, NOW, SLOW)
    assert [s.health.drained for s in states] == [False, True, False]
    assert cluster(1)[0].max_drained == 0
    assert cluster(2)[0].max_drained == 1 and cluster(5)[0].max_drained == 2


def test_when_every_candidate_is_drained_the_least_cost_one_still_gets_the_call() -> None:
    router, states = cluster()
    warm(router, states, [FAST, FAST, FAST])
    for _ in range(5):
        router.first_token(states[1], NOW, SLOW)
    assert router.pick(NOW, [states[1]]) is states[1]
    assert router.pick_ready(NOW, [states[1]]) is states[1]
    assert router.pick(NOW, []) is None


def test_a_replica_whose_server_reports_a_queue_ranks_after_those_that_report_none() -> None:
    router, states = cluster()
    r0, r1, r2 = states
    r1.in_flight = r2.in_flight = 5  # the guard's own calls: r0 is by far the least loaded
    router.server_load(r0, NOW, waiting=1.0, kv_usage=0.5, fresh_for=0.6)
    assert picks(router, states, 4) == {"r1": 2, "r2": 2}  # a new call would wait behind r0's queue
    router.server_load(r1, NOW, waiting=1.0, kv_usage=None, fresh_for=0.6)
    router.server_load(r2, NOW, waiting=1.0, kv_usage=None, fresh_for=0.6)
    assert router.pick(NOW, states) is r0  # every server queues: the cost decides
    router.server_load(r1, NOW, waiting=0.0, kv_usage=None, fresh_for=0.6)
    assert router.pick(NOW, states) is r1
    assert router.pick(NOW + 0.7, states) is r0  # the reports are stale: only the guard's own calls count


def test_a_hedge_goes_where_no_server_reports_a_queue_before_it_goes_to_the_best_ttft() -> None:
    router, (_, r1, r2) = cluster()
    router.first_token(r1, NOW, 0.01)
    router.first_token(r2, NOW, 0.05)
    assert router.pick_hedge(NOW, [r1, r2]) is r1
    router.server_load(r1, NOW, waiting=2.0, kv_usage=None, fresh_for=0.6)
    assert router.pick_hedge(NOW, [r1, r2]) is r2


def test_a_watcher_that_fails_is_logged_and_the_others_are_still_told(caplog: pytest.LogCaptureFixture) -> None:
    router, (r0, r1, _) = cluster()
    told: list[str] = []

    def failing() -> None:
        raise RuntimeError("boom")

    router.watch_queue(r0, failing)
    router.watch_queue(r0, lambda: told.append("r0"))
    router.server_load(r1, NOW, waiting=0.0, kv_usage=None, fresh_for=0.6)
    router.server_load(r0, NOW, waiting=router.HEDGE_QUEUE, kv_usage=None, fresh_for=0.6)  # raises nothing
    assert told == ["r0"]
    assert "a call told of r0's queue failed to act on it" in caplog.text


def test_retries_and_hedges_go_to_healthy_replicas_first() -> None:
    router, states = cluster()
    r0, r1, r2 = states
    warm(router, states, [FAST, FAST, FAST])
    for _ in range(5):
        router.first_token(r1, NOW, SLOW)
    r0.in_flight = r2.in_flight = 5
    assert router.pick_ready(NOW, [r1, r2]) is r2
    assert router.pick_hedge(NOW, [r1, r2]) is r2


def test_pick_hedge_prefers_the_best_ttft_and_tries_an_unknown_replica() -> None:
    router, states = cluster()
    r0, r1, r2 = states
    router.first_token(r0, NOW, 0.05)
    router.first_token(r1, NOW, 0.03)
    assert router.pick_hedge(NOW, [r0, r1]) is r1
    assert router.pick_hedge(NOW, states) is r2  # never tried: counts as 0


def test_a_replica_that_goes_silent_loses_new_calls_before_any_sample_arrives() -> None:
    router, states = cluster(2)
    r0, r1 = states
    warm(router, states, [FAST, FAST], tpot=0.0)
    assert router.pick(NOW, states) is r0  # turns: r0 now has a call in flight
    r0.in_flight = 1
    assert router.pick(NOW + 0.01, states) is r1
    r1.in_flight = 1
    router.first_token(r1, NOW + 0.03, FAST)  # r1 answers; r0 stays silent
    assert r1.health.unanswered_since is None and r0.health.unanswered_since == NOW
    # 300 ms with a call in flight and no first token from r0: costed as 2 x 300 ms, r1 as 2 x 20 ms
    assert router.pick(NOW + 0.3, states) is r1
    router.answered(r1, NOW)  # a non-streaming win also ends the silence
    assert r1.health.unanswered_since is None
    router.first_token(r0, NOW + 0.31, 0.31)  # its first token came: a real sample now
    assert r0.health.unanswered_since is None
    r0.in_flight = 0
    assert r0.health.ttft == pytest.approx(FAST + 0.2 * (4 * FAST - FAST))  # clipped to 4x


def test_a_replica_queueing_its_calls_ranks_after_every_replica_answering() -> None:
    """Streams long against TTFT (the stream time dominates the cost) and r0 with fewer calls in flight: by cost
    alone r0 would still win while silent. Silent for 3x its TTFT and 0.1 s more, it is queueing them (another
    client's burst): new calls go to the replicas answering, and back once it answers again."""
    router, states = cluster(3)
    r0, r1, r2 = states
    warm(router, states, [FAST, FAST, FAST], tpot=0.01)
    r1.in_flight = r2.in_flight = 3
    assert router.pick(NOW, states) is r0
    r0.in_flight = 1
    assert router.pick(NOW + 0.1, states) is r0  # silent 100 ms: not past 20 ms + 0.1 s yet, and still cheapest
    r0.in_flight = 2
    assert {router.pick(NOW + 0.13, states).name for _ in range(4)} == {"r1", "r2"}  # type: ignore[union-attr]
    router.first_token(r0, NOW + 0.6, 0.6)  # its queue drained: answering again
    assert router.pick(NOW + 0.6, states) is r0


def test_when_every_replica_is_queueing_the_least_cost_one_still_gets_the_call() -> None:
    router, states = cluster(2)
    warm(router, states, [FAST, FAST], tpot=0.01)
    for state in states:
        router.pick(NOW, [state])
    states[0].in_flight, states[1].in_flight = 1, 4
    assert router.pick(NOW + 0.5, states) is states[0]


def test_a_lost_race_raises_the_ttft_estimate_but_never_lowers_it() -> None:
    router, states = cluster()
    r0 = states[0]
    for _ in range(router.MIN_SAMPLES):
        router.first_token(r0, NOW, 0.1)
    router.outran(r0, NOW, 0.05)  # lost after 50 ms: says nothing new
    assert r0.health.ttft == pytest.approx(0.1)
    router.outran(r0, NOW, 0.3)
    assert r0.health.ttft == pytest.approx(0.1 + 0.2 * (0.3 - 0.1))


def test_a_fresh_replica_whose_calls_keep_losing_races_is_judged_by_them() -> None:
    """r1 has never answered; each of its calls lost its hedge race after 515 ms (the warm-up hedge delay and
    r0's TTFT), against r0's 20 ms. Each loss is evidence above the median replica's TTFT it was costed with, so
    it counts as a sample: after `MIN_SAMPLES` of them r1 is drained, not left "unknown" and taking its turns."""
    router, states = cluster(2)
    r0, r1 = states
    warm(router, [r0], [FAST])
    for lost in range(router.MIN_SAMPLES):
        assert not r1.health.drained, lost
        router.outran(r1, NOW + lost, 0.515)
    assert r1.health.drained and r1.health.ttft == pytest.approx(0.515)
    assert picks(router, states, 20, NOW + 3)["r1"] == 1  # its probe, not its turns


def test_a_race_lost_faster_than_the_median_replica_answers_is_no_sample() -> None:
    """A hedge that lost 10 ms after it was sent says nothing of its replica's speed: no sample, still unknown."""
    router, states = cluster(2)
    r0, r1 = states
    warm(router, [r0], [FAST])
    router.outran(r1, NOW, 0.01)
    assert r1.health.ttft is None and not r1.health.ttft_first


@BACKENDS
def test_a_fresh_guard_stops_sending_calls_to_a_replica_whose_calls_lose_every_race(backend: str) -> None:
    """Two replicas through a whole Guard, hedging on (warm-up delay 0.5 s), in virtual time: b has a long queue
    (its first token after 6 s), a answers in 15 ms. Each call sent to b is hedged to a and loses the race.
    Before, b stayed "unknown" (costed as the median replica) and took every other call until the hedge budget
    refused one, which then waited 6 s for b; now b takes `MIN_SAMPLES` calls, is drained, and no call waits."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(first_token_after=0.015)]),
        "http://b.test": FakeReplica("b", [Plan(first_token_after=6.0)]),
    }
    records: list[PhaseRecord] = []

    async def main() -> None:
        guard = virtual_guard(fakes, records, tiers={"t": Tier(ttft=10.0, total=20.0)})
        async with guard, guard.http_client() as client:
            await stream_calls(client, 16)
            assert guard._replica_set.router.degraded("http://b.test")

    run_virtual(main, backend)
    sent_to_b = [r for r in records if r.attempts[0].replica == "http://b.test"]
    assert len(sent_to_b) == Router.MIN_SAMPLES
    assert all(r.attempts[0].outcome == "lost" for r in sent_to_b)
    assert all(a.replica == "http://a.test" for r in records for a in r.attempts if a.outcome == "won")


@BACKENDS
def test_one_callers_calls_go_back_to_a_replica_healed_from_a_short_outage(backend: str) -> None:
    """Two replicas through a whole Guard in virtual time, one call every 0.5 s: b refuses three connections (an
    outage; each call is retried on a at once), then serves again. b gets a call again within the probe interval
    of its last one, and about half of them from then on; before, none for the ~45 s its failures took to fade."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(first_token_after=0.02)]),
        "http://b.test": FakeReplica(
            "b", [Plan(first_token_after=0.02), *[Plan(refused=True)] * 3, Plan(first_token_after=0.02)]
        ),
    }
    records: list[PhaseRecord] = []

    async def main() -> None:
        guard = virtual_guard(fakes, records, hedge=None)
        async with guard, guard.http_client() as client:
            for _ in range(40):
                async with client.stream("POST", CHAT, json=STREAMED) as response:
                    await response.aread()
                await anyio.sleep(0.5)

    run_virtual(main, backend)
    to_b = [i for i, r in enumerate(records) if r.attempts[0].replica == "http://b.test"]
    refused = [i for i in to_b if r_status(records[i]) is None]
    assert len(refused) == 3 and all(records[i].status == "ok" for i in refused)
    after = [i for i in to_b if i > refused[-1]]
    assert after and after[0] - refused[-1] <= 5  # within ~2 s of calls every 0.5 s
    assert len(after) >= (len(records) - refused[-1]) // 3


def r_status(record: PhaseRecord) -> int | None:
    """The first attempt's status (None: it got no answer)."""
    return record.attempts[0].status_code


# --- mid-stream failures -----------------------------------------------------------------------------------


def test_mid_stream_failures_count_and_drain_a_replica_that_keeps_breaking_streams() -> None:
    router, states = cluster()
    r0 = states[0]
    warm(router, states, [FAST, FAST, FAST])
    router.stream_finished(r0, NOW, ok=False, tokens=3, duration=0.02)
    assert r0.health.failure == pytest.approx(0.3)  # counts three times: the caller saw it
    router.stream_finished(r0, NOW, ok=None, tokens=3, duration=0.02)  # the caller left: not a failure either way
    assert r0.health.failure == pytest.approx(0.3)
    router.failed(states[1], NOW)  # before the first token: retried or hedged away, counts once
    assert states[1].health.failure == pytest.approx(0.1)
    assert not r0.health.drained  # one broken stream is not a pattern
    router.stream_finished(r0, NOW, ok=False, tokens=3, duration=0.02)  # 0.3 + 0.1 x (3 - 0.3) = 0.57
    assert r0.health.failure >= router.DRAIN_FAILURE and r0.health.drained


# --- rejections (401, 403, 404) ---------------------------------------------------------------------


def served_or_rejected(router: Router[Fake], states: list[Fake], rejecting: Fake, n: int, now: float = NOW) -> int:
    """``n`` calls in sequence: ``rejecting`` answers 404 at once, the others serve. Returns the rejections."""
    rejections = 0
    for _ in range(n):
        chosen = router.pick(now, states)
        assert chosen is not None
        if chosen is rejecting:
            router.rejected(chosen, now, 404)
            rejections += 1
        else:
            router.first_token(chosen, now, FAST)
    return rejections


def test_a_replica_rejecting_what_the_others_serve_is_drained_after_three_in_a_row(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 404 answered at once keeps a replica at 0 calls in flight, the cheapest: it takes its turns until its
    third rejection in a row drains it, then probes only (counted three times, its rate is 0.76 by then)."""
    caplog.set_level("WARNING", logger="llmguard_client")
    router, states = cluster()
    r2 = states[2]
    warm(router, states, [FAST, FAST, FAST])
    assert served_or_rejected(router, states, r2, 6) == 2  # its turns, one in three
    assert not r2.health.drained and r2.health.rejected_in_a_row == 2
    assert served_or_rejected(router, states, r2, 100) == 1  # the third: drained, and no probe due yet
    assert r2.health.drained
    assert served_or_rejected(router, states, r2, 100, now=NOW + 1) == 1  # probes only: its first after 0.5 s
    [line] = [r.getMessage() for r in caplog.records if "drained" in r.getMessage()]
    assert "replica r2 answers 404 to what the others serve" in line and "median replica's 0.00" in line
    assert "drained for rejecting" in line


def test_a_drained_rejecting_replica_that_serves_a_probe_is_brought_back() -> None:
    router, states = cluster()
    r2 = states[2]
    warm(router, states, [FAST, FAST, FAST])
    for _ in range(router.REJECTIONS_IN_A_ROW):
        router.rejected(r2, NOW, 401)
    assert r2.health.drained
    router.first_token(r2, NOW + 1, FAST)  # its key was fixed: a success decays the rate at the drained weight
    assert not r2.health.drained and r2.health.rejection < router.RECOVER_FAILURE
    assert "r2" in picks(router, states, 6, now=NOW + 20)


def test_replicas_that_all_reject_alike_are_chosen_as_if_none_did() -> None:
    """The caller's own fault (a bad key, a wrong model name): every replica rejects, so none is drained and the
    rejections change no choice, however high the rates."""
    router, states = cluster()
    r0, r1, r2 = states
    for _ in range(4):
        for state in states:
            router.rejected(state, NOW, 404)
    assert min(s.health.rejection for s in states) > router.DRAIN_FAILURE
    assert not any(s.health.drained for s in states)
    assert picks(router, states, 6) == {"r0": 2, "r1": 2, "r2": 2}
    r0.in_flight, r1.in_flight, r2.in_flight = 2, 0, 1
    assert router.pick(NOW, states) is r1


def test_a_replica_drained_for_rejecting_is_brought_back_once_the_others_reject_alike() -> None:
    router, states = cluster()
    r0, r1, r2 = states
    for _ in range(router.REJECTIONS_IN_A_ROW):
        router.rejected(r2, NOW, 404)
    assert r2.health.drained
    for _ in range(2):  # the model is gone everywhere now: the rejections are the caller's to fix
        router.rejected(r0, NOW, 404)
        router.rejected(r1, NOW, 404)
    assert r2.health.drained  # until its own next answer (its probe), though another rejection
    router.rejected(r2, NOW + 1, 404)
    assert not r2.health.drained
    assert not any(s.health.drained for s in states)


def test_a_healthy_replica_that_serves_between_a_tenants_rejections_is_not_drained() -> None:
    """A tenant's bad key, spread over healthy replicas: two of its calls in a row on one replica, with the others'
    rates low, raise its rate past the drain's, but the replica serves the calls between them: not drained."""
    router, states = cluster()
    r2 = states[2]
    warm(router, states, [FAST, FAST, FAST])
    for round_ in range(5):
        now = NOW + round_
        router.rejected(r2, now, 401)
        router.rejected(r2, now, 401)
        assert r2.health.rejection >= router.DRAIN_FAILURE or round_ == 0
        assert not r2.health.drained
        router.first_token(r2, now, FAST)  # another tenant's call, served


def test_rejections_weigh_in_no_cost() -> None:
    """A replica's rejections never keep calls away from it: a tenant's bad calls would then leave a healthy replica
    no other call to serve between them, and drain it (`Router.REJECTIONS_IN_A_ROW`)."""
    router, states = cluster(2)
    r0, r1 = states
    warm(router, states, [FAST, FAST])
    router.rejected(r0, NOW, 401)
    router.rejected(r0, NOW, 401)
    r1.in_flight = 1
    assert router.pick(NOW, states) is r0  # the less loaded, whatever it rejected


def _delivered(*events: bytes, ended: bool = True) -> Any:
    """A delivered win whose chat reader saw ``events`` (and the body's end, if ``ended``)."""
    reader = reader_for("POST", "/v1/chat/completions", "text/event-stream", True)
    for event in events:
        reader.feed(event)
    if ended:
        reader.end_of_body()
    return SimpleNamespace(reader=reader, attempt=SimpleNamespace(first_token=1.0), waited=0.5)


TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n'
STOP = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
DONE = b"data: [DONE]\n\n"


def test_stream_outcome_tells_complete_broken_truncated_and_abandoned_streams() -> None:
    good = _delivered(TOKEN, TOKEN, STOP, DONE)
    assert _stream_outcome("ok", None, good) == (True, 3, 0.5)  # the seconds its reads waited
    truncated = _delivered(TOKEN, TOKEN)  # the server closed cleanly, without a finish reason or [DONE]
    assert _stream_outcome("error", "stream_truncated", truncated)[0] is False
    assert _stream_outcome("error", "stream_error", good)[0] is False
    assert _stream_outcome("timeout", "stall_timeout", good)[0] is False
    assert _stream_outcome("abandoned", None, _delivered(TOKEN, ended=False))[0] is None
    assert _stream_outcome("abandoned", None, good)[0] is True  # closed after [DONE]
    assert _stream_outcome("error", "guard_closed", good) == (None, 3, 0.5)  # cut by Guard.aclose()
    body = SimpleNamespace(
        reader=reader_for("POST", "/v1/chat/completions", "application/json", False),
        attempt=SimpleNamespace(first_token=1.0),
        waited=0.0,
    )
    assert _stream_outcome("ok", None, body)[1:] == (None, None)  # non-streaming: no timing


def test_a_replica_without_room_ranks_last_until_its_reset() -> None:
    router, states = cluster(2)
    r0, r1 = states
    r1.in_flight = 10
    out = httpx.Headers({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "2s"})
    router.saw_headers(r0, NOW, out)
    assert r0.health.limited_until == NOW + 2.0
    assert router.pick(NOW + 1, states) is r1 and router.pick_ready(NOW + 1, states) is r1
    assert router.pick_hedge(NOW + 1, states) is r1
    assert router.pick(NOW + 1, [r0]) is r0  # still chosen when it is the only one
    assert router.pick(NOW + 2, states) is r0  # reset passed
    router.saw_headers(r0, NOW, out)
    router.saw_headers(r0, NOW + 0.5, httpx.Headers({"x-ratelimit-remaining-requests": "3"}))  # room again
    assert r0.health.limited_until == -math.inf
    router.saw_headers(r0, NOW, httpx.Headers({"content-type": "text/event-stream"}))  # says nothing
    assert r0.health.limited_until == -math.inf


def test_degradation_is_judged_against_succeeding_replicas_only(caplog: pytest.LogCaptureFixture) -> None:
    """A replica that answers its first token in 1 ms and then breaks every stream is no yardstick: the healthy
    replica (60 ms) is not called degraded against it; the breaking one is drained for its failures."""
    router, (breaking, healthy) = cluster(2)
    caplog.set_level("WARNING", logger="llmguard_client")
    for i in range(10):
        now = NOW + i
        router.first_token(breaking, now, 0.001)
        router.stream_finished(breaking, now, ok=False, tokens=3, duration=0.002)
        router.first_token(healthy, now, 0.060)
        router.stream_finished(healthy, now, ok=True, tokens=21, duration=0.2)
    assert breaking.health.drained and not healthy.health.drained
    drained = [r.getMessage() for r in caplog.records if "is degraded" in r.getMessage()]
    assert len(drained) == 1 and drained[0].startswith("llmguard: replica r0 is degraded"), drained


def sequential_calls(
    router: Router[Fake], states: list[Fake], start: float, end: float, gap: float, tpot: float = 0.01
) -> list[str]:
    """One call at a time every ``gap`` s from ``start`` to ``end``, each answered at once by whichever replica
    it went to (a first token in ``FAST``, 21 tokens at ``tpot``): the names of the replicas, in order."""
    chosen: list[str] = []
    now = start
    while now < end:
        state = router.pick(now, states)
        assert state is not None
        router.first_token(state, now, FAST)
        router.stream_finished(state, now, ok=True, tokens=21, duration=20 * tpot)
        chosen.append(state.name)
        now += gap
    return chosen


def test_a_replica_kept_from_calls_by_an_old_outage_is_probed_and_takes_its_share_again() -> None:
    """r1 failed three calls and lost two races in a partition of a few seconds, then healed. One caller, one call
    every 0.5 s: the failure rate fading alone kept r1 from every call for ~45 s (its cost 3.7x r0's at first),
    so nothing measured that it was back. Now a replica the costs kept from every first attempt for
    ``probe_interval`` gets one as a probe, whose outcome counts as fast as a drained replica's probe's: r1 is
    probed within 2 s and shares the calls again within seconds."""
    router, states = cluster(2)
    r1 = states[1]
    warm(router, states, [FAST, FAST])
    for i in range(3):
        router.failed(r1, NOW + i)
    router.outran(r1, NOW + 3, 3.0)
    router.outran(r1, NOW + 3.5, 3.0)
    assert not r1.health.drained
    chosen = sequential_calls(router, states, NOW + 4, NOW + 30, 0.5)
    first_r1 = chosen.index("r1")
    assert first_r1 * 0.5 <= router.probe_interval + 0.5  # probed within the probe interval
    later = chosen[len(chosen) // 2 :]  # from 17 s on
    assert later.count("r1") >= len(later) // 3  # its share again


def test_a_replica_measured_slower_is_not_probed_for_being_left_out() -> None:
    """A replica whose own first tokens (not failures nor lost races) make it 3x slower than the other, not
    enough to drain it, keeps no share of one caller's sequential calls, as before: its estimate is a
    measurement."""
    router, states = cluster(2)
    warm(router, states, [FAST, 3 * FAST], tpot=0.001)
    chosen = sequential_calls(router, states, NOW + 1, NOW + 20, 0.5, tpot=0.001)
    assert not states[1].health.drained
    assert chosen.count("r1") == 0
