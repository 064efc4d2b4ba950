"""Cache affinity in the replica set: a keyed call's replica follows the key's rendezvous order, health first,
within the load bound (`llmguard_client._routing.affinity.routing`). Every test injects ``now``; nothing sleeps."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from llmguard_client import Guard, GuardConfigError
from llmguard_client._routing.affinity.hashing import affinity_order, auto_key
from llmguard_client._routing.affinity.routing import AffinityRouting, ignored_session
from llmguard_client._routing.replicas import ReplicaSet, ReplicaState
from llmguard_client.config import AffinityPolicy, Replica

NOW = 1000.0
URLS = [f"http://r{i}:8000" for i in range(3)]


def replica_set(urls: list[str] = URLS, policy: AffinityPolicy | None = None) -> ReplicaSet:
    replicas = [Replica(u) for u in urls]
    return ReplicaSet(
        replicas, lambda r: httpx.MockTransport(lambda q: httpx.Response(200)), affinity=policy or AffinityPolicy()
    )


def by_name(rs: ReplicaSet, name: str) -> ReplicaState:
    return next(s for s in rs.states if s.name == name)


def first_pick(rs: ReplicaSet, key: str) -> str:
    state = rs.pick(NOW, key=key)
    assert state is not None
    return state.name


def even_pick(urls: list[str], key: str) -> str:
    """A new key's first pick while the replicas' recent calls are even (none yet): its rendezvous order."""
    return first_pick(replica_set(urls), key)


def test_the_same_key_picks_the_same_replica_in_separate_sets_and_keys_spread() -> None:
    keys = [f"conversation-{i}" for i in range(60)]
    picks = [even_pick(URLS, k) for k in keys]
    reordered = list(reversed(URLS))  # another process, the replicas listed differently
    assert picks == [even_pick(reordered, k) for k in keys] == [affinity_order(k, URLS)[0] for k in keys]
    assert set(picks) == set(URLS)


def test_removing_a_replica_moves_only_the_keys_that_preferred_it() -> None:
    keys = [f"k{i}" for i in range(200)]
    moved = [k for k in keys if even_pick(URLS, k) != even_pick(URLS[:2], k)]
    assert moved, "some keys preferred the removed replica"
    assert all(even_pick(URLS, k) == URLS[2] for k in moved)
    assert sum(even_pick(URLS, k) == URLS[2] for k in keys) == len(moved)


def test_a_new_key_is_placed_off_a_replica_over_its_share_of_recent_calls_and_a_known_key_stays_home() -> None:
    rs = replica_set()
    first, second, _ = affinity_order("new", URLS)
    for state, recent in zip(rs.states, (10.0, 10.0, 10.0), strict=True):
        state.health.recent, state.health.last_pick = recent, NOW
    assert first_pick(rs, "new") == first  # shares even: the key's order decides
    busy = by_name(rs, first)
    busy.health.recent = 40.0  # 40 + 1 > 1.25 x (61 + 1) / 3 + 2 = 27.8
    assert first_pick(rs, "new") == second  # a first call misses everywhere: placing it elsewhere is free
    rs.served("old", busy)
    assert first_pick(rs, "old") == first  # a key with a home stays there: its prefix is cached there
    assert rs.expected_hit("old", busy) and not rs.expected_hit("old", by_name(rs, second))
    assert rs.expected_hit("new", busy) is False and rs.expected_hit(None, busy) is None


def test_a_key_follows_the_replica_that_answered_it_last() -> None:
    rs = replica_set()
    first, second, _ = affinity_order("k", URLS)
    assert rs.served("k", by_name(rs, second)) is False  # its first answer: not expected to hit
    assert first_pick(rs, "k") == second  # it spilled (a hedge won there): that replica has the longest prefix
    assert rs.served("k", by_name(rs, second)) is True
    hedge = rs.pick_hedge(NOW, [by_name(rs, second)], key="k")
    assert hedge is not None and hedge.name == first  # a hedge goes to the key's next replica in order


@pytest.mark.parametrize("why", ["cooling", "open", "degraded", "no_room", "straggling"])
def test_a_refused_first_choice_spills_to_the_keys_next_replica(why: str) -> None:
    rs = replica_set()
    first, second, _ = affinity_order("k", URLS)
    for other in rs.states:
        other.in_flight = 1  # an even load: the bound does not decide
    state = by_name(rs, first)
    assert first_pick(rs, "k") == first
    if why == "cooling":
        rs.cool_down(state, NOW, 5.0)
    elif why == "open":
        state.open_until = NOW + 5.0
    elif why == "degraded":
        state.health.drained = True
        rs.router._drained = 1
        rs.router._since_probe = -(10**6)  # no probe due: the drained replica would get one otherwise
    elif why == "no_room":
        state.health.limited_until = NOW + 5.0
    else:  # calls in flight and no first token for 3x its TTFT and 0.1 s more
        state.health.ttft, state.health.unanswered_since = 0.05, NOW - 0.5
    assert first_pick(rs, "k") == second
    rs.cool_down(by_name(rs, second), NOW, 5.0)  # the next one refused too: the third
    assert first_pick(rs, "k") == affinity_order("k", URLS)[2]


def test_a_replica_answering_within_its_ttft_is_not_a_straggler() -> None:
    rs = replica_set()
    first = affinity_order("k", URLS)[0]
    state = by_name(rs, first)
    for other in rs.states:
        other.in_flight = 1  # an even load: the bound does not decide
    state.health.ttft, state.health.unanswered_since = 0.05, NOW - 0.1
    assert first_pick(rs, "k") == first


def test_a_hedge_and_a_retry_go_to_the_keys_next_replica() -> None:
    rs = replica_set()
    first, second, third = affinity_order("k", URLS)
    primary = by_name(rs, first)
    hedge = rs.pick_hedge(NOW, [primary], key="k")
    assert hedge is not None and hedge.name == second
    retry = rs.pick_ready(NOW, [primary, hedge], key="k")
    assert retry is not None and retry.name == third
    # Unkeyed, the hedge follows the router's rule instead (the best TTFT): here the third replica.
    by_name(rs, second).health.ttft, by_name(rs, third).health.ttft = 0.5, 0.1
    unkeyed = rs.pick_hedge(NOW, [primary])
    assert unkeyed is not None and unkeyed.name == third


def test_the_load_bound_spills_a_hot_key_and_keeps_every_replica_within_it() -> None:
    rs = replica_set(policy=AffinityPolicy(load_factor=1.25, load_slack=2))
    rs.served("hot", by_name(rs, affinity_order("hot", URLS)[0]))  # its home: the key's first replica
    for _ in range(200):  # one key, 200 calls that all stay in flight
        state = rs.pick(NOW, key="hot")
        assert state is not None
        state.in_flight += 1
    loads = {s.name: s.in_flight for s in rs.states}
    assert max(loads.values()) <= math.ceil(1.25 * 200 / 3) + 2  # ceil(c x total / n) + slack
    assert max(loads, key=lambda n: loads[n]) == affinity_order("hot", URLS)[0]


def test_when_every_replica_is_refused_the_router_chooses() -> None:
    rs = replica_set()
    for state in rs.states:
        rs.cool_down(state, NOW, 5.0)
    assert rs.pick(NOW, key="k") is not None  # a cooling replica only loses ties in the router


def test_keys_come_from_the_header_then_the_session_then_the_body() -> None:
    routing = AffinityRouting(URLS, AffinityPolicy())
    body = json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}).encode()
    assert routing.key_for(None, body) == auto_key(body)
    with routing.session("conv-1"):
        assert routing.key_for(None, body) == "conv-1"
        assert routing.key_for("from-header", body) == "from-header"
    assert routing.key_for(None, b"not json") is None
    assert routing.key_for(None, body, json.loads(body)) == auto_key(body)  # a body the caller parsed already
    assert routing.key_for(None, b"{}", json.loads(body)) == auto_key(body)  # is read as parsed, not again
    explicit = AffinityRouting(URLS, AffinityPolicy(auto=False))
    assert explicit.key_for(None, body) is None
    with pytest.raises(GuardConfigError, match=r"guard\.session needs a non-empty str"), routing.session(""):
        pass
    with pytest.raises(GuardConfigError, match=r"non-empty str.*got 3"), ignored_session(3):  # type: ignore[arg-type]
        pass


def test_the_slack_keeps_a_lightly_loaded_key_at_home_but_not_a_key_without_one() -> None:
    first = affinity_order("k", URLS)[0]
    for slack, expected in ((0, False), (2, True)):
        rs = replica_set(policy=AffinityPolicy(load_slack=slack))
        rs.served("k", by_name(rs, first))  # its home: the key's first replica
        by_name(rs, first).in_flight = 2  # 2 calls in flight, all on the key's replica
        assert (first_pick(rs, "k") == first) is expected
    rs = replica_set(policy=AffinityPolicy(load_slack=2))
    by_name(rs, first).in_flight = 2
    assert first_pick(rs, "k") != first  # a new key: nothing cached anywhere, so no slack


@pytest.mark.parametrize("affinity", ["explicit", None])
@pytest.mark.parametrize("key", [None, 1, ""], ids=["none", "int", "empty"])
def test_a_bad_session_key_is_the_same_error_as_a_bad_rollout_key(affinity: str | None, key: object) -> None:
    """``guard.session(None)`` raised a plain TypeError where ``guard.rollout_key(None)`` raises GuardConfigError."""
    guard = Guard(["http://10.0.0.1:8000"], affinity=affinity, instrumentation=None)  # type: ignore[arg-type]
    with pytest.raises(GuardConfigError, match=r"guard\.session needs a non-empty str") as info:
        with guard.session(key):  # type: ignore[arg-type]
            pass
    assert repr(key) in str(info.value)
    with pytest.raises(GuardConfigError, match="rollout_key needs a non-empty str or int"):
        with guard.rollout_key(None):  # type: ignore[arg-type]
            pass
