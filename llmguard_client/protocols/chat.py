"""OpenAI Chat Completions (``POST .../chat/completions``): ``chat.completion.chunk`` event streams.

- first content token: the first chunk whose ``choices[].delta`` carries a non-empty ``content``,
  ``tool_calls``, ``function_call``, ``refusal``, ``reasoning_content``, ``reasoning``, ``reasoning_details``
  (OpenRouter's list of reasoning summaries, encrypted or plain reasoning, with no ``reasoning`` for some models)
  or ``audio`` (spoken output: its transcript and data come there, with ``content`` null); role-only and empty
  deltas do not count;
- in-stream error: an event whose JSON has a non-empty top-level ``error`` (vLLM's queue overflow:
  ``{"error": {..., "code": 503}}`` then ``[DONE]``; TGI: ``{"error": "...", "error_type": ...}``),
  or an ``event: error``;
- end marker: ``data: [DONE]``, or a non-empty ``finish_reason`` for as many distinct choices as the request
  asked for (its ``n``, the reader's ``choices``); a server that sends fewer choices ends its stream with
  ``[DONE]``;
- usage: ``usage.prompt_tokens`` / ``usage.completion_tokens``, usually in a last ``choices: []``
  chunk (``stream_options.include_usage``).

With `ChatReader.keep_text` (continuation on) every event is decoded and the answer's text kept, with a
count of the events that carried text and whether the answer is still a plain single-choice text answer
(`ChatReader.text_only`); a malformed event after the first token is then a failure too.

Otherwise, after the first token only events holding ``prompt_tokens``, a non-null ``finish_reason`` or an
``"error"`` key are decoded; a chunk of whole events holding none of these (nor ``[DONE]``) is not
even split into lines, its events are only counted.
"""

from __future__ import annotations

import re
from typing import Any

from llmguard_client.protocols.base import ResponseFacts
from llmguard_client.protocols.errors import malformed
from llmguard_client.protocols.sse import SSEReader

_INTERESTING = re.compile(rb'prompt_tokens|_reason": ?"|error|\[DONE\]|\r')
"""What makes a chunk worth splitting after the first token (one regex scan beats five substring checks)."""
_ANOTHER_CHOICE = re.compile(rb'"index": ?[1-9]')
"""With ``n`` > 1, an event that may be of another choice than the first, decoded so that the choices seen are known
at the body's end (`ChatReader.whole_at_end`): a server that sends them all but ends one early truncated it."""
_UNSAFE_TEXT = re.compile(rb'["\r\n]|\\\Z')
"""What a learnt shape's text must not hold: a quote or line break, or a backslash at its end (any of
which could end the JSON string or the event). Searched between the head and the tail."""
_DELTA_CONTENT = (
    "content",
    "tool_calls",
    "function_call",
    "refusal",
    "reasoning_content",
    "reasoning",
    "reasoning_details",
    "audio",
)
_NOT_TEXT = _DELTA_CONTENT[1:]


def _message_has_content(holder: object) -> bool:
    return isinstance(holder, dict) and any(holder.get(k) for k in _DELTA_CONTENT)


def chat_choice_has_content(choice: dict[str, Any]) -> bool:
    """A chat choice (streamed ``delta`` or complete ``message``) with visible output."""
    return _message_has_content(choice.get("delta")) or _message_has_content(choice.get("message"))


def absorb_choices(facts: ResponseFacts, obj: dict[str, Any], has_content: Any) -> bool:
    """Ids, usage and finish reasons of one chunk or body; True if a choice carries content."""
    facts.identify(obj)
    facts.count(obj.get("usage"), "prompt_tokens", "completion_tokens")
    found = False
    choices = obj.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:  # some servers send "" where the API has null
                facts.finish_reasons.append(reason)
            if not found and has_content(choice):
                found = True
    return found


def absorb_chat_body(facts: ResponseFacts, obj: dict[str, Any]) -> None:
    """Facts of a complete (non-streaming) ``chat.completion`` body."""
    absorb_choices(facts, obj, chat_choice_has_content)


