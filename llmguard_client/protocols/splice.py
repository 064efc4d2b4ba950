"""Continuing a broken chat/completions stream on another replica: the request, and the splice.

- `continuable_request`: which requests qualify (a streamed, single-choice text answer: ``n`` absent or
  1, no logprobs, no ``echo``/``best_of``/beam search, a string prompt or a list of messages);
- `continuation_body`: the same request asking for the rest: for ``/v1/completions`` the prompt plus the
  text already delivered; for ``/v1/chat/completions`` the messages plus an assistant message holding
  that text, with vLLM's ``continue_final_message: true`` and ``add_generation_prompt: false``;
  ``max_tokens`` / ``max_completion_tokens`` reduced by the tokens already generated;
- `Splicer`: rewrites the continuation's events so the caller sees one answer: the original response
  id and choice index, no role-only opening delta, usage adding up both parts, one ``[DONE]``. Each
  event is decoded and re-encoded (this path is rare, so its cost does not matter);
- `cut_before_failure`: a chunk minus the failing event (error or malformed) and what follows it.
"""

from __future__ import annotations

import json
from typing import Any, Literal

Kind = Literal["chat", "completions"]

__all__ = ["Kind", "Splicer", "continuable_request", "continuation_body", "cut_before_failure"]

_MAX_KEYS = ("max_tokens", "max_completion_tokens")


def continuable_request(method: str, path: str, body: bytes) -> tuple[Kind, dict[str, Any]] | None:
    """(kind, parsed body) when a request's answer could be continued elsewhere; else None."""
    path = path.rstrip("/")
    if method != "POST" or not path.endswith("/completions"):
        return None
    kind: Kind = "chat" if path.endswith("/chat/completions") else "completions"
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or obj.get("stream") is not True:
        return None
    if obj.get("n") not in (None, 1) or obj.get("best_of") not in (None, 1) or obj.get("use_beam_search"):
        return None
    if kind == "chat":
        messages = obj.get("messages")
        if not isinstance(messages, list) or not messages or obj.get("logprobs") or obj.get("top_logprobs"):
            return None
    elif not isinstance(obj.get("prompt"), str) or obj.get("logprobs") is not None or obj.get("echo"):
        return None
    return kind, obj


def continuation_body(kind: Kind, original: dict[str, Any], text: str, tokens: int) -> bytes | None:
    """The request for the rest of an answer whose first ``tokens`` tokens (``text``) were delivered;
    None if no tokens are left to generate."""
    body = dict(original)
    for key in _MAX_KEYS:
        limit = body.get(key)
        if isinstance(limit, int) and not isinstance(limit, bool):
            if limit - tokens < 1:
                return None
            body[key] = limit - tokens
    if kind == "completions":
        body["prompt"] = original["prompt"] + text
    else:
        messages = list(original["messages"])
        last = messages[-1]
        if (
            original.get("continue_final_message")
            and isinstance(last, dict)
            and last.get("role") == "assistant"
            and isinstance(last.get("content"), str)
        ):
            messages[-1] = {**last, "content": last["content"] + text}
        else:
            messages.append({"role": "assistant", "content": text})
        body.update(messages=messages, continue_final_message=True, add_generation_prompt=False)
    return json.dumps(body, separators=(",", ":")).encode()


