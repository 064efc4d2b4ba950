"""ReplicaSet routing and health: least cost (load first, when nothing else is known) in turns,
cool-downs, circuits, hedge targets.

Every test injects ``now``; nothing here sleeps.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections import Counter

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmguard_client._routing.caller import calling_as
from llmguard_client._routing.replicas import ReplicaSet, ReplicaState
from llmguard_client._routing.router import Router
from llmguard_client.config import Replica

NOW = 1000.0


def replica_set(n: int = 3) -> ReplicaSet:
    replicas = [Replica(f"http://r{i}:8000") for i in range(n)]
    return ReplicaSet(replicas, lambda r: httpx.MockTransport(lambda q: httpx.Response(200)))


def names(states: list[ReplicaState | None]) -> list[str | None]:
    return [s.name.removeprefix("http://").removesuffix(":8000") if s is not None else None for s in states]


# --- pick: a call's first attempt -----------------------------------------------------------


def test_pick_round_robins_among_equally_loaded_replicas() -> None:
    rs = replica_set(3)
    assert names([rs.pick(NOW) for _ in range(6)]) == ["r0", "r1", "r2", "r0", "r1", "r2"]


def test_pick_prefers_the_least_loaded_replica() -> None:
    rs = replica_set(3)
    r0, r1, r2 = rs.states
    r0.in_flight, r1.in_flight, r2.in_flight = 3, 1, 2
    assert {rs.pick(NOW) is r1 for _ in range(6)} == {True}


def test_pick_follows_the_load_as_it_changes() -> None:
    rs = replica_set(2)
    for _ in range(6):  # each pick stays in flight: the load evens out across both replicas
        state = rs.pick(NOW)
        assert state is not None
        state.in_flight += 1
    assert [s.in_flight for s in rs.states] == [3, 3]


def test_pick_round_robins_among_equals_when_another_replica_is_busier() -> None:
    rs = replica_set(3)
    rs.states[0].in_flight = 1
    counts = Counter(names([rs.pick(NOW) for _ in range(6)]))
    assert counts == {"r1": 3, "r2": 3}


def test_pick_avoids_cooling_replicas_while_others_are_ready() -> None:
    rs = replica_set(3)
    r0, r1, _ = rs.states
    rs.cool_down(r0, NOW, 10.0)
    rs.cool_down(r1, NOW, 10.0)
    picks = [rs.pick(NOW + 0.5) for _ in range(6)]  # before their first probes
    assert set(names(picks)) == {"r2"}


def test_when_every_replica_is_cooling_the_router_spreads_the_calls_by_load() -> None:
    """Every replica cooling is overload of them all: the rule steps aside, and no replica gets every call."""
    rs = replica_set(3)
    r0, r1, r2 = rs.states
    rs.cool_down(r0, NOW, 9.0)
    rs.cool_down(r1, NOW, 3.0)
    rs.cool_down(r2, NOW, 6.0)
    r1.in_flight = 5
    picks = names([rs.pick(NOW + 1) for _ in range(4)])
    assert "r1" not in picks and set(picks) == {"r0", "r2"}


def test_cooling_replicas_that_free_together_share_the_calls() -> None:
    rs = replica_set(2)
    for state in rs.states:
        rs.cool_down(state, NOW, 5.0)
    assert sorted(names([rs.pick(NOW + 1) for _ in range(4)])) == ["r0", "r0", "r1", "r1"]


def test_cooling_is_a_wall_while_another_replica_is_ready() -> None:
    """A cooling replica with fewer calls in flight still loses to a busier ready one."""
    rs = replica_set(2)
    r0, r1 = rs.states
    rs.cool_down(r0, NOW, 5.0)
    r1.in_flight = 30
    assert {rs.pick(NOW + 0.1) is r1 for _ in range(5)} == {True}


def test_a_cool_down_is_probed_after_a_second_then_twice_as_long_after_each_probe_refused() -> None:
    rs = replica_set(2)
    r0, _ = rs.states
    rs.cool_down(r0, NOW, 120.0)
    assert names([rs.pick(NOW + 0.9) for _ in range(3)]) == ["r1", "r1", "r1"]
    assert names([rs.pick(NOW + 1.0) for _ in range(3)]) == ["r0", "r1", "r1"]  # the probe, then the wall
    assert r0.probing and r0.cooling(NOW + 1.0)
    rs.cool_down(r0, NOW + 1.1, 120.0)  # the probe was refused too: renewed, its next probe 2 s later
    assert names([rs.pick(NOW + 3.0) for _ in range(2)]) == ["r1", "r1"]
    assert names([rs.pick(NOW + 3.1) for _ in range(2)]) == ["r0", "r1"]
    rs.cool_down(r0, NOW + 3.2, 5.0)  # refused with a shorter Retry-After than is left: its next probe 4 s later
    assert r0.cooling_until == pytest.approx(NOW + 121.1) and r0.probe_at == pytest.approx(NOW + 7.2)
    assert rs.pick(NOW + 7.2) is r0
    rs.succeeded(r0, 0.05, NOW + 7.3)  # served: the cool-down is over, and the next one starts over
    rs.cool_down(r0, NOW + 8.0, 1.0)
    assert r0.probe_at == pytest.approx(NOW + 8.5)  # at most half of the cool-down in


def test_a_probe_that_never_reached_the_replica_is_due_again_at_once() -> None:
    """Its connection failed in this process (out of file descriptors): the replica said nothing, so its cool-down
    goes on, and the next call probes it at once, not once the probing call has ended (a stream read elsewhere)."""
    rs = replica_set(2)
    r0, _ = rs.states
    rs.cool_down(r0, NOW, 120.0)
    assert rs.pick(NOW + 1.0) is r0 and r0.probing
    assert rs.pick(NOW + 1.0) is not r0  # one probe in flight at a time
    rs.probe_unsent(r0)
    assert r0.cooling(NOW + 1.1) and not r0.probing
    assert rs.pick(NOW + 1.1) is r0


def test_a_probe_that_wins_ends_the_cool_down() -> None:
    rs = replica_set(2)
    r0, _ = rs.states
    rs.cool_down(r0, NOW, 4.0)
    assert rs.pick(NOW + 2.0) is r0
    rs.succeeded(r0, 0.05, NOW + 2.1)
    assert not r0.cooling(NOW + 2.1) and not r0.probing
    assert sorted(names([rs.pick(NOW + 2.2) for _ in range(4)])) == ["r0", "r0", "r1", "r1"]


def test_a_call_that_started_before_the_cool_down_does_not_end_it() -> None:
    rs = replica_set(2)
    r0, _ = rs.states
    rs.cool_down(r0, NOW, 4.0)
    rs.succeeded(r0, 0.05, NOW + 0.5)  # admitted before the 429: no probe of this cool-down
    assert r0.cooling(NOW + 0.5)


def test_pick_skips_open_circuits_and_the_one_replica_left_cooling_waits_for_its_probe() -> None:
    rs = replica_set(2)
    r0, r1 = rs.states
    r0.open_until = NOW + 20
    rs.cool_down(r1, NOW, 30.0)
    assert rs.first_wait(NOW) == pytest.approx(1.0)  # nowhere else to go: its first probe
    assert rs.pick(NOW) is None
    assert rs.pick(NOW + 1.0) is r1 and r1.probing
    assert rs.first_wait(NOW + 1.0) == pytest.approx(29.0)  # one probe at a time: its answer, or the end
    assert rs.pick(NOW + 1.0) is None


def test_pick_returns_none_when_every_circuit_is_open_without_panic_mode() -> None:
    rs = replica_set(2)
    rs.panic_threshold = 0.0
    for state in rs.states:
        state.open_until = NOW + 5
    assert rs.pick(NOW) is None
    assert rs.all_open(NOW)
    assert rs.pick(NOW + 5) is not None  # the circuits closed
    assert not rs.all_open(NOW + 5)


def test_a_cornered_call_takes_an_open_circuit_when_no_replica_it_may_use_has_a_closed_one() -> None:
    """A call only some replicas can serve (a stored object's, `llmguard_client._routing.reach`) is sent there
    even with their circuits open, as with one replica; while one of them has a closed circuit, it goes there."""
    rs = replica_set(5)
    r0, r1, *others = rs.states
    r0.open_until = r1.open_until = NOW + 5  # 3 of 5 healthy: no panic
    assert rs.pick(NOW, exclude=(r1, *others)) is None
    assert rs.pick(NOW, exclude=(r1, *others), cornered=True) is r0
    assert rs.pick(NOW, exclude=others, cornered=True) in (r0, r1)
    r1.open_until = 0.0
    assert [rs.pick(NOW, exclude=others, cornered=True) for _ in range(3)] == [r1] * 3
    assert not rs.panic(NOW)


def test_in_panic_mode_open_circuits_still_take_calls_ranked_last(caplog: pytest.LogCaptureFixture) -> None:
    rs = replica_set(3)
    r0, r1, r2 = rs.states
    r0.open_until = r1.open_until = NOW + 5  # 1 of 3 healthy: under the 50 % threshold
    with caplog.at_level("INFO", logger="llmguard_client"):
        assert rs.panic(NOW)
        assert {rs.pick(NOW) for _ in range(4)} == {r2}  # the healthy one first
        assert rs.pick(NOW, exclude=[r2]) in (r0, r1)  # then the open ones, where a plain client would go
        assert rs.pick_ready(NOW, exclude=[r2]) in (r0, r1)
        assert rs.pick_hedge(NOW, exclude=[r2]) is None  # never a hedge to an open circuit
        assert not rs.panic(NOW + 5)
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "panic mode:" in m]) == 1
    assert len([m for m in messages if "panic mode over" in m]) == 1


def test_one_outage_of_the_only_replica_logs_one_panic_start_and_one_end(caplog: pytest.LogCaptureFixture) -> None:
    """The only replica's circuit opens, and each time its cool-down ends its probe fails again, until one is
    served: one outage, so panic mode is logged starting once and ending once, when a call is served (a half-open
    circuit is not a healthy replica)."""
    rs = replica_set(1)
    (r0,) = rs.states
    caplog.set_level(logging.INFO, logger="llmguard_client")
    for _ in range(3):
        rs.failed(r0, NOW, threshold=3, cooldown=5.0)
    for probe in (5.0, 10.0):
        assert rs.pick(NOW + probe - 1.0) is r0 and rs.panic(NOW + probe - 1.0)  # open: panic mode
        assert rs.pick(NOW + probe) is r0  # half-open: its probe, the same outage
        assert rs.failed(r0, NOW + probe, threshold=3, cooldown=5.0)
    assert rs.pick(NOW + 15.0) is r0
    rs.succeeded(r0, ttft=0.1, now=NOW + 15.0)
    assert rs.pick(NOW + 15.1) is r0 and not rs.panic(NOW + 15.1)
    said = [r.getMessage() for r in caplog.records]
    assert sum("panic mode:" in m for m in said) == 1
    assert sum("panic mode over" in m for m in said) == 1
    assert said[-1] == "llmguard: panic mode over: 1 of 1 replica(s) healthy"


def test_a_single_replica_with_an_open_circuit_still_takes_calls() -> None:
    rs = replica_set(1)
    (r0,) = rs.states
    for _ in range(5):
        rs.failed(r0, NOW, threshold=5, cooldown=5.0)
    assert r0.open(NOW + 1)
    assert rs.pick(NOW + 1) is r0 and rs.pick_ready(NOW + 1) is r0
    assert rs.cooling_wait(NOW + 1) == 0.0


def test_below_the_threshold_without_open_circuits_there_is_no_panic() -> None:
    rs = replica_set(2)
    assert not rs.panic(NOW)
    rs.states[0].open_until = NOW + 5  # 1 of 2 healthy: 50 % is not under 50 %
    assert not rs.panic(NOW)
    assert rs.pick(NOW, exclude=[rs.states[1]]) is None


def test_pick_never_returns_an_excluded_replica() -> None:
    rs = replica_set(3)
    r0, _, r2 = rs.states
    assert set(names([rs.pick(NOW, exclude=[r0, r2]) for _ in range(5)])) == {"r1"}
    assert rs.pick(NOW, exclude=rs.states) is None


def test_pick_ranks_a_recently_failed_replica_last_until_the_failure_fades() -> None:
    """Within the probe interval of its last call the failed replica takes none; it is probed after it (the
    router's test of left-out replicas), and shares the calls again once the failure has faded."""
    rs = replica_set(2)
    r0, _ = rs.states
    assert rs.pick(NOW, exclude=[rs.states[1]]) is r0
    rs.failed(r0, NOW, threshold=5, cooldown=5.0)
    assert set(names([rs.pick(NOW + 1) for _ in range(4)])) == {"r1"}
    later = NOW + 4 * rs.router.FAILURE_HALF_LIFE  # 0.1 / 16 is below FAILURE_FORGOTTEN
    assert set(names([rs.pick(later) for _ in range(4)])) == {"r0", "r1"}


# --- pick_ready: retries ---------------------------------------------------------------------------


def test_pick_ready_refuses_cooling_replicas() -> None:
    rs = replica_set(2)
    r0, r1 = rs.states
    rs.cool_down(r0, NOW, 5.0)
    assert set(names([rs.pick_ready(NOW) for _ in range(4)])) == {"r1"}
    rs.cool_down(r1, NOW, 5.0)
    assert rs.pick_ready(NOW) is None  # unlike pick, never a cooling replica
    assert rs.pick(NOW) is not None


def test_pick_ready_refuses_open_circuits() -> None:
    rs = replica_set(2)
    rs.panic_threshold = 0.0
    r0, r1 = rs.states
    r1.open_until = NOW + 1
    assert set(names([rs.pick_ready(NOW) for _ in range(4)])) == {"r0"}
    r0.open_until = NOW + 1
    assert rs.pick_ready(NOW) is None
    assert rs.pick_ready(NOW + 1) is not None


def test_pick_ready_honours_exclude_and_load() -> None:
    rs = replica_set(3)
    r0, r1, r2 = rs.states
    r1.in_flight = 4
    assert rs.pick_ready(NOW, exclude=[r0]) is r2
    assert rs.pick_ready(NOW, exclude=[r0, r2]) is r1
    assert rs.pick_ready(NOW, exclude=[r0, r1, r2]) is None


def test_a_cool_down_ends_at_its_time() -> None:
    rs = replica_set(1)
    (r0,) = rs.states
    rs.cool_down(r0, NOW, 2.0)
    assert r0.cooling(NOW + 1.99) and rs.pick_ready(NOW + 1.99) is None
    assert not r0.cooling(NOW + 2.0) and rs.pick_ready(NOW + 2.0) is r0


def test_a_cool_down_is_never_shortened() -> None:
    rs = replica_set(1)
    (r0,) = rs.states
    rs.cool_down(r0, NOW, 10.0)
    rs.cool_down(r0, NOW + 1, 1.0)
    assert r0.cooling_until == NOW + 10.0
    rs.cool_down(r0, NOW + 5, 10.0)
    assert r0.cooling_until == NOW + 15.0


# --- pick_hedge ------------------------------------------------------------------------------------------


def test_pick_hedge_prefers_the_best_ttft_ewma() -> None:
    rs = replica_set(3)
    r0, r1, r2 = rs.states
    r0.health.ttft, r1.health.ttft, r2.health.ttft = 0.5, 0.9, 0.2
    assert rs.pick_hedge(NOW, exclude=[]) is r2
    assert rs.pick_hedge(NOW, exclude=[r2]) is r0
    assert rs.pick_hedge(NOW, exclude=[r2, r0]) is r1


def test_pick_hedge_breaks_ttft_ties_by_load() -> None:
    rs = replica_set(3)
    for state, load in zip(rs.states, (3, 1, 2), strict=True):
        state.health.ttft = 0.3
        state.in_flight = load
    assert rs.pick_hedge(NOW, exclude=[]) is rs.states[1]


def test_pick_hedge_refuses_cooling_and_open_replicas() -> None:
    rs = replica_set(3)
    r0, r1, r2 = rs.states
    r1.health.ttft, r2.health.ttft = 0.01, 0.02
    rs.cool_down(r1, NOW, 5.0)
    r2.open_until = NOW + 5
    assert rs.pick_hedge(NOW, exclude=[r0]) is None
    assert rs.pick_hedge(NOW + 5, exclude=[r0]) is r1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.floats(0.0, 10.0)), min_size=1, max_size=5),
    st.data(),
)
def test_pick_hedge_never_returns_an_excluded_replica(ewmas: list[float | None], data: st.DataObject) -> None:
    rs = replica_set(len(ewmas))
    for state, ewma in zip(rs.states, ewmas, strict=True):
        state.health.ttft = ewma
        state.in_flight = data.draw(st.integers(0, 3))
    excluded = data.draw(st.lists(st.sampled_from(rs.states), unique_by=id))
    picked = rs.pick_hedge(NOW, exclude=excluded)
    if len(excluded) == len(rs.states):
        assert picked is None
    else:
        assert picked is not None and all(picked is not e for e in excluded)
        gone = {id(e) for e in excluded}
        known = [s.ttft_ewma for s in rs.states if id(s) not in gone and s.ttft_ewma is not None]
        if picked.ttft_ewma is not None and known:
            assert picked.ttft_ewma == min(known)


