"""Parsing request bodies (OpenAI Chat Completions / Completions / Responses, Anthropic Messages) into what
the engine needs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from llmguard_client.sim.prefix_cache import BlockHasher

__all__ = ["BadRequest", "CompletionRequest", "Kind", "count_words", "parse_request"]

Kind = Literal["chat", "text", "responses", "messages"]
"""``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``, ``/v1/messages``."""


class BadRequest(ValueError):
    """The body is not a valid completion request (answered with a 400)."""


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A parsed request. ``prompt_tokens`` is the number of whitespace-separated words of the prompt."""

    kind: Kind
    model: str
    prompt_tokens: int
    max_tokens: int | None
    stream: bool
    include_usage: bool
    ignore_eos: bool
    block_hashes: tuple[bytes, ...] = ()
    """The prompt's chained block hashes (`llmguard_client.sim.prefix_cache`); empty unless asked for."""


def count_words(content: object) -> int:
    """Words in a message content: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):
        return sum(count_words(part.get("text", "")) for part in content if isinstance(part, dict))
    return 0


def _prompt_words(kind: str, body: dict[str, Any]) -> int:
    if kind == "responses":
        items = body.get("input")
        if isinstance(items, str):
            return count_words(items)
        if not isinstance(items, list) or not items:
            raise BadRequest("'input' must be a string or a non-empty list of items")
        words = sum(count_words(i.get("content")) for i in items if isinstance(i, dict))
        return words + count_words(body.get("instructions"))
    if kind == "messages":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        words = sum(count_words(m.get("content")) for m in messages if isinstance(m, dict))
        return words + count_words(body.get("system"))
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


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _block_hashes(kind: str, body: dict[str, Any], block_tokens: int) -> tuple[bytes, ...]:
    """The prompt's block hashes, over its words in prompt order (system / instructions first)."""
    hasher = BlockHasher(block_tokens)
    if kind == "text":
        prompt = body.get("prompt")
        for part in prompt if isinstance(prompt, list) else [prompt]:
            hasher.feed(part if isinstance(part, str) else "")
        return hasher.hashes()
    head = body.get("system") if kind == "messages" else body.get("instructions") if kind == "responses" else None
    hasher.feed(_text_of(head), "system")
    items = body.get("input") if kind == "responses" else body.get("messages")
    if isinstance(items, str):
        hasher.feed(items, "user")
    elif isinstance(items, list):
        for item in items:
            if isinstance(item, dict):
                hasher.feed(_text_of(item.get("content")), str(item.get("role", "")))
    return hasher.hashes()


def parse_request(raw: bytes, kind: Kind, default_model: str, *, block_tokens: int = 0) -> CompletionRequest:
    """Parse and validate a request body of ``kind`` (see `Kind`); ``block_tokens`` > 0 also hashes its blocks."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", body.get("max_output_tokens")))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise BadRequest("'max_tokens' must be a positive integer")
    options = body.get("stream_options")
    asked = isinstance(options, dict) and bool(options.get("include_usage"))
    include_usage = asked or kind in ("responses", "messages")  # those two always report usage
    model = body.get("model")
    return CompletionRequest(
        kind=kind,
        model=model if isinstance(model, str) and model else default_model,
        prompt_tokens=max(1, _prompt_words(kind, body)),
        max_tokens=max_tokens,
        stream=bool(body.get("stream")),
        include_usage=include_usage,
        ignore_eos=bool(body.get("ignore_eos")),
        block_hashes=_block_hashes(kind, body, block_tokens) if block_tokens > 0 else (),
    )
