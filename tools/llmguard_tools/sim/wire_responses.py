"""OpenAI Responses API wire format (``/v1/responses``): typed SSE events and ``response`` objects."""

from __future__ import annotations

import json
from typing import Any

from llmguard_tools.sim.wire import TOKEN_TEXT

__all__ = ["ResponsesWire"]


def _event(obj: dict[str, Any]) -> bytes:
    name = str(obj["type"]).encode()
    return b"event: " + name + b"\ndata: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class ResponsesWire:
    """Encodes the answer to one ``/v1/responses`` request, with the same methods as `sim.wire.Wire`."""

    __slots__ = ("_created", "_id", "_item", "_model", "_seq", "_token")

    def __init__(self, request_id: str, created: int, model: str) -> None:
        self._id = "resp_" + request_id
        self._item = "msg_" + request_id
        self._created = created
        self._model = model
        self._seq = 0
        self._token = self.token_of(TOKEN_TEXT)

    def _next(self, obj: dict[str, Any]) -> bytes:
        obj["sequence_number"] = self._seq
        self._seq += 1
        return _event(obj)

    def _response(self, status: str, usage: dict[str, int] | None, text: str = "") -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        if status != "in_progress":
            part = {"type": "output_text", "text": text, "annotations": []}
            item = {"id": self._item, "type": "message", "status": "completed", "role": "assistant"}
            output = [{**item, "content": [part]}]
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self._id,
            "object": "response",
            "created_at": self._created,
            "status": status,
            "model": self._model,
            "output": output,
            "usage": usage,
            "error": None,
            "incomplete_details": incomplete,
        }

    def opening(self) -> bytes:
        """``response.created`` ... ``response.content_part.added``: everything before the first delta."""
        item = {"id": self._item, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        part = {"type": "output_text", "text": "", "annotations": []}
        where = {"item_id": self._item, "output_index": 0, "content_index": 0}
        return b"".join(
            (
                self._next({"type": "response.created", "response": self._response("in_progress", None)}),
                self._next({"type": "response.in_progress", "response": self._response("in_progress", None)}),
                self._next({"type": "response.output_item.added", "output_index": 0, "item": item}),
                self._next({"type": "response.content_part.added", **where, "part": part}),
            )
        )

    def token_of(self, text: str) -> bytes:
        """One ``response.output_text.delta`` (sequence numbers are not advanced: the bytes are cached)."""
        where = {"item_id": self._item, "output_index": 0, "content_index": 0}
        return _event({"type": "response.output_text.delta", "sequence_number": 0, **where, "delta": text})

    def token(self) -> bytes:
        return self._token

    def closing(self, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> bytes:
        """``response.output_text.done`` ... ``response.completed`` (``response.incomplete`` for ``length``)."""
        usage = {"input_tokens": prompt_tokens, "output_tokens": completion_tokens}
        usage["total_tokens"] = prompt_tokens + completion_tokens
        text = TOKEN_TEXT * completion_tokens
        status = "incomplete" if finish_reason == "length" else "completed"
        where = {"item_id": self._item, "output_index": 0, "content_index": 0}
        return b"".join(
            (
                self._next({"type": "response.output_text.done", **where, "text": text}),
                self._next({"type": f"response.{status}", "response": self._response(status, usage, text)}),
            )
        )

    def error_event(self, message: str, type_: str, code: int | None) -> bytes:
        """An ``error`` event (the Responses API's in-stream error); nothing follows it."""
        return self._next({"type": "error", "code": str(code) if code is not None else type_, "message": message})

    def malformed(self) -> bytes:
        return self._token[: len(self._token) // 2] + b"\n\n"

    def complete(self, completion_tokens: int, finish_reason: str, prompt_tokens: int) -> bytes:
        """The non-streaming ``response`` object."""
        usage = {"input_tokens": prompt_tokens, "output_tokens": completion_tokens}
        usage["total_tokens"] = prompt_tokens + completion_tokens
        status = "incomplete" if finish_reason == "length" else "completed"
        return json.dumps(self._response(status, usage, TOKEN_TEXT * completion_tokens)).encode()