# --- circuits --------------------------------------------------------------------------------------------


def test_circuit_opens_after_n_consecutive_failures() -> None:
    rs = replica_set(2)
    r0, r1 = rs.states
    opened = [rs.failed(r0, NOW + i * 0.1, threshold=3, cooldown=5.0) for i in range(3)]
    assert opened == [False, False, True]
    assert r0.open(NOW + 0.2)
    assert r0.open_until == pytest.approx(NOW + 0.2 + 5.0)
    assert set(names([rs.pick(NOW + 1) for _ in range(4)])) == {"r1"}
    assert rs.pick_ready(NOW + 1, exclude=[r1]) is None


def test_a_circuit_episode_is_logged_once_when_it_opens_and_once_when_it_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rs = replica_set(2)
    r0, _ = rs.states
    caplog.set_level(logging.INFO, logger="llmguard_client")
    for _ in range(3):
        rs.failed(r0, NOW, threshold=3, cooldown=5.0)
    assert rs.failed(r0, NOW + 5.0, threshold=3, cooldown=5.0)  # its probe failed: open again, nothing new to say
    rs.succeeded(r0, ttft=0.1, now=NOW + 10.0)  # the next probe answered
    rs.succeeded(r0, ttft=0.1, now=NOW + 10.1)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [
        (
            "WARNING",
            "llmguard: replica http://r0:8000 failed 3 calls in a row; its circuit is open: no new calls for 5s, "
            "then a probe (until one succeeds)",
        ),
        ("INFO", "llmguard: replica http://r0:8000 answered again; its circuit is closed"),
    ]


