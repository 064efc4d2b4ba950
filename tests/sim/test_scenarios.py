"""Scenario definitions: shapes, stated capacities, and the package's import boundary."""

from __future__ import annotations

import dataclasses

import pytest

import llmguard_tools.sim as sim
from llmguard_tools.sim.faults import FaultConfig
from llmguard_tools.sim.scenarios import SCENARIOS, get_scenario
from llmguard_tools.sim.virtual import measure_capacity
from tests.probe import modules_after_import


def test_required_scenarios_exist() -> None:
    assert {"healthy", "stragglers", "overload", "faults"} <= SCENARIOS.keys()
    assert all(s.replicas == 3 for s in SCENARIOS.values())
    assert all(s.engine.policy == "token" for s in SCENARIOS.values() if s.name not in ("collapse", "queueing"))
    stall = SCENARIOS["stragglers"].faults_for(1)
    assert (stall.stall_first_p, stall.stall_first_s) == (0.05, 2.0)
    assert SCENARIOS["overload"].load.peak_rps / SCENARIOS["overload"].capacity_rps == pytest.approx(3.0, rel=0.1)
    assert SCENARIOS["overload"].load.base_rps / SCENARIOS["overload"].capacity_rps == pytest.approx(0.6, rel=0.1)
    assert len({SCENARIOS["faults"].faults_for(i) for i in range(3)}) == 3
    slow = SCENARIOS["degraded"].faults_for(1)
    assert (slow.slow_factor, slow.slow_between) == (5.0, None) and slow.first_token_delay_s > 0
    assert SCENARIOS["degraded"].faults_for(0) == SCENARIOS["degraded"].faults_for(2) == FaultConfig()
    assert SCENARIOS["degrading"].faults_for(1).slow_between == (4.0, 9.0)


def test_replica_override_and_unknown_name() -> None:
    assert get_scenario("overload", 5).replicas == 5
    assert get_scenario("overload", 6).capacity_rps == pytest.approx(2 * SCENARIOS["overload"].capacity_rps)
    with pytest.raises(KeyError, match="known: collapse, degraded, degrading, faults, healthy"):
        get_scenario("nope")


@pytest.mark.parametrize("name", ["overload", "collapse", "faults", "degraded", "multiturn", "queueing"])
def test_stated_capacity_matches_the_engine(name: str) -> None:
    scenario, load = SCENARIOS[name], SCENARIOS[name].load
    total = 0.0
    for i in range(scenario.replicas):
        engine = dataclasses.replace(scenario.engine, step_time_factor=scenario.faults_for(i).slow_factor)
        total += measure_capacity(
            engine,
            prompts=load.prompt_words,
            fixed_outputs=load.max_tokens,
            overload_rps=3 * scenario.capacity_rps / scenario.replicas,
            seed=i,
            seconds=20,
        )
    assert total == pytest.approx(scenario.capacity_rps, rel=0.15)


def test_every_load_hint_request_fits_the_model_length() -> None:
    for scenario in SCENARIOS.values():
        assert scenario.load.prompt_words.cap + scenario.load.max_tokens.cap <= scenario.engine.model_len


def test_public_names_are_sorted_and_exported() -> None:
    assert sim.__all__ == sorted(sim.__all__)
    assert all(hasattr(sim, name) for name in sim.__all__)


def test_importing_the_package_does_not_import_the_sim() -> None:
    loaded = modules_after_import()
    assert "llmguard_client" in loaded  # the probe really imported it
    assert not any(m.startswith("llmguard_tools.sim") for m in loaded)
