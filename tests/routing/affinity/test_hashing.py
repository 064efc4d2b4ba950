"""Rendezvous ordering with bounded load, and the key derived from a chat body (`_routing.affinity.hashing`)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmguard_client._routing.affinity.hashing import affinity_order, auto_key, choose, load_bound, place

REPLICAS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000", "http://10.0.0.4:8000"]
_PRINT_ORDERS = (
    "import json, sys; from llmguard_client._routing.affinity.hashing import affinity_order; "
    "print(json.dumps([affinity_order(k, json.loads(sys.argv[2])) for k in json.loads(sys.argv[1])]))"
)


def test_the_same_key_gives_the_same_order_in_separate_processes() -> None:
    keys = [f"conversation-{i}" for i in range(50)]
    orders = []
    for hash_seed in ("1", "2"):  # str hashing differs between the two interpreters
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", _PRINT_ORDERS, json.dumps(keys), json.dumps(REPLICAS)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
            cwd=os.getcwd(),
        ).stdout
        orders.append(json.loads(out))
    assert orders[0] == orders[1] == [affinity_order(k, REPLICAS) for k in keys]
    assert all(sorted(order) == sorted(REPLICAS) for order in orders[0])
    assert len({order[0] for order in orders[0]}) == len(REPLICAS)  # the keys spread over every replica


def test_the_order_does_not_depend_on_how_replicas_are_listed() -> None:
    assert affinity_order("k", REPLICAS) == affinity_order("k", list(reversed(REPLICAS)))
    long_key = "x" * 500  # past blake2b's 64-byte key limit: hashed down first, still stable
    assert affinity_order(long_key, REPLICAS) == affinity_order(long_key, list(reversed(REPLICAS)))
    with pytest.raises(TypeError, match="affinity key must be a str"):
        affinity_order(b"k", REPLICAS)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.text(min_size=1, max_size=20), min_size=50, max_size=300, unique=True),
    n=st.integers(min_value=2, max_value=8),
    gone=st.integers(min_value=0, max_value=7),
)
def test_removing_a_replica_moves_only_the_keys_that_preferred_it(keys: list[str], n: int, gone: int) -> None:
    replicas = [f"http://replica-{i}:8000" for i in range(n)]
    removed = replicas[gone % n]
    rest = [r for r in replicas if r != removed]
    for key in keys:
        before, after = affinity_order(key, replicas), affinity_order(key, rest)
        assert after == [r for r in before if r != removed]  # the survivors keep their relative order
        if before[0] != removed:
            assert after[0] == before[0]
        else:
            assert after[0] == before[1]


def test_a_refused_first_choice_spills_to_the_next_and_all_refused_gives_none() -> None:
    order = affinity_order("key", REPLICAS)
    assert choose(order, {}, refused=set()) == order[0]
    assert choose(order, {}, refused={order[0]}) == order[1]
    assert choose(order, {}, refused={order[0], order[1]}) == order[2]
    assert choose(order, {}, refused=set(REPLICAS)) is None


def test_an_overloaded_first_choice_spills_under_the_bound() -> None:
    order = ["a", "b", "c"]
    assert load_bound({"a": 4, "b": 0, "c": 0}, 3, 1.25) == math.ceil(1.25 * 5 / 3)  # 3
    assert choose(order, {"a": 2, "b": 0, "c": 0}, set()) == "b"  # 2 + 1 > ceil(1.25 * 3 / 3) = 2: spill
    assert choose(order, {"a": 1, "b": 1, "c": 0}, set()) == "a"  # 1 + 1 <= ceil(1.25 * 3 / 3) = 2
    assert choose(order, {"a": 3, "b": 0, "c": 0}, set()) == "b"


def test_a_hot_key_never_pushes_a_replica_past_the_bound() -> None:
    replicas = REPLICAS[:3]
    order = affinity_order("one hot conversation", replicas)
    load: Counter[str] = Counter()
    for _ in range(200):  # 200 calls in flight at once, none finished
        chosen = choose(order, load, refused=set())
        assert chosen is not None
        load[chosen] += 1
        assert max(load.values()) <= math.ceil(1.25 * load.total() / 3)  # the bound once placed
    bound = math.ceil(1.25 * 200 / 3)
    assert load.total() == 200 and max(load.values()) <= bound  # 84, where plain affinity would put 200 on one
    assert load[order[0]] == max(load.values())  # the preferred replica still takes the most


def test_when_refusals_leave_only_full_replicas_the_least_loaded_is_taken() -> None:
    order = ["a", "b", "c"]
    assert choose(order, {"a": 0, "b": 9, "c": 5}, refused={"a"}) == "c"


def test_a_bad_c_is_refused() -> None:
    for c in (0.5, math.inf, math.nan):
        with pytest.raises(ValueError, match="c must be a finite number >= 1"):
            choose(["a"], {}, set(), c=c)


def _chat(*messages: tuple[str, object]) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": r, "content": c} for r, c in messages]}).encode()


def test_auto_key_is_a_stable_hash_of_the_system_prompt_and_first_user_message() -> None:
    secret = "You are the assistant of ACME's payroll team. Employee 4471 earns 93,000."
    first = _chat(("system", secret), ("user", "What is my salary?"))
    later = _chat(("system", secret), ("user", "What is my salary?"), ("assistant", "93,000"), ("user", "Thanks"))
    key = auto_key(first)
    assert key is not None and key == auto_key(later)  # every turn of a conversation shares the key
    assert len(key) == 32 and all(ch in "0123456789abcdef" for ch in key)
    assert "ACME" not in key and "4471" not in key and "salary" not in key
    assert auto_key(_chat(("system", secret), ("user", "Another question"))) != key
    assert auto_key(_chat(("system", secret + "!"), ("user", "What is my salary?"))) != key
    parts = [{"type": "text", "text": secret}]
    assert auto_key(_chat(("system", parts), ("user", "What is my salary?"))) == key  # content parts too
    assert auto_key(_chat(("user", "hi"))) == auto_key(_chat(("user", "hi"))) is not None


@pytest.mark.parametrize(
    "body",
    [
        *(b"", b"not json", b"[]", b'{"prompt": "hi"}', b'{"messages": "hi"}', _chat(("assistant", "hi"))),
        *(_chat(("user", "")), _chat(("system", None), ("user", 3))),
    ],
)
def test_auto_key_is_none_when_there_is_nothing_to_key_on(body: bytes) -> None:
    assert auto_key(body) is None


def test_the_slack_lets_a_replica_hold_that_many_calls_over_the_bound() -> None:
    order = ["a", "b", "c"]
    load = {"a": 2}
    assert load_bound(load, 3, 1.25) == 2 and load_bound(load, 3, 1.25, slack=2) == 4
    assert choose(order, load, ()) == "b"
    assert choose(order, load, (), slack=2) == "a"
    with pytest.raises(ValueError, match="slack must be an int >= 0"):
        choose(order, load, (), slack=-1)


def test_place_takes_the_first_replica_within_c_times_the_mean_of_recent_calls() -> None:
    order = ["a", "b", "c"]
    assert place(order, {"a": 10.0, "b": 10.0, "c": 10.0}) == "a"
    assert place(order, {"a": 20.0, "b": 10.0, "c": 10.0}) == "b"  # 21 > 1.25 x 41 / 3 = 17.1
    assert place(order, {"a": 20.0, "b": 10.0, "c": 10.0}, slack=4) == "a"  # 21 <= 21.1
    assert place(order, {}) == "a"  # nothing sent yet: least loaded, first in order on ties
    assert place([], {}) is None


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=8), min_size=30, max_size=300, unique=True))
def test_placing_keys_keeps_every_replicas_share_within_the_bound_place_guarantees(keys: list[str]) -> None:
    # `place` admits a replica while its recent calls, with this one, stay within c x (the total + 1) / n, where a
    # replica with fewer than mean / c counts as having that many (the floor). The floored total is at most the
    # total x (1 + (n - 1) / (n c)), so every share stays within (c + (n - 1) / n) x the mean, plus one. Without
    # the floor it would be c x the mean; a random search found 22 of 49 keys on one replica (1.35x the mean).
    n, c = 3, 1.25
    replicas = [f"http://r{i}:8000" for i in range(n)]
    recent = dict.fromkeys(replicas, 0.0)
    for key in keys:
        recent[place(affinity_order(key, replicas), recent, c) or ""] += 1
    assert max(recent.values()) <= (c + (n - 1) / n) * len(keys) / n + 1


def test_a_replica_with_few_recent_calls_takes_new_keys_in_their_order_not_all_of_them() -> None:
    # b was drained for a while: it gets the keys that rank it first, not every new key until it caught up.
    assert place(["a", "b", "c"], {"a": 20.0, "b": 0.0, "c": 20.0}) == "a"
    assert place(["b", "a", "c"], {"a": 20.0, "b": 0.0, "c": 20.0}) == "b"