def test_circuit_closes_after_its_cool_down() -> None:
    rs = replica_set(2)
    r0, _ = rs.states
    for _ in range(3):
        rs.failed(r0, NOW, threshold=3, cooldown=5.0)
    assert r0.open(NOW + 4.99)
    assert not r0.open(NOW + 5.0)
    later = NOW + 5.0 + 4 * rs.router.FAILURE_HALF_LIFE  # the failures have faded
    assert "r0" in names([rs.pick(later) for _ in range(4)])
    assert rs.pick_ready(later, exclude=[rs.states[1]]) is r0


def test_a_success_resets_the_failure_count() -> None:
    rs = replica_set(1)
    (r0,) = rs.states
    rs.failed(r0, NOW, threshold=3, cooldown=5.0)
    rs.failed(r0, NOW, threshold=3, cooldown=5.0)
    rs.succeeded(r0, ttft=None)
    assert rs.failed(r0, NOW, threshold=3, cooldown=5.0) is False
    assert rs.failed(r0, NOW, threshold=3, cooldown=5.0) is False
    assert not r0.open(NOW)
    assert rs.failed(r0, NOW, threshold=3, cooldown=5.0) is True


def test_a_success_closes_an_open_circuit() -> None:
    rs = replica_set(1)
    (r0,) = rs.states
    assert rs.failed(r0, NOW, threshold=1, cooldown=60.0)
    rs.succeeded(r0, ttft=0.1)
    assert not r0.open(NOW)


