"""--tier-mix: the same calls on the batch tier for every client, and each tier's figures."""

from __future__ import annotations

import dataclasses

import pytest

from llmguard_tools.bench.tiermix import assign, parse_tier_mix, tier_figures
from tests.bench.reports import sample


def test_a_mix_is_parsed_and_checked() -> None:
    assert parse_tier_mix("batch:0.3") == {"batch": 0.3}
    for bad in ("batch:1.5", "gold:0.3", "batch", "batch:0"):
        with pytest.raises(ValueError, match="--tier-mix"):
            parse_tier_mix(bad)


def test_the_share_of_batch_calls_is_drawn_from_the_seed() -> None:
    tiers = assign(2000, {"batch": 0.3}, seed=4)
    assert tiers == assign(2000, {"batch": 0.3}, seed=4)
    assert tiers != assign(2000, {"batch": 0.3}, seed=5)
    assert set(tiers) == {"interactive", "batch"}
    assert 0.27 < tiers.count("batch") / 2000 < 0.33


def test_each_tier_is_judged_against_its_own_target() -> None:
    interactive = [dataclasses.replace(sample(i, ttft=0.5), tier="interactive") for i in range(3)]
    late = dataclasses.replace(sample(3, ttft=2.0), tier="interactive")
    batch_ok = [dataclasses.replace(sample(4 + i, ttft=20.0), tier="batch") for i in range(3)]
    batch_failed = dataclasses.replace(sample(7, status="timeout", ttft=None, http=None), tier="batch")
    figures = tier_figures([*interactive, late, *batch_ok, batch_failed], good=interactive)
    assert (figures["interactive"].calls, figures["interactive"].good, figures["interactive"].completed) == (
        4,
        0.75,
        1.0,
    )
    assert (figures["batch"].calls, figures["batch"].good, figures["batch"].completed) == (4, 0.75, 0.75)
