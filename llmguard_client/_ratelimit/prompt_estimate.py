"""A prompt's tokens estimated from its request body's bytes, at a ratio learnt from the answers' ``usage``.

A rate-limited attempt is charged before it is sent, so its prompt must be estimated without a tokenizer (the
guard never reads the prompt). Until an answer reports its ``usage``, a body is taken as `BYTES_PER_TOKEN` bytes
per token (English text in BPE vocabularies; the JSON around the messages makes it an over-estimate). Text that
packs more tokens into its bytes (CJK scripts, code, numbers, short synthetic words) made that an
under-estimate: the guard let through more tokens than the provider counted, and the provider answered 429.
So each answer's reported prompt tokens over its body's bytes is kept (the last `WINDOW`), and a body is
estimated at their `QUANTILE`: an over-estimate for most prompts like the recent ones, which the correction from
``usage`` gives back when the call ends.
"""

from __future__ import annotations

import math

from llmguard_client._routing.quantile import StreamingQuantile

__all__ = ["BYTES_PER_TOKEN", "PromptEstimator"]

BYTES_PER_TOKEN = 4
"""The ratio before any answer reported its usage: about 4 bytes per token for English text."""


class PromptEstimator:
    """Estimates prompt tokens from body bytes; `observe` teaches it the ratio the answers report."""

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

    def estimate(self, body_bytes: int) -> int:
        """The tokens of a prompt sent in a body of ``body_bytes`` bytes (rounded up)."""
        return math.ceil(body_bytes * self._tokens_per_byte)

    def observe(self, body_bytes: int, prompt_tokens: int) -> None:
        """An answer to a body of ``body_bytes`` bytes reported ``prompt_tokens`` prompt tokens."""
        if body_bytes <= 0 or prompt_tokens <= 0:
            return
        self._ratios.add(prompt_tokens / body_bytes)
        self._tokens_per_byte = self._ratios.quantile(self.QUANTILE) or self._tokens_per_byte
