"""The wire encoder of each simulated endpoint, behind one interface."""

from __future__ import annotations

import time
import uuid
from typing import Protocol

from llmguard_tools.sim.protocol import CompletionRequest
from llmguard_tools.sim.wire import Wire
from llmguard_tools.sim.wire_messages import MessagesWire
from llmguard_tools.sim.wire_responses import ResponsesWire

__all__ = ["StreamWire", "wire_for"]


class StreamWire(Protocol):
    """Encodes one request's answer; every method returns the bytes to send."""

    def opening(self) -> bytes:
        """Everything a stream sends before its first content token."""

    def token(self) -> bytes:
        """One content token (identical bytes for every token of a request)."""

    def closing(self, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> bytes:
        """Finish reason, usage and the protocol's end marker."""

    def error_event(self, message: str, type_: str, code: int | None) -> bytes:
        """An in-stream error in the protocol's shape, and what the protocol sends after one."""

    def malformed(self) -> bytes:
        """An event whose data is truncated JSON."""

    def complete(self, completion_tokens: int, finish_reason: str, prompt_tokens: int) -> bytes:
        """The non-streaming body."""


def wire_for(parsed: CompletionRequest) -> StreamWire:
    """The encoder for ``parsed``'s endpoint."""
    tag = uuid.uuid4().hex[:24]
    created = int(time.time())
    if parsed.kind == "responses":
        return ResponsesWire(tag, created, parsed.model)
    if parsed.kind == "messages":
        return MessagesWire(tag, parsed.model, parsed.prompt_tokens)
    prefix = "chatcmpl" if parsed.kind == "chat" else "cmpl"
    include_usage = parsed.stream and parsed.include_usage
    return Wire(parsed.kind, f"{prefix}-{tag}", created, parsed.model, include_usage=include_usage)