class ChatReader(SSEReader):
    """Reads a Chat Completions event stream; see the module docstring."""

    __slots__ = (
        "_choices",
        "_finished",
        "_head",
        "_head_size",
        "_seen",
        "_tail",
        "_tail_size",
        "_text",
        "text_events",
        "text_only",
    )
    protocol = "chat"
    end_marker = "[DONE] or a finish_reason for every choice"
    _text_key = b'"content":'
    """The key of the text string of a typical chunk (see `_learn_shape`)."""

    def __init__(self, choices: int = 1) -> None:
        super().__init__()
        self._text: list[str] | None = None
        self.text_events = 0
        """Events that carried text (kept only with `keep_text`)."""
        self.text_only = True
        """Every event so far was a single-choice text delta without logprobs (kept only with `keep_text`)."""
        self._choices = choices
        """The choices the request asked for (its ``n``): the answer ends when that many have had their finish
        reason (events holding one are always decoded; with more than one, those naming another choice too)."""
        self._finished: set[int] = set()
        """The indices of the choices that have had their finish reason."""
        self._seen: set[int] = set()
        """The indices of the choices in the events decoded (each one's first events, before the first token)."""
        self._head = b""
        """A plain chunk's bytes before its text (see `_learn_shape`); empty until one is learnt."""
        self._tail = b""
        self._head_size = self._tail_size = 0

    @staticmethod
    def has_content(choice: dict[str, Any]) -> bool:
        return chat_choice_has_content(choice)

    @staticmethod
    def text_of(choice: dict[str, Any]) -> tuple[object, bool]:
        """(the choice's text piece, True if it carries nothing but text)."""
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return None, True
        return delta.get("content"), not any(delta.get(k) for k in _NOT_TEXT)

    def keep_text(self) -> bool:
        if self._text is None:
            self._text = []
        return True

    @property
    def text(self) -> str | None:
        """The text so far (None unless `keep_text` was called before the first chunk)."""
        return None if self._text is None else "".join(self._text)

    def feed(self, chunk: bytes) -> bool:
        head = self._head  # set only while no event is half-read and nothing failed (see below)
        if head and chunk.startswith(head) and chunk.endswith(self._tail):
            # The shape of the last plain chunk with another text in it: counted as that one was.
            end = len(chunk) - self._tail_size
            if end >= self._head_size and _UNSAFE_TEXT.search(chunk, self._head_size, end) is None:
                self._events += 1
                return True
        first_token = super().feed(chunk)
        if head and (self._partial or self._data or self._event or self.failure is not None):
            self._head = b""  # the next chunk continues this one, or the stream failed: no shortcut
        return first_token

    def skippable(self, chunk: bytes) -> bool:
        if self._text is not None or not chunk.endswith(b"\n\n"):
            return False
        if _INTERESTING.search(chunk) is not None or (self._choices > 1 and _ANOTHER_CHOICE.search(chunk)):
            return False
        self._learn_shape(chunk)
        return True

    def _learn_shape(self, chunk: bytes) -> None:
        """Remember a plain one-event chunk as the bytes before and after its text string: the next
        chunks of a stream differ only there, and a text without a quote, line break or trailing
        backslash cannot change what the rest of the event says (it stays inside its JSON string)."""
        start = chunk.find(self._text_key)
        if start < 0 or chunk.count(b"\n\n") != 1:
            return
        start += len(self._text_key)
        if chunk[start : start + 1] == b" ":  # json.dumps' default separators: "content": "..."
            start += 1
        if chunk[start : start + 1] != b'"':
            return
        start += 1
        end = chunk.find(b'"', start)
        if end < 0 or chunk[start:end].endswith(b"\\"):
            return
        self._head, self._tail = chunk[:start], chunk[end:]
        self._head_size, self._tail_size = start, len(chunk) - end

    def _keep(self, obj: dict[str, Any], text: list[str]) -> None:
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            return
        if len(choices) > 1:
            self.text_only = False
            return
        choice = choices[0]
        if not isinstance(choice, dict) or choice.get("index", 0) != 0 or choice.get("logprobs"):
            self.text_only = False
            return
        piece, plain = self.text_of(choice)
        if not plain:
            self.text_only = False
        if isinstance(piece, str) and piece:
            text.append(piece)
            self.text_events += 1

    def _finishes(self, obj: dict[str, Any]) -> bool:
        """Note the choices of a decoded event that have had their finish reason; whether as many as the request
        asked for now have (a choice without an integer ``index`` is the first, as in the API's default)."""
        choices = obj.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if not isinstance(choice, dict):
                    continue
                index = choice.get("index", 0)
                index = index if isinstance(index, int) else 0
                self._seen.add(index)
                reason = choice.get("finish_reason")
                if isinstance(reason, str) and reason:
                    self._finished.add(index)
        return len(self._finished) >= self._choices

    def whole_at_end(self) -> bool:
        """Fewer choices than asked for came, each finished (a server that ignores ``n``), and then the body's end
        without ``[DONE]``: the answer is whole, as the SDK takes it."""
        return bool(self._finished) and self._finished >= self._seen

    def event(self, name: bytes, data: bytes) -> None:
        text = self._text
        if self.first_token and text is not None:
            if len(data) < 16 and data.strip() == b"[DONE]":
                self.complete = True
                return
            self._events += 1
        elif self.first_token:
            # The cheap path: only events that may hold usage, a finish reason or an error are decoded.
            if (
                data.find(b"prompt_tokens") < 0  # find, not `in`: bytes' `in` first tries the
                and data.find(b'"finish_reason":"') < 0  # needle as an int, an exception per test
                and data.find(b'"finish_reason": "') < 0
                and data.find(b'"error"') < 0
                and name != b"error"
                and (self._choices == 1 or _ANOTHER_CHOICE.search(data) is None)  # n > 1: every choice is noted
            ):
                if len(data) < 16 and data.strip() == b"[DONE]":
                    self.complete = True
                else:
                    self._events += 1
                return
            self._events += 1
        elif len(data) < 16 and data.strip() == b"[DONE]":
            self.complete = True
            return
        obj = self.decode(data, f"a {self.protocol} stream event")
        if obj is None:
            if text is not None and self.failure is None:  # keeping text: the answer can no longer be followed
                self.failure = malformed(f"a {self.protocol} stream event", data)
            return
        error = obj.get("error")
        if error or name == b"error":
            self.fail_with(error or obj, obj.get("error_type"))
            return
        content = absorb_choices(self.facts, obj, self.has_content)
        if text is not None:
            self._keep(obj, text)
        if self._finishes(obj):
            self.complete = True
        if content and not self.first_token:
            self.first_token = True
            self._events = 1
