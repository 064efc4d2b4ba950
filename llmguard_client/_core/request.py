"""What the guard reads from a caller's request body: its JSON value, parsed once, and the facts the record
keeps (never the prompt itself)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["NO_MEDIA", "PromptMedia", "RequestFacts", "json_document", "prompt_chars"]

PROMPT_FIELDS = ("messages", "input", "prompt", "system", "instructions")
"""The top-level fields that hold a prompt: Chat Completions and Messages (``messages``, ``system``), Responses
(``input``, ``instructions``) and Completions (``prompt``)."""
TEXT_FIELDS = ("content", "text", "input", "output")
"""Where a message, an input item or a content part holds its text; ``output``: a tool's output sent back as an input
item (Responses' ``function_call_output``, text or content parts, and ``computer_call_output``, a screenshot)."""
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


MEDIA_KINDS = {
    "image_url": "image",  # Chat Completions
    "input_image": "image",  # Responses
    "image": "image",  # Messages
    "input_audio": "audio",  # Chat Completions
    "file": "file",  # Chat Completions (a PDF)
    "input_file": "file",  # Responses
    "document": "file",  # Messages (a PDF; one whose source is text or content blocks is text)
    "computer_screenshot": "image",  # Responses, a computer_call_output's
}
"""A content part's ``type`` that sends media, and which kind: the provider counts it by what it holds (an image's
size, an audio clip's length, a document's pages), never by its bytes. An image sent with ``"detail": "low"`` (Chat
Completions' ``image_url.detail``, Responses' ``detail``) is of its own kind: OpenAI counts it at a fixed size."""
_LOW_DETAIL = "low"
_TEXT_SOURCES = ("text", "content")


@dataclass(frozen=True, slots=True)
class PromptMedia:
    """The media parts a prompt sends (images, audio clips, files), each with the characters of the body it takes
    (its data, URL or id): the rest of the body is text and the JSON around it."""

    parts: tuple[tuple[str, int], ...] = ()
    """Each part's kind (a `MEDIA_KINDS` value, or ``low_detail_image``) and characters, in the body's order."""

    def count(self, kind: str) -> int:
        """The parts of ``kind``."""
        return sum(1 for name, _ in self.parts if name == kind)

    @property
    def chars(self) -> int:
        """The characters of the body the parts take."""
        return sum(chars for _, chars in self.parts)


NO_MEDIA = PromptMedia()


def prompt_chars(document: dict[str, Any]) -> int | None:
    """The characters of text the body sends as its prompt (the JSON around it and its media left out); None when it
    has no prompt field."""
    return _PromptWalk.of(document).chars


class _PromptWalk:
    """One walk through a body's prompt fields: the characters of its text and its media parts."""

    __slots__ = ("chars", "parts")

    def __init__(self) -> None:
        self.chars: int | None = None
        self.parts: list[tuple[str, int]] = []

    @classmethod
    def of(cls, document: dict[str, Any]) -> _PromptWalk:
        walk = cls()
        found = [document[name] for name in PROMPT_FIELDS if name in document]
        if found:
            walk.chars = sum(walk.text(value, 0) for value in found)
        return walk

    def media(self) -> PromptMedia:
        return PromptMedia(tuple(self.parts)) if self.parts else NO_MEDIA

    def text(self, value: object, depth: int) -> int:
        """The characters of text in ``value``, noting the media parts found in it."""
        if isinstance(value, str):
            return len(value)
        if depth >= _MAX_DEPTH:
            return 0
        if isinstance(value, list):
            return sum(self.text(item, depth + 1) for item in value)
        if isinstance(value, dict):
            kind = _media_kind(value)
            if kind is not None:
                self.parts.append((kind, _string_chars(value, 0)))
                return 0
            return sum(self.text(value[name], depth + 1) for name in TEXT_FIELDS if name in value)
        return 0


def _media_kind(part: dict[str, Any]) -> str | None:
    """The kind of media ``part`` sends (`MEDIA_KINDS`; ``low_detail_image`` for an image sent with ``"detail":
    "low"``), or None for a part of text (or no part)."""
    name = part.get("type")
    if not isinstance(name, str):
        return None
    source = part.get("source")
    if name == "document" and isinstance(source, dict) and source.get("type") in _TEXT_SOURCES:
        return None
    kind = MEDIA_KINDS.get(name)
    if kind == "image" and _detail(part) == _LOW_DETAIL:
        return "low_detail_image"
    return kind


def _detail(part: dict[str, Any]) -> object:
    """An image part's ``detail``: Chat Completions' in its ``image_url`` object, Responses' beside its URL."""
    inner = part.get("image_url")
    return inner.get("detail") if isinstance(inner, dict) else part.get("detail")


def _string_chars(value: object, depth: int) -> int:
    """The characters of every string in a media part (its data, URL, id), keys left out."""
    if isinstance(value, str):
        return len(value)
    if depth >= 3:
        return 0
    if isinstance(value, dict):
        return sum(_string_chars(item, depth + 1) for item in value.values())
    if isinstance(value, list):
        return sum(_string_chars(item, depth + 1) for item in value)
    return 0


@dataclass(slots=True)
class RequestFacts:
    """What the guard reads from a request body: never the prompt itself (only its length)."""

    model: str | None = None
    stream: bool = False
    max_tokens: int | None = None
    prompt_chars: int | None = None
    """Characters of the prompt's text (`prompt_chars`); None when the body has no prompt field."""
    media: PromptMedia = NO_MEDIA
    """The prompt's media parts (`MEDIA_KINDS`)."""
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
        prompt = _PromptWalk.of(obj)
        return cls(
            model=model if isinstance(model, str) else None,
            stream=obj.get("stream") is True,
            max_tokens=max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else None,
            prompt_chars=prompt.chars,
            media=prompt.media(),
            choices=n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1,
            background=obj.get("background") is True,
        )
