"""An embeddings answer (``POST .../embeddings``, JSON): passed through as any body, its model and usage noted.

It flows to the caller as a `PassthroughReader`'s body does (first bytes = first token, never a failure, so an
embeddings call is retried as before: on connect errors only). The body can be megabytes of vectors, so it is
not parsed whole: its first and last `EDGE` bytes are kept, where OpenAI's and vLLM's answers put ``model``
(before ``data`` or after it) and ``usage`` (last). The vectors hold numbers or base64 strings, never a key.
An embedding generates no tokens: a usage without ``completion_tokens`` (OpenAI's has ``prompt_tokens`` and
``total_tokens`` only) counts 0 of them, as vLLM's says, so the call's tokens are known (a rate limit's charge is
corrected to them).
"""

from __future__ import annotations

import json
import re

from llmguard_client.protocols.base import StreamFailure
from llmguard_client.protocols.passthrough import PassthroughReader

EDGE = 4096
"""Bytes kept from each end of the body."""
_MODEL = re.compile(rb'"model"\s*:\s*("(?:[^"\\]|\\.)*")')
_USAGE = re.compile(rb'"usage"\s*:\s*(\{(?:[^{}]|\{[^{}]*\})*\})')  # one level of nesting: token details


class EmbeddingsReader(PassthroughReader):
    """See the module docstring."""

    __slots__ = ("_head", "_tail")
    protocol = "embeddings"

    def __init__(self) -> None:
        super().__init__()
        self._head = b""
        self._tail = b""

    def feed(self, chunk: bytes) -> bool:
        if len(self._head) < EDGE:
            self._head += chunk[: EDGE - len(self._head)]
        self._tail = (self._tail + chunk[-EDGE:])[-EDGE:]  # at most 2 x EDGE copied per chunk
        return super().feed(chunk)

    def end_of_body(self) -> StreamFailure | None:
        facts = self.facts
        for edge in (self._head, self._tail):
            model = _MODEL.search(edge)
            if model is not None and facts.model is None:
                facts.identify({"model": _loads(model.group(1))})
        # The top-level usage follows the data array: one in an item of it (a proxy's extra) is not the answer's.
        usage = _USAGE.search(_after_data(self._tail)) or _USAGE.search(_after_data(self._head))
        if usage is not None:
            facts.count(_loads(usage.group(1)), "prompt_tokens", "completion_tokens")
            if facts.prompt_tokens is not None and facts.completion_tokens is None:
                facts.completion_tokens = 0
        self._head = self._tail = b""
        return super().end_of_body()


def _after_data(edge: bytes) -> bytes:
    """The part of ``edge`` after its last ``]`` (the end of the data array, when it holds it), else all of it."""
    return edge[edge.rfind(b"]") + 1 :]


def _loads(text: bytes) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None