def test_failures_while_open_do_not_extend_the_cool_down() -> None:
    rs = replica_set(1)
    (r0,) = rs.states
    assert rs.failed(r0, NOW, threshold=1, cooldown=5.0)
    assert rs.failed(r0, NOW + 2, threshold=1, cooldown=5.0) is False
    assert r0.open_until == NOW + 5.0


def test_ttft_estimate_is_the_median_of_the_first_samples_then_an_ewma() -> None:
    rs = replica_set(1)
    (r0,) = rs.states
    for ttft, estimate in ((1.0, 1.0), (3.0, 1.0), (2.0, 2.0)):  # the lower median of the first three
        rs.succeeded(r0, ttft=ttft)
        assert r0.ttft_ewma == estimate
    rs.succeeded(r0, ttft=3.0)
    assert r0.ttft_ewma == pytest.approx(0.8 * 2.0 + 0.2 * 3.0)
    rs.succeeded(r0, ttft=None)
    assert r0.ttft_ewma == pytest.approx(2.2)


# --- waiting for a replica ----------------------------------------------------------------------------------


def test_cooling_wait_is_zero_while_a_replica_is_ready() -> None:
    rs = replica_set(2)
    rs.cool_down(rs.states[0], NOW, 5.0)
    assert rs.cooling_wait(NOW) == 0.0


