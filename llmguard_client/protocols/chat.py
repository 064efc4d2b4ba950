"""OpenAI Chat Completions (``POST .../chat/completions``): ``chat.completion.chunk`` event streams.

- first content token: the first chunk whose ``choices[].delta`` carries a non-empty ``content``,
  ``tool_calls``, ``function_call``, ``refusal``, ``reasoning_content`` or ``reasoning``; role-only
  and empty deltas do not count;
- in-stream error: an event whose JSON has a non-empty top-level ``error`` (vLLM's queue overflow:
  ``{"error": {..., "code": 503}}`` then ``[DONE]``; TGI: ``{"error": "...", "error_type": ...}``),
  or an ``event: error``;
- end marker: ``data: [DONE]`` or any ``finish_reason`` (with ``n > 1`` the first choice to finish
  ends the judging: a later truncation of another choice is not detected);
- usage: ``usage.prompt_tokens`` / ``usage.completion_tokens``, usually in a last ``choices: []``
  chunk (``stream_options.include_usage``).

After the first token only events holding ``prompt_tokens``, a non-null ``finish_reason`` or an
``"error"`` key are decoded; a chunk of whole events holding none of these (nor ``[DONE]``) is not
even split into lines, its events are only counted.
"""

from __future__ import annotations

import re
from typing import Any

from llmguard_client.protocols.base import ResponseFacts
from llmguard_client.protocols.sse import SSEReader

_INTERESTING = re.compile(rb'prompt_tokens|_reason": ?"|error|\[DONE\]|\r')
"""What makes a chunk worth splitting after the first token (one regex scan beats five substring checks)."""
_DELTA_CONTENT = ("content", "tool_calls", "function_call", "refusal", "reasoning_content", "reasoning")


def _message_has_content(holder: object) -> bool:
    return isinstance(holder, dict) and any(holder.get(k) for k in _DELTA_CONTENT)


def chat_choice_has_content(choice: dict[str, Any]) -> bool:
    """A chat choice (streamed ``delta`` or complete ``message``) with visible output."""
    return _message_has_content(choice.get("delta")) or _message_has_content(choice.get("message"))


def absorb_choices(facts: ResponseFacts, obj: dict[str, Any], has_content: Any) -> bool:
    """Ids, usage and finish reasons of one chunk or body; True if a choice carries content."""
    facts.identify(obj)
    facts.count(obj.get("usage"), "prompt_tokens", "completion_tokens")
    found = False
    choices = obj.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                facts.finish_reasons.append(reason)
            if not found and has_content(choice):
                found = True
    return found


def absorb_chat_body(facts: ResponseFacts, obj: dict[str, Any]) -> None:
    """Facts of a complete (non-streaming) ``chat.completion`` body."""
    absorb_choices(facts, obj, chat_choice_has_content)


class ChatReader(SSEReader):
    """Reads a Chat Completions event stream; see the module docstring."""

    __slots__ = ()
    protocol = "chat"
    end_marker = "[DONE] or a finish_reason"

    @staticmethod
    def has_content(choice: dict[str, Any]) -> bool:
        return chat_choice_has_content(choice)

    def skippable(self, chunk: bytes) -> bool:
        return chunk.endswith(b"\n\n") and _INTERESTING.search(chunk) is None

    def event(self, name: bytes, data: bytes) -> None:
        if self.first_token:
            # The cheap path: only events that may hold usage, a finish reason or an error are decoded.
            if (
                b"prompt_tokens" not in data
                and b'"finish_reason":"' not in data
                and b'"finish_reason": "' not in data
                and b'"error"' not in data
                and name != b"error"
            ):
                if len(data) < 16 and data.strip() == b"[DONE]":
                    self.complete = True
                else:
                    self._events += 1
                return
            self._events += 1
        elif len(data) < 16 and data.strip() == b"[DONE]":
            self.complete = True
            return
        obj = self.decode(data, f"a {self.protocol} stream event")
        if obj is None:
            return
        error = obj.get("error")
        if error or name == b"error":
            self.fail_with(error or obj, obj.get("error_type"))
            return
        content = absorb_choices(self.facts, obj, self.has_content)
        if self.facts.finish_reasons:
            self.complete = True
        if content and not self.first_token:
            self.first_token = True
            self._events = 1
