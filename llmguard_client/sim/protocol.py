"""Parsing OpenAI-compatible request bodies into what the engine needs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["BadRequest", "CompletionRequest", "count_words", "parse_request"]


class BadRequest(ValueError):
    """The body is not a valid completion request (answered with a 400)."""


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A parsed request. ``prompt_tokens`` is the number of whitespace-separated words of the prompt."""

    kind: Literal["chat", "text"]
    model: str
    prompt_tokens: int
    max_tokens: int | None
    stream: bool
    include_usage: bool
    ignore_eos: bool


def count_words(content: object) -> int:
    """Words in a message content: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):
        return sum(count_words(part.get("text", "")) for part in content if isinstance(part, dict))
    return 0


def _prompt_words(kind: str, body: dict[str, Any]) -> int:
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        return sum(count_words(m.get("content")) for m in messages if isinstance(m, dict))
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return sum(count_words(p) for p in prompt)
    if isinstance(prompt, str):
        return count_words(prompt)
    raise BadRequest("'prompt' must be a string or a list of strings")


def parse_request(raw: bytes, kind: Literal["chat", "text"], default_model: str) -> CompletionRequest:
    """Parse and validate a /v1/chat/completions (``chat``) or /v1/completions (``text``) body."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise BadRequest("'max_tokens' must be a positive integer")
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    model = body.get("model")
    return CompletionRequest(
        kind=kind,
        model=model if isinstance(model, str) and model else default_model,
        prompt_tokens=max(1, _prompt_words(kind, body)),
        max_tokens=max_tokens,
        stream=bool(body.get("stream")),
        include_usage=include_usage,
        ignore_eos=bool(body.get("ignore_eos")),
    )
