"""benchmarks/admission_model.py: the collapse scenario in virtual time reproduces the raw client's collapse, the
guard's gates give back every slot, the clairvoyant bound admits only calls that meet the SLO, and the script
prints one line per seed and a summary per policy."""

from __future__ import annotations

import pytest

from benchmarks.admission_model import Result, main, run
from llmguard_client import Admission


def test_the_raw_client_collapses_on_the_spike_and_admission_keeps_most_calls_in_time() -> None:
    plain = run("plain", 0)
    adaptive = run("adaptive", 0)  # the run itself asserts that every slot and place in line was given back
    assert plain.interactive == adaptive.interactive == 700
    assert plain.goodput < 0.35 and plain.outcomes["late"] > 0.6 * 700  # the queue outgrows the 1 s deadline
    assert adaptive.goodput > 1.8 * plain.goodput
    assert adaptive.wasted < 0.05
    refused = [c for c in adaptive.calls if c.outcome == "refused"]
    assert refused and all(c.seq is None for c in refused)  # refused before it was sent: no engine work
    waited = [c.refused_after for c in refused if c.refused_after is not None]
    assert len(waited) == len(refused) and max(waited) <= Admission().max_queue_wait + 1e-9  # its wait of a 1 s ttft


def test_the_clairvoyant_bound_admits_only_calls_that_meet_the_slo() -> None:
    oracle = run("oracle", 1, calls=250)
    assert oracle.outcomes["late"] == oracle.outcomes["slow"] == oracle.outcomes["cut"] == 0
    assert oracle.outcomes["good"] == sum(1 for c in oracle.calls if c.seq is not None)
    assert oracle.wasted == 0.0


def test_a_fixed_limit_is_never_exceeded_and_is_reached_under_the_spike() -> None:
    for limit in (3, 12):  # counted in calls: every call weighs one
        assert run(f"fixed:{limit}", 2, calls=200, admission=Admission(by_size=False)).peak_in_flight == limit


def test_the_script_prints_a_line_per_seed_and_a_summary_per_policy(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--seeds", "2", "--calls", "80", "--policy", "plain,fixed:8", "--batch", "0.3"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 2 * 3  # the settings, then per policy two seeds and the mean
    assert sum("mean" in line for line in lines) == 2
    assert all("batch done" in line for line in lines[1:])


def test_a_budget_in_tokens_lets_in_the_smaller_calls_and_more_of_them_than_a_budget_in_calls() -> None:
    tokens, calls = run("tokens:2600", 0), run("calls:28", 0)

    def size(result: Result, admitted: bool) -> float:
        found = [c.work.prompt_tokens + c.work.max_tokens for c in result.calls if (c.seq is not None) == admitted]
        return sum(found) / len(found)

    assert size(tokens, admitted=True) < 0.8 * size(tokens, admitted=False)
    assert size(calls, admitted=True) > 0.9 * size(calls, admitted=False)  # a budget in calls takes the mix as it is
    assert tokens.goodput > calls.goodput + 0.03


def test_the_guards_controller_learning_a_budget_in_tokens_beats_its_limit_in_calls_on_the_spike() -> None:
    learned, in_calls = run("tokens:learned", 3), run("adaptive", 3, admission=Admission(by_size=False))
    assert learned.goodput > in_calls.goodput + 0.03
    assert learned.wasted < 0.01


def test_weighing_calls_by_size_keeps_more_of_the_spike_in_time_than_counting_them() -> None:
    for seed in (0, 1):
        weighed, counted = run("adaptive", seed), run("adaptive", seed, admission=Admission(by_size=False))
        assert weighed.goodput > counted.goodput + 0.02
        assert weighed.wasted < 0.02


def test_four_guards_starting_from_the_same_guess_waste_little_of_the_engines_work_at_the_spike() -> None:
    # Each of four guards starts at the default limit per replica, four times what one guard would send at the
    # spike's onset: the limit comes down to the load each has proven in time before the spike arrives.
    for seed in (0, 1):
        four = run("adaptive", seed, guards=4)
        assert four.wasted < 0.03, (seed, four.wasted)
        assert four.goodput > 0.6
