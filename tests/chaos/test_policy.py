"""`Chaos`: validated when built, refused without ``LLMGUARD_CHAOS=1``, and its draws seeded."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest

from llmguard_client import Chaos, Guard, GuardConfigError, Replica
from llmguard_client._chaos import CHAOS_ENV, ChaosSwitch, ChaosTransport, chaos_enabled

URLS = ["http://a.test", "http://b.test"]


@pytest.fixture
def chaos_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CHAOS_ENV, "1")


@pytest.mark.parametrize("value", [None, "", "0", "false", "off", "enabled", "1 please"])
def test_chaos_is_refused_without_the_switch_and_the_error_names_it(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv(CHAOS_ENV, raising=False)
    else:
        monkeypatch.setenv(CHAOS_ENV, value)
    with pytest.raises(GuardConfigError, match=CHAOS_ENV):
        Guard(URLS, instrumentation=None, chaos=Chaos(rate_limited=0.1))


def test_without_the_switch_a_guard_wraps_nothing_and_set_chaos_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CHAOS_ENV, raising=False)
    guard = Guard(URLS, instrumentation=None)
    assert not any(isinstance(s.transport, ChaosTransport) for s in guard._replica_set.states)
    guard.set_chaos(None)  # switching off is always allowed
    with pytest.raises(GuardConfigError, match=CHAOS_ENV):
        guard.set_chaos(Chaos(reset=1.0))
    monkeypatch.setenv(CHAOS_ENV, "1")  # set after the Guard was built: still refused, it has nothing to inject with
    with pytest.raises(GuardConfigError, match=CHAOS_ENV):
        guard.set_chaos(Chaos(reset=1.0))
    assert guard.chaos is None


def test_a_guard_built_with_the_switch_takes_a_policy_later_though_the_variable_is_gone(
    monkeypatch: pytest.MonkeyPatch, chaos_on: None
) -> None:
    """The variable is read when the Guard is built: a Guard outliving the test that set it (a session fixture,
    `monkeypatch.setenv` undone) still takes a policy (it used to be refused, the variable read again)."""
    guard = Guard(URLS, instrumentation=None)
    assert guard.chaos is None and all(isinstance(s.transport, ChaosTransport) for s in guard._replica_set.states)
    policy = Chaos(stall=0.5)
    guard.set_chaos(policy)
    assert guard.chaos is policy
    monkeypatch.delenv(CHAOS_ENV)
    later = Chaos(cut=1.0)
    guard.set_chaos(later)
    assert guard.chaos is later
    guard.set_chaos(None)
    assert guard.chaos is None


@pytest.mark.parametrize(("raw", "on"), [("1", True), ("true", True), (" YES ", True), ("on", True), ("2", False)])
def test_only_plain_yes_values_turn_the_switch_on(raw: str, on: bool) -> None:
    assert chaos_enabled({CHAOS_ENV: raw}) is on


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate_limited": 1.5}, "Chaos.rate_limited must be a rate from 0.0 to 1.0"),
        ({"cut": -0.1}, "Chaos.cut must be a rate"),
        ({"latency": True}, "Chaos.latency must be a rate"),
        ({"reset": 0.6, "stall": 0.5}, "must add up to at most 1.0"),
        ({"retry_after": -1}, "Chaos.retry_after must be a finite number of seconds"),
        ({"stall_for": float("inf")}, "Chaos.stall_for must be a finite number"),
        ({"replicas": "http://a.test"}, "Chaos.replicas must be a collection of replica names"),
        ({"seed": 1.5}, "Chaos.seed must be an integer or None"),
    ],
)
def test_a_bad_policy_is_refused_when_built(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(GuardConfigError, match=message):
        Chaos(**kwargs)


@pytest.mark.parametrize("replicas", ["http://user:s3cret@a.test", ["http://user:s3cret@a.test", ""]])
def test_a_refused_replicas_value_is_quoted_without_its_password(replicas: Any) -> None:
    with pytest.raises(GuardConfigError, match=r"Chaos\.replicas must be") as caught:
        Chaos(replicas=replicas)
    assert "s3cret" not in str(caught.value) and "http://***@a.test" in str(caught.value)


def test_a_policy_is_refused_by_the_guard_when_it_is_not_one(chaos_on: None) -> None:
    with pytest.raises(GuardConfigError, match="chaos must be a Chaos"):
        Guard(URLS, instrumentation=None, chaos={"reset": 1.0})  # type: ignore[arg-type]


def draws(policy: Chaos, n: int, replica: str = URLS[0]) -> list[tuple[str | None, float]]:
    switch = ChaosSwitch(policy, [Replica(url) for url in URLS])
    out = []
    for _ in range(n):
        drawn = switch.draw(Replica(replica))
        out.append((None, 0.0) if drawn is None else (drawn[1], drawn[2]))
    return out


def test_one_seed_gives_the_same_faults_and_each_rate_is_kept(chaos_on: None) -> None:
    policy = Chaos(rate_limited=0.1, unavailable=0.05, reset=0.05, stall=0.02, cut=0.03, latency=0.2, seed=7)
    first = draws(policy, 20_000)
    assert first == draws(policy, 20_000)
    assert first != draws(dataclasses.replace(policy, seed=8), 20_000)
    faults = Counter(fault for fault, _ in first)
    for fault, rate in [("status_429", 0.1), ("status_503", 0.05), ("reset", 0.05), ("stall", 0.02), ("cut", 0.03)]:
        assert faults[fault] / 20_000 == pytest.approx(rate, rel=0.15)
    assert faults["status_500"] == 0
    assert sum(1 for _, latency in first if latency) / 20_000 == pytest.approx(0.2, rel=0.1)
    assert {latency for _, latency in first} == {0.0, 0.5}


def test_only_the_named_replicas_get_faults(chaos_on: None) -> None:
    policy = Chaos(reset=1.0, replicas=["http://a.test/"])
    assert {fault for fault, _ in draws(policy, 10, "http://a.test")} == {"reset"}
    assert {fault for fault, _ in draws(policy, 10, "http://b.test")} == {None}


@pytest.mark.parametrize(
    "named",
    ["HTTP://A.TEST/", "http://a.test:80", "http://user:secret@a.test", "https://B.test:443/v1"],
    ids=["case", "default-port", "credentials", "https"],
)
def test_a_replica_is_named_as_replica_reads_its_url(chaos_on: None, named: str) -> None:
    """``Chaos(replicas=["HTTP://A..."])`` was refused as no replica of a Guard over ``http://a...``, though
    ``Replica`` reads that URL as the same replica."""
    urls = ["http://a.test", "https://b.test/v1"]
    target = "http://a.test" if "a.test" in named.lower() else "https://b.test/v1"
    guard = Guard(urls, instrumentation=None, chaos=Chaos(reset=1.0, replicas=[named]))
    assert guard.chaos is not None and guard.chaos.replicas == frozenset([target])
    assert "secret" not in repr(guard.chaos)
    guard.close()
    switch = ChaosSwitch(Chaos(reset=1.0, replicas=[named]), [Replica(url) for url in urls])
    assert [switch.draw(Replica(url)) is not None for url in urls] == [url == target for url in urls]


@pytest.mark.parametrize(
    "named",
    ["http://a.test/v1", "http://localhost:9", "a.test"],
    ids=["openai-base-url", "another-host", "no-scheme"],
)
def test_a_policy_naming_no_replica_of_the_guard_is_refused_before_anything_is_sent(chaos_on: None, named: str) -> None:
    """A fault test whose faults go nowhere would pass without testing anything: the policy is refused when the
    Guard is built and by ``set_chaos``, naming what was wrong and what is accepted."""
    policy = Chaos(reset=1.0, replicas=[URLS[0], named])
    with pytest.raises(GuardConfigError, match=f"{named!r}, not a replica of this Guard.*{URLS[1]}"):
        Guard(URLS, instrumentation=None, chaos=policy)
    guard = Guard(URLS, instrumentation=None, chaos=Chaos(reset=1.0, replicas=[URLS[0] + "/"]))
    with pytest.raises(GuardConfigError, match="not a replica of this Guard"):
        guard.set_chaos(policy)
    assert guard.chaos == Chaos(reset=1.0, replicas=[URLS[0]])  # the policy in force is unchanged
