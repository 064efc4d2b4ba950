"""How much of a replica a call takes: its size (prompt and ``max_tokens``) against the average call's.

An engine's memory holds each request's prompt and the tokens it generates, so a replica serves more small calls
than large ones at once. The guard keeps no prompt, but counts its text: a call's size is the characters of its
prompt's text (the body's bytes when it has no prompt field the guard knows) at `CHARS_PER_TOKEN`, plus its
``max_tokens`` (`DEFAULT_OUTPUT` when it sets none), and its weight that size over the recent calls' average (an
EWMA), so the limit keeps counting calls of an average size. The JSON around the prompt is left out: it weighs
the same in every call and would make small calls look larger than they are.
"""

from __future__ import annotations

__all__ = ["CHARS_PER_TOKEN", "DEFAULT_OUTPUT", "CallSizes"]

CHARS_PER_TOKEN = 4
"""Prompt characters per token (English text in BPE vocabularies; only the ratio between calls matters)."""
DEFAULT_OUTPUT = 256
"""Output tokens counted for a call that sets no ``max_tokens``."""
_EWMA = 0.05
_MIN_WEIGHT, _MAX_WEIGHT = 0.05, 20.0


class CallSizes:
    """The average call's size, learned from the calls weighed; `weight` of one call against it."""

    __slots__ = ("mean",)

    def __init__(self) -> None:
        self.mean: float | None = None

    def weight(self, prompt_chars: int, max_tokens: int | None) -> float:
        """The call's size over the average (which it joins); 1.0 for the first call."""
        size = prompt_chars / CHARS_PER_TOKEN + (DEFAULT_OUTPUT if max_tokens is None else max_tokens)
        mean = self.mean = size if self.mean is None else self.mean + _EWMA * (size - self.mean)
        return min(_MAX_WEIGHT, max(_MIN_WEIGHT, size / mean)) if mean > 0 else 1.0