def _events(chunk: bytes) -> list[bytes]:
    """The events of a chunk (each with its blank line), LF line endings."""
    if 13 in chunk:
        chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    parts = chunk.split(b"\n\n")
    out = [p + b"\n\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def _failing(event: bytes) -> bool:
    data = b"\n".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
    if event.startswith(b"event: error") or event.startswith(b"event:error"):
        return True
    if not data or data == b"[DONE]":
        return False
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return True
    return not isinstance(obj, dict) or bool(obj.get("error"))


def cut_before_failure(chunk: bytes) -> bytes:
    """``chunk`` up to (not including) its first failing event: an error or a malformed event.

    An event that began in an earlier chunk cannot be taken back; servers send whole events per chunk.
    """
    kept: list[bytes] = []
    for event in _events(chunk):
        if _failing(event):
            break
        kept.append(event)
    return b"".join(kept)


class Splicer:
    """Rewrites one continuation stream's bytes into the original answer's; see the module docstring."""

    __slots__ = (
        "_buffer",
        "_held",
        "_kind",
        "_prompt_tokens",
        "_response_id",
        "_skip_lf",
        "_tokens_before",
        "text",
        "text_events",
        "text_only",
    )

    def __init__(self, kind: Kind, response_id: str | None, tokens_before: int, prompt_tokens: int | None) -> None:
        self._kind = kind
        self._response_id = response_id
        self._tokens_before = tokens_before
        self._prompt_tokens = prompt_tokens
        self._buffer = b""
        self._held: list[bytes] = []
        """Chunks after `_buffer` with no line end, joined when one comes (a long line is copied once)."""
        self._skip_lf = False
        """The last chunk ended with a CR, already taken for a line end: an LF opening the next completes it."""
        self.text: list[str] = []
        """The continuation's text, as delivered."""
        self.text_events = 0
        self.text_only = True

    def rewrite(self, chunk: bytes) -> bytes:
        """The caller's bytes for ``chunk`` (possibly empty: a partial event, a dropped role delta)."""
        if self._skip_lf:
            self._skip_lf = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
        if self._buffer and 10 not in chunk and 13 not in chunk:  # cannot end the event: hold it
            self._held.append(chunk)
            return b""
        if self._held:
            chunk = b"".join(self._held) + chunk
            self._held.clear()
        data = self._buffer + chunk
        if 13 in data:
            self._skip_lf = data.endswith(b"\r")
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        cut = data.rfind(b"\n\n")
        if cut < 0:
            self._buffer = data
            return b""
        self._buffer = data[cut + 2 :]
        return b"".join(self._event(e) for e in data[: cut + 2].split(b"\n\n") if e)

    def flush(self) -> bytes:
        """What is left at the end of the stream (an unterminated last event)."""
        rest, self._buffer = self._buffer + b"".join(self._held), b""
        self._held.clear()
        return self._event(rest) if rest.strip() else b""

    def _event(self, event: bytes) -> bytes:
        raw = event + b"\n\n"
        lines = event.split(b"\n")
        if any(not line.startswith((b"data:", b":")) for line in lines if line):
            return raw  # named events (e.g. ``event: error``) pass unchanged
        data = b"\n".join(line[5:].strip() for line in lines if line.startswith(b"data:"))
        if not data:
            return raw
        if data == b"[DONE]":
            return b"data: [DONE]\n\n"
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            return raw
        if not isinstance(obj, dict) or obj.get("error"):
            return raw
        if self._response_id is not None:
            obj["id"] = self._response_id
        keep = self._choices(obj)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self._usage(usage)
            keep = True
        if not keep:
            return b""
        return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"

    def _choices(self, obj: dict[str, Any]) -> bool:
        """Rewrite the choices; False when the event carries nothing the caller needs."""
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return True
        if len(choices) > 1:
            self.text_only = False
        keep = not choices
        for choice in choices:
            if not isinstance(choice, dict):
                return True
            choice["index"] = 0
            if choice.get("finish_reason") is not None or choice.get("logprobs"):
                keep = True
            if self._kind == "chat":
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    delta.pop("role", None)
                    if any(k != "content" for k in delta):
                        self.text_only = False
                        keep = True
                    piece = delta.get("content")
                else:
                    piece = None
            else:
                piece = choice.get("text")
            if isinstance(piece, str) and piece:
                self.text.append(piece)
                self.text_events += 1
                keep = True
        return keep

    def _usage(self, usage: dict[str, Any]) -> None:
        before = self._tokens_before
        completion, prompt = usage.get("completion_tokens"), usage.get("prompt_tokens")
        if isinstance(completion, int):
            usage["completion_tokens"] = completion + before
        if isinstance(prompt, int):
            usage["prompt_tokens"] = self._prompt_tokens if self._prompt_tokens is not None else max(0, prompt - before)
        if isinstance(usage.get("completion_tokens"), int) and isinstance(usage.get("prompt_tokens"), int):
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
