"""Plain (non-event-stream) bodies of the known protocols.

- `BodyReader`: a non-streaming JSON answer. It is read whole (its "first token" is the complete
  body, as a tier's ``ttft`` says for non-streaming calls); an error object inside a 200 (``error_body``)
  is a failure. A body that is no JSON object (cut short, invalid UTF-8, not JSON) is handed to the caller as
  it came, and the SDK raises its own error at it, as without a guard (sending it again would generate it
  again): it is complete, its record an error (`MALFORMED_BODY`).
- `NotAStreamReader`: a stream was asked for, and a plain body came (a replica that ignored
  ``stream: true``, a proxy's JSON error with status 200): always a failure (``json_body`` /
  ``not_sse``), read up to `PLAIN_BODY_LIMIT` bytes to carry the error it may hold.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from llmguard_client.protocols.base import MALFORMED_BODY, FailureKind, ResponseFacts, StreamFailure, StreamReader
from llmguard_client.protocols.errors import error_failure

PLAIN_BODY_LIMIT = 64 * 1024
"""Bytes of an unexpected plain body read (to find an error in it) before it is judged anyway."""

Absorb = Callable[[ResponseFacts, dict[str, Any]], None]
"""Takes a protocol's facts from its complete JSON body."""


_ANSWER_KEYS = ("choices", "output", "content")
"""A body with one of these is the protocol's answer, even one whose ``error`` is set: a Responses API
response with ``status: "failed"`` (``output: []``) is handed to the caller as the SDK returns it."""


def _error_in(obj: dict[str, Any]) -> object:
    """The error object of a JSON error body (OpenAI/vLLM ``{"error": ...}``, Anthropic ``type: error``)."""
    error = obj.get("error")
    if error and not any(key in obj for key in _ANSWER_KEYS):
        return error
    return None


class BodyReader(StreamReader):
    """A complete JSON body; see the module docstring."""

    __slots__ = ("_absorb", "_parts")
    protocol = "body"

    def __init__(self, absorb: Absorb) -> None:
        super().__init__()
        self._absorb = absorb
        self._parts: list[bytes] = []

    def feed(self, chunk: bytes) -> bool:
        self._parts.append(chunk)
        return False

    def end_of_body(self) -> StreamFailure | None:
        body = b"".join(self._parts)
        self._parts = []
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            obj = None
        if not isinstance(obj, dict):  # the caller's SDK raises at it
            self.facts.failed = MALFORMED_BODY
            self.first_token = self.complete = True
            return None
        error = _error_in(obj)
        if error:
            self.failure = error_failure(error, "error_body", obj.get("error_type"))
            return self.failure
        self._absorb(self.facts, obj)
        self.first_token = self.complete = True
        return None


class NotAStreamReader(StreamReader):
    """A plain body where an event stream was asked for; see the module docstring."""

    __slots__ = ("_json", "_parts", "_size")
    protocol = "body"

    def __init__(self, *, json_body: bool) -> None:
        super().__init__()
        self._json = json_body
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> bool:
        self._parts.append(chunk)
        self._size += len(chunk)
        if self._size > PLAIN_BODY_LIMIT:
            self._judge(None)
        return False

    def end_of_body(self) -> StreamFailure | None:
        if self.failure is None:
            try:
                obj = json.loads(b"".join(self._parts))
            except (ValueError, RecursionError):
                obj = None
            self._judge(obj if isinstance(obj, dict) else None)
        return self.failure

    def _judge(self, obj: dict[str, Any] | None) -> None:
        kind: FailureKind = "json_body" if self._json else "not_sse"
        error = _error_in(obj) if obj is not None else None
        if error:
            self.failure = error_failure(error, kind, obj.get("error_type") if obj else None)
        else:
            what = "a JSON body" if self._json else "a body that is not an event stream"
            self.failure = StreamFailure(kind, f"a stream was asked for (stream: true) and the replica answered {what}")
        self._parts = []
