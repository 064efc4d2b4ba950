"""Cohort assignment: sticky keys, monotone widening, the live fraction, its sources and the kill switch."""

from __future__ import annotations

import logging
import random
import threading
from collections import Counter
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmguard_client import Guard, GuardConfigError, PhaseRecord, Replica, Tier, UnknownCohortError
from llmguard_client._rollout.rollout import CALLS_REMEMBERED, Rollout, disabled_by_env, flag_fraction, key_position
from tests.sdk_retries import failing_once, sdk_call
from tests.virtual import BACKENDS, run_virtual

URL = "http://r1.test:8000/v1/chat/completions"
REQUEST = httpx.Request("POST", URL)


def req(key: str | None = None, **headers: str) -> httpx.Request:
    if key is not None:
        headers["x-llmguard-key"] = key
    return httpx.Request("POST", URL, headers=headers)


def guarded_share(rollout: Rollout, keys: list[str]) -> float:
    guarded = 0
    for key in keys:
        with rollout.keyed(key):  # the same hash as the header's; building 20k httpx.Requests is the slow part
            guarded += rollout.assign(REQUEST).cohort == "guarded"
    return guarded / len(keys)


# --- sticky keys -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fraction", [0.05, 0.10])
def test_keyed_cohort_is_within_one_and_a_half_points_of_the_fraction_over_20k_keys(fraction: float) -> None:
    keys = [f"user-{i}" for i in range(20_000)]
    share = guarded_share(Rollout(fraction), keys)
    print(f"fraction {fraction}: guarded share over 20k keys = {share:.4f}")
    assert abs(share - fraction) <= 0.015


def test_a_key_keeps_its_cohort_on_every_call_and_in_every_rollout_instance() -> None:
    keys = [f"user-{i}" for i in range(500)]
    first, second = Rollout(0.3), Rollout(0.3, rng=random.Random(1))
    cohorts = {k: first.assign(req(k)).cohort for k in keys}
    for _ in range(5):
        assert all(first.assign(req(k)).cohort == cohorts[k] for k in keys)
    assert all(second.assign(req(k)).cohort == cohorts[k] for k in keys)
    assert {first.assign(req(k)).by for k in keys} == {"key"}


def test_key_position_is_a_fixed_function_of_the_key() -> None:
    # Pinned values: the hash must not change between releases, or every user would switch cohorts.
    assert key_position("user-1") == 0.1240128195717604
    assert key_position("") == 0.2406410128502353
    assert all(0.0 <= key_position(str(i)) < 1.0 for i in range(1000))


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.text(min_size=1, max_size=24).filter(str.strip), min_size=1, max_size=40),
    fractions=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=2, max_size=6),
)
def test_widening_never_moves_a_key_from_guarded_to_control(keys: list[str], fractions: list[float]) -> None:
    rollout = Rollout(0.0)
    guarded_before: set[str] = set()
    for fraction in sorted(fractions):
        rollout.set(fraction)
        guarded = set()
        for key in keys:  # any text: through the context manager (a header is ASCII only)
            with rollout.keyed(key):
                if rollout.assign(REQUEST).cohort == "guarded":
                    guarded.add(key)
        assert guarded_before <= guarded
        guarded_before = guarded


def test_key_sources_in_order_header_then_context_then_function() -> None:
    seen: list[str] = []

    def by_user(request: httpx.Request) -> str | None:
        seen.append(request.url.path)
        user: str | None = request.headers.get("x-user")
        return user

    rollout = Rollout(0.5, key=by_user)
    pick = {k: key_position(k) < 0.5 for k in ("a", "b", "c", "d", "e", "f")}
    guarded_key = next(k for k, g in pick.items() if g)
    control_key = next(k for k, g in pick.items() if not g)
    assert rollout.assign(req(guarded_key, **{"x-user": control_key})).cohort == "guarded"
    with rollout.keyed(control_key):
        assert rollout.assign(req(guarded_key)).cohort == "guarded"  # the header wins
        assert rollout.assign(req(**{"x-user": guarded_key})).cohort == "control"  # the context wins
    assert rollout.assign(req(**{"x-user": guarded_key})).cohort == "guarded"
    assert rollout.assign(req(**{"x-user": control_key})).cohort == "control"
    assert len(seen) == 2  # the function is only asked when neither header nor context gave a key


