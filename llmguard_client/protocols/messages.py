"""Anthropic Messages (``POST .../messages``): ``message_start`` ... ``message_stop`` event streams.

- first content token: the first ``content_block_delta`` with a non-empty ``text``, ``partial_json``
  or ``thinking`` (or a ``content_block_start`` already holding text); ``message_start``, ``ping``
  and empty deltas do not count;
- in-stream error: ``event: error`` / ``{"type": "error", "error": {"type": "overloaded_error", ...}}``
  (``overloaded_error`` means overload; Anthropic answers it over HTTP as 529);
- end marker: ``message_stop``, or a ``message_delta`` whose ``delta.stop_reason`` is set (the answer is
  whole there: some proxies that translate to Anthropic's format end the stream after it, without
  ``message_stop``, and the anthropic SDK hands such a stream over as complete);
- usage: ``message_start.message.usage.input_tokens``, ``message_delta.usage.output_tokens`` (the
  ``output_tokens`` of ``message_start`` is a placeholder, 1, and is not taken: a stream cut before its
  ``message_delta`` has no count, as a cut Chat Completions stream); the finish reason is
  ``message_delta.delta.stop_reason``.

After the first token every ``content_block_delta`` event is counted, not decoded.
"""

from __future__ import annotations

from typing import Any

from llmguard_client.protocols.base import ResponseFacts
from llmguard_client.protocols.sse import SSEReader

_DELTA_CONTENT = ("text", "partial_json", "thinking")


def absorb_message_body(facts: ResponseFacts, obj: dict[str, Any]) -> None:
    """Facts of a complete ``message`` object (a non-streaming body, or ``message_start``'s)."""
    facts.identify(obj)
    facts.count(obj.get("usage"), "input_tokens", "output_tokens")
    reason = obj.get("stop_reason")
    if isinstance(reason, str):
        facts.finish_reasons.append(reason)


class MessagesReader(SSEReader):
    """Reads an Anthropic Messages event stream; see the module docstring."""

    __slots__ = ()
    protocol = "messages"
    end_marker = "message_stop or a message_delta with a stop_reason"

    def event(self, name: bytes, data: bytes) -> None:
        if self.first_token:
            self._events += 1
            if data.find(b'"content_block_delta"') >= 0:
                return
        obj = self.decode(data, "a Messages event")
        if obj is None:
            return
        kind = obj.get("type")
        if kind == "error" or name == b"error":
            error = obj.get("error")
            self.fail_with(error or obj, envelope=obj if error else None)
        elif kind == "content_block_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict) and any(delta.get(k) for k in _DELTA_CONTENT):
                self._first()
        elif kind == "message_start":
            self.accepted = True
            message = obj.get("message")
            if isinstance(message, dict):
                absorb_message_body(self.facts, message)
                self.facts.completion_tokens = None  # its output_tokens is a placeholder (1): message_delta counts
        elif kind == "message_delta":
            usage = obj.get("usage")
            if isinstance(usage, dict):
                self.facts.count({"input_tokens": self.facts.prompt_tokens, **usage}, "input_tokens", "output_tokens")
            delta = obj.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                self.facts.finish_reasons.append(delta["stop_reason"])
                self.complete = True
        elif kind == "message_stop":
            self.complete = True
        elif kind == "content_block_start":
            block = obj.get("content_block")
            if isinstance(block, dict) and any(block.get(k) for k in _DELTA_CONTENT):
                self._first()

    def _first(self) -> None:
        if not self.first_token:
            self.first_token = True
            self._events = 1
