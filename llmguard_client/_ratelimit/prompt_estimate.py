"""A prompt's tokens estimated from its request body: its text by its bytes, at a ratio learnt from the answers'
``usage``, and each media part at a fixed allowance.

A rate-limited attempt is charged before it is sent, so its prompt must be estimated without a tokenizer (the
guard never reads the prompt). Until an answer reports its ``usage``, a body is taken as `BYTES_PER_TOKEN` bytes
per token (English text in BPE vocabularies; the JSON around the messages makes it an over-estimate). Text that
packs more tokens into its bytes (CJK scripts, code, numbers, short synthetic words) made that an
under-estimate: the guard let through more tokens than the provider counted, and the provider answered 429.
So each answer's reported prompt tokens over its body's bytes is kept (the last `WINDOW`), and a body is
estimated at their `QUANTILE`: an over-estimate for most prompts like the recent ones, which the correction from
``usage`` gives back when the call ends.

A media part (an image, an audio clip, a file such as a PDF) is counted by the provider by what it holds (an
image's size in tiles, a clip's seconds, a document's pages), not by its bytes: a 4 MB base64 image is about 1M
tokens at 4 bytes per token and under 2,000 to the provider. So the bytes a media part takes are left out of the
body's, each part is charged what its bytes would be as text, at most a fixed allowance (`IMAGE_TOKENS`,
`AUDIO_TOKENS`, `FILE_TOKENS`: above what most parts count; an image sent with ``"detail": "low"``,
`LOW_DETAIL_IMAGE_TOKENS`: what OpenAI counts it); the correction from ``usage`` gives the excess back, or charges
what a larger one used. A part sent by reference (a URL, a file id) takes a few dozen bytes and is charged as
little: charged its allowance, twenty screenshots sent back by file id were 50,000 tokens, and the calls beside
them were refused where the plain SDK served them (an under-estimate meets the provider's 429, as without a guard).
A body with media teaches no ratio (its count is mostly its media's, which no ratio of bytes describes).
"""

from __future__ import annotations

import math
from typing import Protocol

from llmguard_client._routing.quantile import StreamingQuantile

__all__ = [
    "ALLOWANCES",
    "AUDIO_TOKENS",
    "BYTES_PER_TOKEN",
    "FILE_TOKENS",
    "IMAGE_TOKENS",
    "LOW_DETAIL_IMAGE_TOKENS",
    "MediaParts",
    "PromptEstimator",
]

BYTES_PER_TOKEN = 4
"""The ratio before any answer reported its usage: about 4 bytes per token for English text."""
IMAGE_TOKENS = 2_500
"""One image: above OpenAI's high detail (765 for 1024 x 1024, 1,445 at most on tile-counted models, about 2,500
on patch-counted ones) and Anthropic's largest (about 1,600). Models that multiply image tokens (gpt-4o-mini) count
more: the correction from usage charges the rest."""
LOW_DETAIL_IMAGE_TOKENS = 85
"""One image sent with ``"detail": "low"``: OpenAI counts it at a fixed 85 tokens on gpt-4o, gpt-4.1 and gpt-4.5
(fewer on the o-series and gpt-5); a model that multiplies image tokens (gpt-4o-mini) or counts an image's patches
(the gpt-4.1 and gpt-5 minis) counts more, which the correction from usage charges. (`IMAGE_TOKENS` is more than
a ``RateLimit(tokens_per_minute=60_000)`` bucket holds: the calls after it waited for room never used.)"""
AUDIO_TOKENS = 5_000
"""One audio clip: a few minutes of speech (OpenAI counts about 10 to 25 tokens per second of input audio)."""
FILE_TOKENS = 10_000
"""One file or document (a PDF): a few pages (Anthropic and OpenAI count each page's text and its image)."""


class MediaParts(Protocol):
    """The media a prompt sends (`llmguard_client._core.request.PromptMedia`)."""

    @property
    def parts(self) -> tuple[tuple[str, int], ...]:
        """Each part's kind (``image``, ``low_detail_image``, ``audio``, ``file``) and the characters it takes."""
        ...

    @property
    def chars(self) -> int:
        """Characters of the body the media parts take (their data, URLs and ids)."""
        ...


ALLOWANCES = {
    "image": IMAGE_TOKENS,
    "low_detail_image": LOW_DETAIL_IMAGE_TOKENS,
    "audio": AUDIO_TOKENS,
    "file": FILE_TOKENS,
}
"""The most a media part of each kind is charged."""


class PromptEstimator:
    """Estimates prompt tokens from a body's bytes and media; `observe` teaches it the ratio the answers report."""

    WINDOW = 64
    QUANTILE = 0.9

    __slots__ = ("_ratios", "_tokens_per_byte")

    def __init__(self) -> None:
        self._ratios = StreamingQuantile(self.WINDOW)
        self._tokens_per_byte = 1.0 / BYTES_PER_TOKEN

    @property
    def tokens_per_byte(self) -> float:
        """The ratio estimates use now."""
        return self._tokens_per_byte

    def estimate(self, body_bytes: int, media: MediaParts | None = None) -> int:
        """The tokens of a prompt sent in a body of ``body_bytes`` bytes holding ``media`` (rounded up)."""
        if media is None:
            return math.ceil(body_bytes * self._tokens_per_byte)
        text = max(0, body_bytes - media.chars)
        parts = sum(min(ALLOWANCES[kind], math.ceil(chars * self._tokens_per_byte)) for kind, chars in media.parts)
        return math.ceil(text * self._tokens_per_byte) + parts

    def observe(self, body_bytes: int, prompt_tokens: int, media: MediaParts | None = None) -> None:
        """An answer to a body of ``body_bytes`` bytes holding ``media`` reported ``prompt_tokens`` prompt tokens."""
        if body_bytes <= 0 or prompt_tokens <= 0 or (media is not None and media.parts):
            return
        self._ratios.add(prompt_tokens / body_bytes)
        self._tokens_per_byte = self._ratios.quantile(self.QUANTILE) or self._tokens_per_byte