def test_without_a_key_assignment_is_per_call_at_the_fraction() -> None:
    rollout = Rollout(0.2, key=lambda request: None, rng=random.Random(7))
    counts = Counter(rollout.assign(REQUEST).cohort for _ in range(20_000))
    assert abs(counts["guarded"] / 20_000 - 0.2) < 0.015
    assert rollout.assign(req()).by == "call"


def test_without_a_key_an_sdk_calls_retries_keep_its_cohort_and_calls_spread_at_the_fraction() -> None:
    """A keyless SDK call's first request draws its cohort at the fraction and its retries keep it, whatever the
    draws between them. The same request sent again as a new call (the same prompt from one task: an eval's
    samples, a load test's user) draws again: the calls spread at the fraction, not all in one cohort."""
    rollout = Rollout(0.3, rng=random.Random(7))
    calls = [f"call-{i}" for i in range(2_000)]
    first = {call: rollout.assign(REQUEST, sdk_call=(call, 0)) for call in calls}
    assert {a.by for a in first.values()} == {"call"}
    assert all(rollout.assign(REQUEST, sdk_call=(call, 1)).cohort == first[call].cohort for call in calls)
    again = [rollout.assign(REQUEST, sdk_call=("the same prompt", 0)).cohort for _ in range(20_000)]
    assert abs(again.count("guarded") / len(again) - 0.3) < 0.015


def test_the_cohorts_kept_for_retries_are_the_newest_calls() -> None:
    """The memory is bounded: the oldest call is forgotten (its retry would draw again), the newest are kept."""
    rollout = Rollout(0.5, rng=random.Random(3))
    for i in range(CALLS_REMEMBERED + 1):
        rollout.assign(REQUEST, sdk_call=(f"call-{i}", 0))
    assert len(rollout._drawn) == CALLS_REMEMBERED
    assert "call-0" not in rollout._drawn and f"call-{CALLS_REMEMBERED}" in rollout._drawn


async def test_without_a_key_an_sdk_calls_retry_is_in_the_cohort_of_its_first_request() -> None:
    """100 keyless calls at 0.5, each answered 500 once and served on its SDK retry (the same request with
    ``x-stainless-retry-count: 1``, from the same task): both records of a call are in one cohort, and each cohort
    has calls. Before: each request drew its own cohort, so about half of the control calls' retries were guarded
    (and half the guarded calls' retries control), and `llmguard compare` counted them in the first one's."""
    records: list[PhaseRecord] = []
    guard = failing_once(instrumentation=None, on_record=records.append)
    async with guard, guard.http_client() as client:
        async with anyio.create_task_group() as tg:
            for i in range(100):
                tg.start_soon(sdk_call, client, i)
    assert Counter((r.sdk_retry, r.status) for r in records) == {(0, "http_error"): 100, (1, "ok"): 100}
    cohorts: dict[str | None, set[str]] = {}
    for r in records:
        cohorts.setdefault(r.sdk_call, set()).add(r.cohort)
    assert len(cohorts) == 100 and None not in cohorts
    mixed = [c for c in cohorts.values() if len(c) > 1]
    assert not mixed, f"{len(mixed)} calls had requests in both cohorts"
    assert {c for (c,) in cohorts.values()} == {"guarded", "control"}


def test_an_int_key_is_the_same_as_its_text() -> None:
    rollout = Rollout(0.5)
    with rollout.keyed(1234):
        by_int = rollout.assign(req()).cohort
    assert by_int == rollout.assign(req("1234")).cohort


@pytest.mark.parametrize("bad", ["", "  ", None, 1.5, b"user", ["u"]])
def test_rollout_key_context_needs_a_non_empty_str_or_int(bad: Any) -> None:
    with pytest.raises(GuardConfigError, match="non-empty str or int"), Rollout(0.5).keyed(bad):
        pass


