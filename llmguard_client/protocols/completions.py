"""OpenAI (legacy) Completions (``POST .../completions``): ``text_completion`` event streams.

The same framing, errors, end marker (``[DONE]`` or a ``finish_reason``) and usage as Chat Completions
(`llmguard_client.protocols.chat`); only the content differs: the first content token is the first
chunk with a non-empty ``choices[].text``.
"""

from __future__ import annotations

from typing import Any

from llmguard_client.protocols.base import ResponseFacts
from llmguard_client.protocols.chat import ChatReader, absorb_choices


def text_choice_has_content(choice: dict[str, Any]) -> bool:
    """A completions choice with non-empty text."""
    return bool(choice.get("text"))


def absorb_completions_body(facts: ResponseFacts, obj: dict[str, Any]) -> None:
    """Facts of a complete (non-streaming) ``text_completion`` body."""
    absorb_choices(facts, obj, text_choice_has_content)


class CompletionsReader(ChatReader):
    """Reads a Completions event stream."""

    __slots__ = ()
    protocol = "completions"
    _text_key = b'"text":'

    @staticmethod
    def has_content(choice: dict[str, Any]) -> bool:
        return text_choice_has_content(choice)

    @staticmethod
    def text_of(choice: dict[str, Any]) -> tuple[object, bool]:
        return choice.get("text"), True
