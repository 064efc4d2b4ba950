"""A call's weight: its size (body bytes at 4 per token, plus ``max_tokens``) over the recent calls' average."""

from __future__ import annotations

import pytest

from llmguard_client._admission.size import DEFAULT_OUTPUT, CallSizes


def test_the_first_call_weighs_one_and_a_larger_one_more() -> None:
    sizes = CallSizes()
    assert sizes.weight(400, 20) == 1.0  # 100 + 20 tokens: the average so far
    for _ in range(50):
        sizes.weight(400, 20)
    assert sizes.weight(1600, 60) == pytest.approx(460 / (120 + 0.05 * 340), rel=1e-6)
    assert sizes.weight(0, 1) < 0.1


def test_a_call_without_max_tokens_counts_the_default_output() -> None:
    sizes = CallSizes()
    sizes.weight(400, DEFAULT_OUTPUT)
    assert sizes.weight(400, None) == pytest.approx(1.0)
