"""What the guard reads from a caller's request body: its JSON value, parsed once, and the facts the record
keeps (never the prompt itself)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["RequestFacts", "json_document"]


def json_document(request: httpx.Request, body: bytes) -> object:
    """The body's JSON value, parsed once per call for everything the guard reads from it; None when the body is
    empty, not JSON, or sent with a content type other than JSON."""
    if not body or "json" not in request.headers.get("content-type", "json"):
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


@dataclass(slots=True)
class RequestFacts:
    """What the guard reads from a request body: never the prompt itself."""

    model: str | None = None
    stream: bool = False
    max_tokens: int | None = None

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
        return cls(
            model=model if isinstance(model, str) else None,
            stream=obj.get("stream") is True,
            max_tokens=max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else None,
        )