def test_cooling_wait_is_the_time_to_the_first_recovery() -> None:
    rs = replica_set(3)
    for state, seconds in zip(rs.states, (4.0, 1.5, 3.0), strict=True):
        rs.cool_down(state, NOW, seconds)
    assert rs.cooling_wait(NOW) == pytest.approx(1.5)
    assert rs.cooling_wait(NOW + 1.0) == pytest.approx(0.5)
    assert rs.cooling_wait(NOW + 2.0) == 0.0


def test_cooling_wait_ignores_open_circuits() -> None:
    rs = replica_set(3)
    r0, r1, r2 = rs.states
    rs.cool_down(r0, NOW, 1.0)
    r0.open_until = NOW + 60
    rs.cool_down(r1, NOW, 4.0)
    rs.cool_down(r2, NOW, 6.0)
    assert rs.cooling_wait(NOW) == pytest.approx(4.0)


def test_cooling_wait_with_one_replica_left_is_the_time_to_its_probe() -> None:
    rs = replica_set(2)
    r0, r1 = rs.states
    r0.open_until = NOW + 60
    rs.cool_down(r1, NOW, 4.0)
    assert rs.cooling_wait(NOW) == pytest.approx(1.0)  # its first probe
    assert rs.cooling_left(NOW) == pytest.approx(4.0)


