"""The bench's scenario defaults stay in line with the simulated cluster's sizing."""

from __future__ import annotations

import importlib

import pytest

from llmguard_tools.bench.presets import DEMO_SCENARIOS, PRESETS, SIM_LENGTHS, preset_for
from llmguard_tools.bench.rates import SPIKE, parse_profile
from llmguard_tools.bench.traffic import make_plan


def test_demo_presets_meet_the_brief() -> None:
    strag, over = PRESETS["stragglers"], PRESETS["overload"]
    assert strag.requests >= 500 and strag.profile is None and strag.rate is not None
    assert over.requests >= 600 and over.profile == "spike"
    plan = make_plan(over.requests, rate=over.rate, profile=parse_profile("spike"))
    assert plan.profile is not None
    peak = plan.profile.peak_rate
    assert peak / plan.profile.segments[0][0] == pytest.approx(140 / 30)  # the seed's shape
    assert set(DEMO_SCENARIOS) <= set(PRESETS)
    assert preset_for("no-such").requests > 0
    assert SPIKE.segments[1] == (140.0, 20.0)


def test_presets_follow_the_sim_scenarios() -> None:
    try:
        scenarios = importlib.import_module("llmguard_tools.sim.scenarios")
    except ImportError:
        pytest.skip("simulated cluster not available")
    sims = scenarios.SCENARIOS
    assert set(PRESETS) <= set(sims)
    over = sims["overload"]
    plan = make_plan(PRESETS["overload"].requests, rate=PRESETS["overload"].rate, profile=parse_profile("spike"))
    assert plan.profile is not None
    assert plan.profile.segments[0][0] == pytest.approx(over.load.base_rps)
    assert plan.profile.peak_rate == pytest.approx(over.load.peak_rps)
    assert plan.profile.peak_rate >= 2.5 * over.capacity_rps  # the spike really overloads it
    strag = sims["stragglers"]
    assert PRESETS["stragglers"].rate == pytest.approx(strag.load.base_rps)
    assert PRESETS["stragglers"].rate <= strag.capacity_rps / 3  # light load
    # the lengths the scenarios are sized for
    hint = strag.load
    assert SIM_LENGTHS.prompt_median == pytest.approx(hint.prompt_words.median)
    assert SIM_LENGTHS.prompt_max == hint.prompt_words.cap
    assert SIM_LENGTHS.output_median == pytest.approx(hint.max_tokens.median)
    assert SIM_LENGTHS.output_max == hint.max_tokens.cap
