"""One streamed chat completion, timed: time to the first content token, time to the end, or the failure.

Independent of any load tool, so that each integration reports the same measurement. A failure is turned
into a `ChatFailure` whose message is short and stable (the guard's cause, the HTTP status, the error's
type), so that a load tool grouping failures by message shows one row per kind, not one per call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmguard_client.causes import guard_failure

if TYPE_CHECKING:
    import openai
    from openai.types.chat import ChatCompletionMessageParam

__all__ = ["ChatFailure", "StreamResult", "describe_failure", "stream_chat"]


class ChatFailure(Exception):
    """A failed call as a load tool records it; ``cause`` is the guard's cause when the guard decided it."""

    def __init__(self, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class EmptyStream(Exception):
    """The stream ended without a single content token."""


@dataclass(frozen=True, slots=True)
class StreamResult:
    """``ttft``: seconds to the first content token (None if none came); ``total``: seconds to the end of
    the stream or to the failure; ``chars``: content characters received; ``error``: None on success."""

    ttft: float | None
    total: float
    chars: int
    error: ChatFailure | None


def describe_failure(exc: BaseException) -> ChatFailure:
    """``exc`` as a `ChatFailure`: ``"guard ttft_timeout (HTTP 504)"``, ``"HTTP 503"``, ``"APIConnectionError"``.

    The guard's cause comes from `llmguard_client.guard_failure`, with the HTTP status when the error has one (the
    guard's `TTFTTimeout` raised to an httpx caller: 504; through the openai SDK a first-token timeout is its
    `APITimeoutError`, which has none: ``"guard ttft_timeout"``); a server's own error answer handed back by the
    guard (cause ``upstream_status``) is reported as that HTTP status.
    """
    cause = guard_failure(exc)
    status = getattr(exc, "status_code", None)
    http = f"HTTP {status}" if isinstance(status, int) else None
    if cause is not None and cause != "upstream_status":
        message = f"guard {cause}" + (f" ({http})" if http else "")
    else:
        message = http or type(exc).__name__
    failure = ChatFailure(message, cause)
    failure.__cause__ = exc
    return failure


def stream_chat(
    client: openai.OpenAI, *, model: str, messages: list[ChatCompletionMessageParam], max_tokens: int
) -> StreamResult:
    """Stream one chat completion through ``client`` and time it (the caller's clock: `time.perf_counter`)."""
    start = time.perf_counter()
    ttft: float | None = None
    chars = 0
    try:
        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, stream=True)
        with stream:
            for chunk in stream:
                for choice in chunk.choices:
                    text = choice.delta.content
                    if text:
                        if ttft is None:
                            ttft = time.perf_counter() - start
                        chars += len(text)
        if ttft is None:
            raise EmptyStream("the stream ended without a content token")
    except Exception as exc:
        return StreamResult(ttft, time.perf_counter() - start, chars, describe_failure(exc))
    return StreamResult(ttft, time.perf_counter() - start, chars, None)
