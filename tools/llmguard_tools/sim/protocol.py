"""Parsing request bodies (OpenAI Chat Completions / Completions / Responses, Anthropic Messages) into what
the engine needs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from llmguard_tools.sim.prefix_cache import BlockHasher

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
    block_hashes: tuple[int, ...] = ()
    """The prompt's chained block hashes (`llmguard_tools.sim.prefix_cache`); empty unless asked for."""


def count_words(content: object) -> int:
    """Words in a message content: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    return len(_text_of(content).split())


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _prompt_pieces(kind: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """The prompt's texts in prompt order (system / instructions first), each with its role; BadRequest if the
    prompt is missing."""
    if kind == "text":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return [(prompt, "")]
        if isinstance(prompt, list):
            return [(part, "") for part in prompt if isinstance(part, str)]
        raise BadRequest("'prompt' must be a string or a list of strings")
    head = body.get("system") if kind == "messages" else body.get("instructions") if kind == "responses" else None
    pieces = [(_text_of(head), "system")]
    items = body.get("input") if kind == "responses" else body.get("messages")
    if kind == "responses" and isinstance(items, str):
        return [*pieces, (items, "user")]
    if not isinstance(items, list) or not items:
        what = "'input' must be a string or a non-empty list of items" if kind == "responses" else None
        raise BadRequest(what or "'messages' must be a non-empty list")
    pieces += [(_text_of(i.get("content")), str(i.get("role", ""))) for i in items if isinstance(i, dict)]
    return pieces


def _prompt(kind: str, body: dict[str, Any], block_tokens: int) -> tuple[int, tuple[int, ...]]:
    """The prompt's words and, when ``block_tokens`` > 0, its block hashes: one ``split`` per message."""
    pieces = _prompt_pieces(kind, body)
    if block_tokens <= 0:
        return sum(len(text.split()) for text, _ in pieces), ()
    hasher = BlockHasher(block_tokens)
    for text, role in pieces:
        hasher.feed(text, role)
    return hasher.tokens, hasher.hashes()


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
    prompt_tokens, block_hashes = _prompt(kind, body, block_tokens)
    return CompletionRequest(
        kind=kind,
        model=model if isinstance(model, str) and model else default_model,
        prompt_tokens=max(1, prompt_tokens),
        max_tokens=max_tokens,
        stream=bool(body.get("stream")),
        include_usage=include_usage,
        ignore_eos=bool(body.get("ignore_eos")),
        block_hashes=block_hashes,
    )
