"""Anthropic Messages wire format (``/v1/messages``): ``message_start`` ... ``message_stop`` and errors."""

from __future__ import annotations

import json
from typing import Any

from llmguard_tools.sim.wire import TOKEN_TEXT

__all__ = ["MessagesWire", "anthropic_error_body"]

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def _event(obj: dict[str, Any]) -> bytes:
    name = str(obj["type"]).encode()
    return b"event: " + name + b"\ndata: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def anthropic_error_body(message: str, type_: str) -> bytes:
    """An Anthropic error object (the body of an HTTP error, or the data of an ``event: error``)."""
    return json.dumps({"type": "error", "error": {"type": type_, "message": message}}, separators=(",", ":")).encode()


class MessagesWire:
    """Encodes the answer to one ``/v1/messages`` request, with the same methods as `sim.wire.Wire`."""

    __slots__ = ("_id", "_model", "_prompt_tokens", "_token")

    def __init__(self, request_id: str, model: str, prompt_tokens: int) -> None:
        self._id = "msg_" + request_id
        self._model = model
        self._prompt_tokens = prompt_tokens
        self._token = self.token_of(TOKEN_TEXT)

    def _message(self, stop_reason: str | None, usage: dict[str, int], text: str | None = None) -> dict[str, Any]:
        content = [] if text is None else [{"type": "text", "text": text}]
        return {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }

    def opening(self) -> bytes:
        """``message_start``, ``content_block_start`` (empty text) and a ``ping``."""
        usage = {"input_tokens": self._prompt_tokens, "output_tokens": 1}
        start = {"type": "message_start", "message": self._message(None, usage)}
        block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        return _event(start) + _event(block) + _event({"type": "ping"})

    def token_of(self, text: str) -> bytes:
        return _event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}})

    def token(self) -> bytes:
        return self._token

    def closing(self, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> bytes:
        """``content_block_stop``, ``message_delta`` (stop reason, usage) and ``message_stop``."""
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": _STOP_REASONS.get(finish_reason, finish_reason), "stop_sequence": None},
            "usage": {"output_tokens": completion_tokens},
        }
        return _event({"type": "content_block_stop", "index": 0}) + _event(delta) + _event({"type": "message_stop"})

    def error_event(self, message: str, type_: str, code: int | None) -> bytes:
        """``event: error`` in Anthropic's shape (503/529: ``overloaded_error``, other 5xx: ``api_error``);
        nothing follows it."""
        kind = "overloaded_error" if code in (503, 529) else "api_error" if code and code >= 500 else type_
        return b"event: error\ndata: " + anthropic_error_body(message, kind) + b"\n\n"

    def malformed(self) -> bytes:
        return self._token[: len(self._token) // 2] + b"\n\n"

    def complete(self, completion_tokens: int, finish_reason: str, prompt_tokens: int) -> bytes:
        """The non-streaming ``message`` object."""
        usage = {"input_tokens": prompt_tokens, "output_tokens": completion_tokens}
        reason = _STOP_REASONS.get(finish_reason, finish_reason)
        return json.dumps(self._message(reason, usage, TOKEN_TEXT * completion_tokens)).encode()