def test_cooling_wait_is_none_when_every_circuit_is_open_without_panic_mode() -> None:
    rs = replica_set(2)
    rs.panic_threshold = 0.0
    for state in rs.states:
        state.open_until = NOW + 1
    assert rs.cooling_wait(NOW) is None
    assert rs.cooling_wait(NOW + 1) == 0.0


def test_any_cooling() -> None:
    rs = replica_set(2)
    assert not rs.any_cooling(NOW)
    rs.cool_down(rs.states[1], NOW, 1.0)
    assert rs.any_cooling(NOW + 0.5)
    assert not rs.any_cooling(NOW + 1.0)


def test_one_transport_per_replica_and_bases_without_trailing_slash() -> None:
    made: list[Replica] = []

    def factory(replica: Replica) -> httpx.AsyncBaseTransport:
        made.append(replica)
        return httpx.MockTransport(lambda q: httpx.Response(200))

    replicas = [Replica("http://a:1/v1/"), Replica("http://b:2")]
    rs = ReplicaSet(replicas, factory)
    assert made == replicas and len(rs) == 2
    assert [str(s.base) for s in rs.states] == ["http://a:1/v1", "http://b:2"]
    assert len({id(s.transport) for s in rs.states}) == 2


async def test_aclose_closes_every_transport() -> None:
    closed: list[str] = []

    class Transport(httpx.AsyncBaseTransport):
        def __init__(self, name: str) -> None:
            self.name = name

        async def aclose(self) -> None:
            closed.append(self.name)

    rs = ReplicaSet([Replica("http://a:1"), Replica("http://b:1")], lambda r: Transport(r.name))
    await rs.aclose()
    assert closed == ["http://a:1", "http://b:1"]


