"""What the guard reads from a caller's request body: its JSON value, parsed once, and the facts the record
keeps (never the prompt itself)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["RequestFacts", "json_document", "prompt_chars"]

PROMPT_FIELDS = ("messages", "input", "prompt", "system", "instructions")
"""The top-level fields that hold a prompt: Chat Completions and Messages (``messages``, ``system``), Responses
(``input``, ``instructions``) and Completions (``prompt``)."""
TEXT_FIELDS = ("content", "text", "input")
"""Where a message, an input item or a content part holds its text."""
_MAX_DEPTH = 6


def json_document(request: httpx.Request, body: bytes) -> object:
    """The body's JSON value, parsed once per call for everything the guard reads from it; None when the body is
    empty, not JSON, or sent with a content type other than JSON."""
    if not body or "json" not in request.headers.get("content-type", "json"):
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def prompt_chars(document: dict[str, Any]) -> int | None:
    """The characters of text the body sends as its prompt (the JSON around it left out); None when it has no
    prompt field."""
    found = [document[name] for name in PROMPT_FIELDS if name in document]
    return sum(_text_chars(value, 0) for value in found) if found else None


def _text_chars(value: object, depth: int) -> int:
    if isinstance(value, str):
        return len(value)
    if depth >= _MAX_DEPTH:
        return 0
    if isinstance(value, list):
        return sum(_text_chars(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return sum(_text_chars(value[name], depth + 1) for name in TEXT_FIELDS if name in value)
    return 0


@dataclass(slots=True)
class RequestFacts:
    """What the guard reads from a request body: never the prompt itself (only its length)."""

    model: str | None = None
    stream: bool = False
    max_tokens: int | None = None
    prompt_chars: int | None = None
    """Characters of the prompt's text (`prompt_chars`); None when the body has no prompt field."""
    choices: int = 1
    """The choices asked for (``n``: Chat Completions and Completions), each streamed to its own finish reason; 1
    when absent or not a positive integer."""
    background: bool = False
    """The body asks the server to run the answer as a job of its own (the Responses API's ``"background": true``),
    which goes on when the connection closes: a second request would start, and bill, a second job."""

    @classmethod
    def parse(cls, request: httpx.Request, body: bytes) -> RequestFacts:
        return cls.of(json_document(request, body))

    @classmethod
    def of(cls, document: object) -> RequestFacts:
        """The facts of a body already parsed (`json_document`)."""
        if not isinstance(document, dict):
            return cls()
        obj: dict[str, Any] = document
        model = obj.get("model")
        max_tokens = obj.get("max_completion_tokens", obj.get("max_tokens", obj.get("max_output_tokens")))
        n = obj.get("n")
        return cls(
            model=model if isinstance(model, str) else None,
            stream=obj.get("stream") is True,
            max_tokens=max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else None,
            prompt_chars=prompt_chars(obj),
            choices=n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1,
            background=obj.get("background") is True,
        )
