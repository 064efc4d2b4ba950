"""OpenAI wire format: ``chat.completion(.chunk)`` and ``text_completion`` objects, SSE framing, errors."""

from __future__ import annotations

import json
from typing import Any, Literal

__all__ = ["DONE", "TOKEN_TEXT", "Wire", "error_body", "sse"]

DONE = b"data: [DONE]\n\n"
TOKEN_TEXT = " tok"
"""The text of every generated token."""

Kind = Literal["chat", "text"]


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def sse(obj: object) -> bytes:
    """One SSE event: ``data: {json}`` and a blank line."""
    return b"data: " + _dumps(obj) + b"\n\n"


def error_body(message: str, type_: str, code: str | None = None) -> bytes:
    """An OpenAI-style error object."""
    return _dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class Wire:
    """Encodes the responses of one request (``chat`` for /v1/chat/completions, ``text`` for /v1/completions)."""

    __slots__ = ("_base", "_include_usage", "_kind", "_token")

    def __init__(self, kind: Kind, request_id: str, created: int, model: str, *, include_usage: bool) -> None:
        self._kind: Kind = kind
        self._include_usage = include_usage
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        self._base: dict[str, Any] = {"id": request_id, "object": obj, "created": created, "model": model}
        if kind == "chat":
            self._base["system_fingerprint"] = None
        self._token = self.token_of(TOKEN_TEXT)

    def _choice(self, text: str | None, finish_reason: str | None, *, role: bool = False) -> dict[str, Any]:
        if self._kind == "text":
            return {"text": text or "", "index": 0, "logprobs": None, "finish_reason": finish_reason}
        delta: dict[str, str] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    def _chunk(self, choice: dict[str, Any]) -> bytes:
        body = {**self._base, "choices": [choice]}
        if self._include_usage:
            body["usage"] = None
        return sse(body)

    def opening(self) -> bytes:
        """What precedes the first token: the role chunk (chat), nothing (completions)."""
        return self.role() or b""

    def token_of(self, text: str) -> bytes:
        """One content chunk carrying ``text``."""
        return self._chunk(self._choice(text, None))

    def closing(self, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The finish chunk, the usage chunk (if asked for) and ``[DONE]``."""
        return self.finish(finish_reason) + (self.usage(prompt_tokens, completion_tokens) or b"") + DONE

    def error_event(self, message: str, type_: str, code: int | None) -> bytes:
        """vLLM's in-stream error (``data: {"error": {..., "code": 503}}``) followed by ``[DONE]``."""
        error = {"message": message, "type": type_, "param": None, "code": code}
        return sse({"error": error}) + DONE

    def role(self) -> bytes | None:
        """The first chat chunk (``delta.role="assistant"``, empty content); None for text completions."""
        return self._chunk(self._choice("", None, role=True)) if self._kind == "chat" else None

    def token(self) -> bytes:
        """One content chunk carrying `TOKEN_TEXT` (identical bytes for every token of a request)."""
        return self._token

    def finish(self, reason: str) -> bytes:
        """The chunk carrying ``finish_reason``."""
        return self._chunk(self._choice(None if self._kind == "chat" else "", reason))

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes | None:
        """The trailing usage chunk (``choices: []``) when ``stream_options.include_usage`` was set."""
        if not self._include_usage:
            return None
        return sse({**self._base, "choices": [], "usage": _usage(prompt_tokens, completion_tokens)})

    def malformed(self) -> bytes:
        """An SSE event whose data is truncated JSON."""
        return self._token[: len(self._token) // 2] + b"\n\n"

    def complete(self, completion_tokens: int, finish_reason: str, prompt_tokens: int) -> bytes:
        """The non-streaming response body."""
        text = TOKEN_TEXT * completion_tokens
        body = {**self._base, "usage": _usage(prompt_tokens, completion_tokens)}
        if self._kind == "chat":
            body["object"] = "chat.completion"
            message = {"role": "assistant", "content": text, "refusal": None}
            body["choices"] = [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}]
        else:
            body["choices"] = [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}]
        return _dumps(body)