def test_round_robin_covers_every_replica_over_many_rounds() -> None:
    rs = replica_set(3)
    counts = Counter(names([rs.pick(NOW) for _ in itertools.repeat(None, 300)]))
    assert counts == {"r0": 100, "r1": 100, "r2": 100}


def test_above_three_replicas_two_drawn_at_random_share_the_calls_evenly() -> None:
    replicas = [Replica(f"http://r{i}:8000") for i in range(4)]
    rs = ReplicaSet(
        replicas,
        lambda r: httpx.MockTransport(lambda q: httpx.Response(200)),
        router=lambda states: Router(states, rng=random.Random(7)),
    )
    counts = Counter(names([rs.pick(NOW) for _ in itertools.repeat(None, 400)]))
    assert set(counts) == {"r0", "r1", "r2", "r3"}
    assert all(70 <= n <= 130 for n in counts.values()), counts


def test_a_key_answered_leaves_a_cool_down_held_for_several_keys_and_the_others_keep_theirs() -> None:
    """Two keys' 429s in one cool-down: a call of one of them answered (its limit free again) no longer waits for
    it, while the other key's calls wait for their own end (they were held to the end of the latest)."""
    rs = replica_set(1)
    state = rs.states[0]
    with calling_as("a"):
        rs.cool_down(state, NOW, 20.0, holder="a")
    with calling_as("b"):
        rs.cool_down(state, NOW + 1, 5.0, holder="b")
        assert state.cooling(NOW + 2) and state.cooling_end() == NOW + 6
    with calling_as("a"):
        assert state.cooling_end() == NOW + 20
        rs.answered(state)
        assert not state.cooling(NOW + 2)
    with calling_as("b"):
        assert state.cooling(NOW + 2) and state.cooling_end() == NOW + 6
    with calling_as("c"):
        assert not state.cooling(NOW + 2)


