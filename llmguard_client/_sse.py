"""Incremental reading of OpenAI-style responses: the first content token, usage, ids.

`SSEScanner` is fed the raw bytes of a ``text/event-stream`` body chunk by chunk,
in the order they arrive, and never alters them (the transport replays the same
bytes to the caller). Until the first content token it decodes every event; after
it, only the few events that can carry usage or a finish reason, so the per-chunk
cost of a flowing stream is a byte split and two substring checks.

A first content token is the first event whose ``choices[].delta`` carries a
non-empty ``content``, ``tool_calls``, ``reasoning_content`` or ``reasoning`` (chat),
or whose ``choices[].text`` is non-empty (completions). Role-only deltas, comments,
keep-alives and empty events do not count.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from llmguard_client.telemetry.record import CallStatus

_CONTENT_KEYS = ("content", "tool_calls", "reasoning_content", "reasoning")
# After the first token only events that may carry usage or a non-null finish reason are decoded.
_LATE_MARKERS = (b"prompt_tokens", b'"finish_reason":"', b'"finish_reason": "')


class ResponseFacts:
    """What the guard learns from a response body; no text is ever kept."""

    __slots__ = ("completion_tokens", "finish_reasons", "model", "prompt_tokens", "response_id")

    def __init__(self) -> None:
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.response_id: str | None = None
        self.model: str | None = None
        self.finish_reasons: list[str] = []

    def absorb(self, obj: Any) -> bool:
        """Take ids, usage and finish reasons from one decoded chunk or body; True if it carries content."""
        if not isinstance(obj, dict):
            return False
        if self.response_id is None and isinstance(obj.get("id"), str):
            self.response_id = obj["id"]
        if self.model is None and isinstance(obj.get("model"), str):
            self.model = obj["model"]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int):
                self.prompt_tokens = prompt
            if isinstance(completion, int):
                self.completion_tokens = completion
        has_content = False
        choices = obj.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if not isinstance(choice, dict):
                    continue
                reason = choice.get("finish_reason")
                if isinstance(reason, str):
                    self.finish_reasons.append(reason)
                if choice.get("text"):
                    has_content = True
                for holder in (choice.get("delta"), choice.get("message")):
                    if isinstance(holder, dict) and any(holder.get(k) for k in _CONTENT_KEYS):
                        has_content = True
        return has_content


class SSEScanner:
    """Feed it the bytes of an SSE body; it tells when the first content token has arrived."""

    __slots__ = ("_data", "_partial", "_skip_lf", "chunks", "done", "facts", "first_token", "malformed")

    def __init__(self) -> None:
        self._partial = b""
        self._skip_lf = False
        self._data: list[bytes] = []
        self.first_token = False
        self.chunks = 0
        """Data events from the first content token on (the token's own included; ``[DONE]`` not)."""
        self.done = False
        self.malformed = 0
        """Data events that open a JSON object and do not close it (a truncated event): a broken stream."""
        self.facts = ResponseFacts()

    def feed(self, chunk: bytes) -> bool:
        """Consume one chunk; returns True once a first content token has been seen (in it or before)."""
        data = self._partial + chunk if self._partial else chunk
        if self._skip_lf:  # the previous chunk ended with CR: a leading LF completes that CRLF
            self._skip_lf = False
            if data.startswith(b"\n"):
                data = data[1:]
        if b"\r" in data:  # CRLF or bare-CR line endings (rare): normalise to LF
            self._skip_lf = data.endswith(b"\r")
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if not line:
                if self._data:
                    self._dispatch(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
        return self.first_token

    def _dispatch(self, data: bytes) -> None:
        if data.strip() == b"[DONE]":
            self.done = True
            return
        if self.first_token:
            self.chunks += 1
            if not any(marker in data for marker in _LATE_MARKERS):
                if data.startswith(b"{") and not data.endswith(b"}") and not data.rstrip().endswith(b"}"):
                    self.malformed += 1
                return
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            if data.startswith(b"{"):
                self.malformed += 1
            return  # not JSON (a vendor ping, a malformed event): never a token
        if self.facts.absorb(obj) and not self.first_token:
            self.first_token = True
            self.chunks = 1


def body_facts(body: bytes) -> ResponseFacts:
    """Facts of a complete (non-streaming) JSON body; empty facts if it is not JSON."""
    facts = ResponseFacts()
    with contextlib.suppress(ValueError, RecursionError):
        facts.absorb(json.loads(body))
    return facts


def stream_outcome(
    status: CallStatus, scanner: SSEScanner | None, facts: ResponseFacts, first_token: float | None, now: float
) -> tuple[bool | None, int | None, float | None]:
    """``(ok, tokens, duration)`` for `llmguard_client._routing.Router.stream_finished`, from how a
    delivered body ended.

    ok: True for a complete body; False for a mid-stream failure (transport error, stall or total
    timeout) or an SSE stream that ended cleanly but broken (a malformed event, or neither ``[DONE]``
    nor a finish reason: truncated); None when the caller closed it early (nothing to blame). Timing
    (tokens after the first token over the seconds since it) only for SSE streams.
    """
    ok: bool | None
    if status == "ok":
        ok = scanner is None or (scanner.malformed == 0 and (scanner.done or bool(facts.finish_reasons)))
    elif status == "abandoned":
        ok = True if scanner is not None and scanner.done and scanner.malformed == 0 else None
    else:
        ok = False
    if scanner is None or first_token is None:
        return ok, None, None
    tokens = facts.completion_tokens if facts.completion_tokens is not None else scanner.chunks
    return ok, tokens, now - first_token
