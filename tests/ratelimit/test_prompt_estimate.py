"""The prompt estimate: 4 bytes per token until answers report their usage, then a high quantile of the ratios
they report."""

from __future__ import annotations

import pytest

from llmguard_client._ratelimit.prompt_estimate import BYTES_PER_TOKEN, PromptEstimator


def test_before_any_usage_a_body_is_four_bytes_per_token() -> None:
    prompts = PromptEstimator()
    assert prompts.estimate(400) == 400 // BYTES_PER_TOKEN
    assert prompts.estimate(401) == 101  # rounded up


def test_it_learns_the_ratio_the_answers_report_from_a_high_quantile() -> None:
    # Synthetic text of 2 bytes per token ("w w w ..."): 4 bytes per token halved every estimate.
    prompts = PromptEstimator()
    for tokens in range(100, 200):
        prompts.observe(2 * tokens, tokens)
    assert prompts.tokens_per_byte == pytest.approx(0.5)
    assert prompts.estimate(1000) == 500
    # A mix: 90 % at 4 bytes per token, 10 % at 2. The 0.9 quantile sits between, on the safe side of most.
    for i in range(PromptEstimator.WINDOW):
        prompts.observe(400, 200 if i % 10 == 0 else 100)
    assert 0.25 < prompts.tokens_per_byte <= 0.5


def test_empty_bodies_and_missing_counts_teach_nothing() -> None:
    prompts = PromptEstimator()
    prompts.observe(0, 10)
    prompts.observe(100, 0)
    assert prompts.tokens_per_byte == 1 / BYTES_PER_TOKEN