def test_a_raising_key_function_falls_back_to_per_call_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    def broken(request: httpx.Request) -> str:
        raise KeyError("user")

    rollout = Rollout(0.5, key=broken)
    with caplog.at_level(logging.ERROR, "llmguard_client"):
        assignments = [rollout.assign(req()) for _ in range(50)]
    assert {a.by for a in assignments} == {"call"}
    assert [r.message for r in caplog.records] == [
        "llmguard rollout_key function raised; such calls are assigned per call"
    ]


# --- pins and the off state ------------------------------------------------------------------------------


def test_a_pin_wins_over_the_key_while_the_guard_is_on() -> None:
    rollout = Rollout(1.0)
    assert rollout.assign(req("anyone", **{"x-llmguard-cohort": " Control "})).cohort == "control"
    with pytest.raises(UnknownCohortError, match="guarded, control"):
        rollout.assign(req(**{"x-llmguard-cohort": "treatment"}))


def test_fraction_zero_is_off_whatever_the_pin_but_a_bad_pin_still_fails() -> None:
    rollout = Rollout(0.0)
    for headers in ({"x-llmguard-cohort": "guarded"}, {"x-llmguard-cohort": "control"}, {}):
        assignment = rollout.assign(req("k", **headers))
        assert (assignment.cohort, assignment.fraction, assignment.by) == ("control", 0.0, "off")
    with pytest.raises(UnknownCohortError, match="'treatment'") as caught:  # fails at 0 % as it would at 100 %
        rollout.assign(req("k", **{"x-llmguard-cohort": "treatment"}))
    assert caught.value.cause == "unknown_cohort" and caught.value.status_code == 400


@pytest.mark.parametrize(
    ("value", "disabled"),
    [
        (None, False),
        ("", False),
        ("0", False),
        ("false", False),
        (" Off ", False),
        ("1", True),
        ("TRUE", True),
        ("yes", True),
        ("on", True),
    ],
)
def test_kill_switch_values(value: str | None, disabled: bool) -> None:
    env = {} if value is None else {"LLMGUARD_DISABLED": value}
    assert disabled_by_env(env) is disabled


def test_an_unrecognised_kill_switch_value_disables_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "llmguard_client"):
        assert disabled_by_env({"LLMGUARD_DISABLED": "ture"}) is True
    assert "treating it as 1" in caplog.text


