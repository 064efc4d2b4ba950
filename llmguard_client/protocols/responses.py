"""OpenAI Responses API (``POST .../responses``): typed events (``event: response.output_text.delta``).

- first content token: the first ``*.delta`` event with a non-empty ``delta`` (output text, refusal,
  function-call arguments, reasoning text or summary, audio), or a generated image's first partial image
  (``response.image_generation_call.partial_image``: an answer that is an image has no delta); ``response.created``,
  ``response.in_progress``, ``response.output_item.added`` and the like do not count;
- in-stream error: an ``error`` event (``{"type": "error", "code": ..., "message": ...}``, or any
  data under ``event: error``, e.g. vLLM's ``{"type": "error", "error": {...}}``) or ``response.failed``
  (its ``response.error``);
- end marker: ``response.completed`` or ``response.incomplete`` (e.g. ``max_output_tokens`` reached), or a
  ``data: [DONE]`` line, at which the openai SDK ends any stream (a proxy may add one after the last event);
  nothing after the end marker is judged;
- usage: ``response.usage.input_tokens`` / ``output_tokens`` in the final event; id and model from
  ``response.created``; the finish reason is ``incomplete_details.reason`` or the final ``status``.

After the first token every ``*.delta`` event is counted, not decoded.
"""

from __future__ import annotations

from typing import Any

from llmguard_client.protocols.base import ANSWER_FAILED, ResponseFacts
from llmguard_client.protocols.sse import SSEReader

_ENDS = frozenset({"response.completed", "response.incomplete"})


def absorb_response(facts: ResponseFacts, response: object) -> None:
    """Facts of a ``response`` object (a stream's final event or a non-streaming body)."""
    if not isinstance(response, dict):
        return
    facts.identify(response)
    facts.count(response.get("usage"), "input_tokens", "output_tokens")
    status = response.get("status")
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    if isinstance(reason, str):
        facts.finish_reasons.append(reason)
    elif isinstance(status, str) and status not in ("in_progress", "queued"):
        facts.finish_reasons.append(status)
    if status == "failed":
        facts.failed = ANSWER_FAILED


class ResponsesReader(SSEReader):
    """Reads a Responses API event stream; see the module docstring."""

    __slots__ = ()
    protocol = "responses"
    end_marker = "response.completed or response.incomplete"
    errors_are_events = True  # the openai SDK yields ``error`` / ``response.failed`` and reads on

    def event(self, name: bytes, data: bytes) -> None:
        if self.complete:  # past the end marker, as the SDK reads it
            return
        if len(data) < 16 and data.strip() == b"[DONE]":
            self.complete = True
            return
        if self.first_token:
            self._events += 1
            if data.find(b'.delta"') >= 0:
                return
        obj = self.decode(data, "a Responses API event")
        if obj is None:
            return
        kind = obj.get("type")
        if not isinstance(kind, str):
            kind = name.decode("utf-8", "replace")
        if kind == "error" or name == b"error":
            error: Any = obj.get("error")
            self.fail_with(error if isinstance(error, dict) else obj)
        elif kind == "response.failed":
            response = obj.get("response")
            absorb_response(self.facts, response)
            error = response.get("error") if isinstance(response, dict) else None
            self.fail_with(error or {"message": "response.failed without an error object", "code": "server_error"})
        elif kind in _ENDS:
            absorb_response(self.facts, obj.get("response"))
            self.complete = True
        elif kind.endswith(".delta") or kind.endswith(".partial_image"):
            if (obj.get("delta") or obj.get("partial_image_b64")) and not self.first_token:
                self.first_token = True
                self._events = 1
        elif kind.startswith("response.") and isinstance(obj.get("response"), dict):
            self.accepted = True  # response.created / response.in_progress / response.queued: not a token
            self.facts.identify(obj["response"])
