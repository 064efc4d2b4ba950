"""The prompt estimate: 4 bytes per token until answers report their usage, then a high quantile of the ratios
they report; each media part at its allowance instead of its bytes."""

from __future__ import annotations

import pytest

from llmguard_client._core.request import NO_MEDIA, PromptMedia
from llmguard_client._ratelimit.prompt_estimate import (
    AUDIO_TOKENS,
    BYTES_PER_TOKEN,
    FILE_TOKENS,
    IMAGE_TOKENS,
    LOW_DETAIL_IMAGE_TOKENS,
    PromptEstimator,
)


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


def test_a_media_part_is_charged_its_allowance_instead_of_its_bytes() -> None:
    """A 4 MB base64 image was a million tokens at 4 bytes per token; the provider counts it as about a thousand."""
    prompts = PromptEstimator()
    image = PromptMedia((("image", 4_000_000),))
    assert prompts.estimate(4_000_400, image) == 100 + IMAGE_TOKENS  # the 400 other bytes, and the allowance
    big = 200_000  # each part's bytes more than its allowance
    parts = (("image", big), ("image", big), ("audio", big), ("file", big), ("file", big), ("file", big))
    assert prompts.estimate(6 * big + 1_000, PromptMedia(parts)) == (
        250 + 2 * IMAGE_TOKENS + AUDIO_TOKENS + 3 * FILE_TOKENS
    )
    low = PromptMedia((("image", big), ("low_detail_image", big), ("low_detail_image", big)))
    assert prompts.estimate(3 * big + 1_000, low) == 250 + IMAGE_TOKENS + 2 * LOW_DETAIL_IMAGE_TOKENS
    assert prompts.estimate(400, NO_MEDIA) == prompts.estimate(400) == 100


def test_a_media_part_sent_by_reference_is_charged_its_bytes() -> None:
    """A URL or a file id takes a few dozen bytes: charged its allowance, twenty screenshots a tool sent back by file
    id were 50,000 tokens, and the calls beside them were refused where the plain SDK served them."""
    prompts = PromptEstimator()
    references = PromptMedia(tuple(("image", 40) for _ in range(20)))  # {"file_id": "file-...", "type": ...}
    assert prompts.estimate(1_200, references) == 100 + 20 * 10
    mixed = PromptMedia((("image", 4_000_000), ("file", 40), ("low_detail_image", 2_000)))
    assert prompts.estimate(4_002_440, mixed) == 100 + IMAGE_TOKENS + 10 + LOW_DETAIL_IMAGE_TOKENS


def test_a_body_with_media_teaches_no_ratio() -> None:
    """Its count is mostly its media's: after image-heavy traffic the ratio fell a thousandfold, and long text was
    then charged a thousandth of its tokens (the provider answered 429)."""
    prompts = PromptEstimator()
    for _ in range(PromptEstimator.WINDOW):
        prompts.observe(1_333_400, 865, PromptMedia((("image", 1_333_000),)))
    assert prompts.tokens_per_byte == 1 / BYTES_PER_TOKEN
    prompts.observe(400, 200, NO_MEDIA)
    assert prompts.tokens_per_byte == 0.5