def test_the_kill_switch_is_read_at_construction_and_outlasts_set_rollout(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("LLMGUARD_DISABLED", "1")
    guard = Guard(["http://r1.test:8000"], rollout=1.0, instrumentation=None)
    monkeypatch.delenv("LLMGUARD_DISABLED")
    assert guard.rollout == 0.0
    with caplog.at_level(logging.WARNING, logger="llmguard_client"):
        guard.set_rollout(1.0)
    assert guard.rollout == 0.0
    assert "set_rollout(1.0) takes no effect: LLMGUARD_DISABLED" in caplog.text
    assert Guard(["http://r1.test:8000"], rollout=1.0, instrumentation=None).rollout == 1.0


# --- the live fraction -------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-0.01, 1.01, float("nan"), float("inf"), True, "0.1", None])
def test_set_rollout_rejects_what_is_not_a_fraction(bad: Any) -> None:
    guard = Guard(["http://r1.test:8000"], instrumentation=None)
    with pytest.raises(GuardConfigError, match=r"from 0\.0 to 1\.0") as info:
        guard.set_rollout(bad)
    assert repr(bad) in str(info.value)
    assert guard.rollout == 1.0  # unchanged


@pytest.mark.parametrize("bad", [-1.0, float("nan"), True, "5"])
def test_poll_interval_must_be_seconds(bad: Any) -> None:
    with pytest.raises(GuardConfigError, match="rollout_poll_interval"):
        Guard(["http://r1.test:8000"], rollout_poll_interval=bad, instrumentation=None)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_fraction_source_is_polled_at_most_once_per_interval() -> None:
    clock, calls = FakeClock(), []

    def source() -> float:
        calls.append(clock.now)
        return 0.25

    rollout = Rollout(source, poll_interval=5.0, clock=clock)
    assert calls == [100.0]  # read once at construction
    for step in range(100):
        clock.now = 100.0 + step * 0.1  # 10 s of calls
        assert rollout.assign(req("k")).fraction == 0.25
    assert calls == [100.0, 105.0]


def test_a_failing_source_keeps_the_last_value_and_logs_once_until_it_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    answers: list[Any] = [0.1, RuntimeError("flag service down"), 7.0, RuntimeError("still down"), 0.5]

    def source() -> float:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return float(answer)

    rollout = Rollout(source, poll_interval=1.0, clock=clock)
    seen = []
    with caplog.at_level(logging.WARNING, "llmguard_client"):
        for _ in range(4):
            clock.now += 1.0
            seen.append(rollout.fraction)
    assert seen == [0.1, 0.1, 0.1, 0.5]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "flag service down" in warnings[0] and "0.1" in warnings[0]


def test_a_source_failing_from_the_start_leaves_the_guard_off(caplog: pytest.LogCaptureFixture) -> None:
    def down() -> float:
        raise ConnectionError("no flag service")

    with caplog.at_level(logging.WARNING, "llmguard_client"):
        rollout = Rollout(down)
    assert rollout.fraction == 0.0 and rollout.assign(req("k")).by == "off"
    assert "no flag service" in caplog.text


@BACKENDS
def test_a_guards_fraction_source_is_polled_on_the_loops_clock(backend: str) -> None:
    """The Guard's rollout polls on the Guard's clock (the loop's): in virtual time too, once per interval."""
    polls: list[float] = []

    def source() -> float:
        polls.append(anyio.current_time())
        return 0.5

    async def main() -> None:
        start = anyio.current_time()
        guard = Guard(["http://r1.test:8000"], rollout=source, rollout_poll_interval=5.0, instrumentation=None)
        async with guard:
            for wait in (0.0, 4.9, 0.1, 3.0, 2.0):  # read at 0, 4.9, 5.0, 8.0, 10.0 s
                await anyio.sleep(wait)
                assert guard.rollout == 0.5
        assert [round(p - start, 6) for p in polls] == [0.0, 5.0, 10.0]

    run_virtual(main, backend)


def test_a_poll_from_another_time_line_is_not_held_back() -> None:
    """A clock that reads before the last poll (trio's loop clock, then sync code's time.monotonic) polls
    at once rather than waiting for the first time line's interval."""
    clock = [100_000.0]
    polled: list[float] = []

    def source() -> float:
        polled.append(clock[0])
        return 0.5

    rollout = Rollout(source, poll_interval=5.0, clock=lambda: clock[0])
    clock[0] = 50.0
    assert rollout.fraction == 0.5
    clock[0] = 50.1
    assert rollout.fraction == 0.5
    assert polled == [100_000.0, 50.0]  # polled again at 50 (before the last poll), not again at 50.1


def test_a_number_detaches_the_source_and_a_stale_poll_cannot_overwrite_it() -> None:
    clock = FakeClock()
    rollout: Rollout

    def source() -> float:
        rollout.set(0.9)  # an operator's set_rollout() lands while this poll is under way
        return 0.2

    rollout = Rollout(0.0, clock=clock)
    rollout.set(source)
    assert rollout.fraction == 0.9
    clock.now += 60
    assert rollout.fraction == 0.9


def test_flag_fraction_reads_an_openfeature_style_float_flag() -> None:
    class Client:
        def __init__(self) -> None:
            self.asked: list[tuple[str, float]] = []

        def get_float_value(self, flag_key: str, default_value: float, *args: Any, **kwargs: Any) -> float:
            self.asked.append((flag_key, default_value))
            return 0.05

    client = Client()
    rollout = Rollout(flag_fraction(client, "llmguard-rollout"))
    assert rollout.fraction == 0.05 and client.asked == [("llmguard-rollout", 0.0)]
    with pytest.raises(GuardConfigError, match="flag_fraction default"):
        flag_fraction(client, "x", default=2.0)


@pytest.mark.parametrize("client", [object(), None, "llmguard-rollout"], ids=["object", "none", "str"])
def test_flag_fraction_refuses_a_client_without_get_float_value(client: Any) -> None:
    """Such a client was taken: every poll then raised, and the guard passed every call through as control with
    only a warning in the log."""
    with pytest.raises(GuardConfigError) as refused:
        flag_fraction(client, "llmguard-rollout")
    assert "OpenFeature-style client with get_float_value(flag_key, default_value)" in str(refused.value)
    assert type(client).__name__ in str(refused.value)


@pytest.mark.parametrize("key", [None, "", 3])
def test_flag_fraction_refuses_a_flag_key_that_is_not_a_name(key: Any) -> None:
    class Client:
        def get_float_value(self, flag_key: str, default_value: float) -> float:
            return 1.0

    with pytest.raises(GuardConfigError, match="flag_key must be the flag's non-empty name"):
        flag_fraction(Client(), key)


def test_flag_fraction_keeps_failing_open_for_a_client_that_fails_when_read() -> None:
    """The documented fail-open is for a source that fails at run time: the last good value (0.0 at first)."""

    class Failing:
        def get_float_value(self, flag_key: str, default_value: float) -> float:
            raise ConnectionError("flag service down")

    assert Rollout(flag_fraction(Failing(), "llmguard-rollout")).fraction == 0.0


# --- set_rollout under concurrent calls --------------------------------------------------------------------


async def test_set_rollout_under_concurrent_calls_each_call_uses_one_fraction_and_its_key_rule() -> None:
    """400 keyed calls in flight at once while a task and a thread keep changing the fraction: every call
    ends, and each record's cohort is exactly what its own recorded fraction says for its key."""
    records: list[PhaseRecord] = []

    def transport(replica: Replica) -> httpx.AsyncBaseTransport:
        async def handler(request: httpx.Request) -> httpx.Response:
            await anyio.sleep(0.001)
            return httpx.Response(200, json={"choices": [{"message": {"content": "x"}}]})

        return httpx.MockTransport(handler)

    fractions = [0.0, 0.05, 0.1, 0.5, 1.0]
    guard = Guard(
        ["http://r1.test:8000"],
        rollout=0.1,
        tiers={"interactive": Tier(ttft=60.0, total=120.0)},  # deadlines are not under test on a shared CPU
        hedge=None,
        retry=None,
        transport_factory=transport,
        instrumentation=None,
        on_record=records.append,
    )
    stop = threading.Event()

    def flip_from_a_thread() -> None:
        rng = random.Random(3)
        while not stop.wait(0.0005):  # a short wait: a tight loop would hold the GIL and starve the calls
            guard.set_rollout(rng.choice(fractions))

    flipper = threading.Thread(target=flip_from_a_thread)
    flipper.start()
    try:
        async with guard, guard.http_client() as client:
            pending = 400
            all_ended = anyio.Event()

            async def one(i: int) -> None:
                nonlocal pending
                # The key doubles as the model name, so the record tells which key the call had.
                body, headers = {"model": f"user-{i}"}, {"x-llmguard-key": f"user-{i}"}
                # Staggered starts: calls started in one loop iteration would all read the same fraction.
                await anyio.sleep((i % 40) * 0.0005)
                response = await client.post("http://r1.test:8000/v1/chat/completions", json=body, headers=headers)
                assert response.status_code == 200
                pending -= 1
                if not pending:
                    all_ended.set()

            async def flip_from_a_task() -> None:
                # Flips for as long as any call is in flight (a fixed 2000 flips outlasted the calls by ~2 s).
                i = 0
                while not all_ended.is_set():
                    guard.set_rollout(fractions[i % len(fractions)])
                    i += 1
                    await anyio.sleep(0.0001)

            async with anyio.create_task_group() as tg:
                tg.start_soon(flip_from_a_task)
                for i in range(pending):
                    tg.start_soon(one, i)
    finally:
        stop.set()
        flipper.join()
    assert len(records) == 400 and all(r.status == "ok" for r in records)
    used = Counter(r.rollout_fraction for r in records)
    assert set(used) <= set(fractions) and len(used) >= 3, used
    for r in records:
        assert r.model is not None and r.rollout_fraction is not None
        expected = "guarded" if key_position(r.model) < r.rollout_fraction else "control"
        assert r.cohort == expected, (r.model, r.rollout_fraction, r.cohort)