def test_a_keys_429_again_lengthens_its_own_end_only_in_a_cool_down_held_for_several_keys() -> None:
    """A run of two keys' 429s cools the replica for both; one of them refused again for 20 s (its limit, a quota's
    day) lengthens its own end, not the other's: that key waited 15 s past its own limit (the plain SDK none)."""
    rs = replica_set(1)
    state = rs.states[0]
    with calling_as("a"):
        rs.cool_down(state, NOW, 2.0, holder="a,b")
        rs.cool_down(state, NOW + 1, 20.0, holder="a,b")
        assert state.cooling_end() == NOW + 21
    with calling_as("b"):
        assert state.cooling_end() == NOW + 2 and not state.cooling(NOW + 2.5)


def test_a_key_leaving_a_cool_down_takes_its_end_with_it_and_a_later_key_gets_a_cool_down_of_its_own() -> None:
    """Three keys in one cool-down, the first out of quota: its call answered (one sent before its limit was hit),
    the cool-down ends with the last of the others; once theirs have passed, a new key's 429 starts a cool-down of
    its own (it was held to the first key's end, 110 s where the plain SDK waited 16 s, then refused at once as if
    out of quota)."""
    rs = replica_set(1)
    state = rs.states[0]
    for key, at, seconds, asked in (("a", 0.0, 120.0, 86400.0), ("b", 1.0, 5.0, None), ("c", 1.5, 6.0, None)):
        with calling_as(key):
            rs.cool_down(state, NOW + at, seconds, asked, holder=key)
    with calling_as("a"):
        rs.answered(state)
    assert state.cooling_until == NOW + 7.5
    with calling_as("d"):
        rs.cool_down(state, NOW + 10, 16.0, holder="d")
        assert state.cooling_end() == NOW + 26
        assert rs.asked_beyond(NOW + 11) == 0.0


class Told:
    """A fleet that records the cool-downs it is told of."""

    def __init__(self) -> None:
        self.told: list[tuple[float, str | None]] = []

    def cooled(self, state: ReplicaState, seconds: float, holder: str | None) -> None:
        self.told.append((seconds, holder))

    def opened(self, state: ReplicaState, seconds: float) -> None: ...

    def cleared(self, state: ReplicaState) -> None: ...

    def closed(self, state: ReplicaState) -> None: ...


def test_the_fleet_is_told_of_a_renewal_by_one_key_of_a_cool_down_held_for_several_as_that_keys() -> None:
    """Two keys' run of 429s cools the replica for both; one of them refused again for 20 s: the fleet is told of
    that key's 20 s alone (told of both keys', the other processes held the other key 19 s past its own end)."""
    rs = replica_set(1)
    told = Told()
    rs.shared = told
    state = rs.states[0]
    with calling_as("a"):
        rs.cool_down(state, NOW, 2.0, holder="a,b")
        rs.cool_down(state, NOW + 1, 20.0, holder="a,b")
    assert told.told == [(2.0, "a,b"), (20.0, "a")]


def test_a_key_back_in_a_cool_down_held_for_another_key_is_probed_within_a_second() -> None:
    """A key refused again after its own end passed, while another key's cool-down goes on with its probes refused
    (the next one 5 s away): it is probed a second in, as in a cool-down of its own (its call waited 4.5 s for the
    other key's probe where the plain SDK's was served at once)."""
    rs = replica_set(1)
    state = rs.states[0]
    with calling_as("a"):
        rs.cool_down(state, NOW, 30.0, holder="a")
        for at in (NOW + 1, NOW + 3):  # the first key's probes, refused again
            rs.take_probe(state, at)
            rs.cool_down(state, at, 30.0, holder="a")
    with calling_as("b"):
        rs.cool_down(state, NOW + 3.5, 3.0, holder="b")
    with calling_as("a"):
        rs.take_probe(state, NOW + 4.5)
        rs.cool_down(state, NOW + 4.5, 30.0, holder="a")
    assert state.probe_at > NOW + 9
    with calling_as("b"):
        rs.cool_down(state, NOW + 7.3, 15.0, holder="b")
        assert state.cooling(NOW + 7.5) and state.probe_at == NOW + 8.3
