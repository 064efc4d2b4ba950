"""What every protocol reader shares: the interface, the facts it collects, the failure it reports.

A `StreamReader` is fed the raw bytes of one response body, chunk by chunk, in the order they arrive,
and never alters them (the guard replays the same bytes to the caller). It answers four questions, and notes
when the server said it accepted the request (``accepted``: Responses ``response.created``, Messages
``message_start``; before any content, never taken for the first token; chat has no such event):

- ``first_token``: has the first *content* token arrived (a non-empty text, tool-call or reasoning
  delta; role-only deltas, comments, pings and metadata events do not count)?
- ``failure``: did the body show that this answer is not a usable one (an error event, a malformed
  event, a JSON body where a stream was asked for, or, from `StreamReader.end_of_body`, an EOF before
  the protocol's end marker)? The first failure sticks; later bytes change nothing.
- ``complete``: has the protocol's end marker been seen (``[DONE]`` or a finish reason;
  ``response.completed`` / ``response.incomplete``; ``message_stop`` or a ``stop_reason``; EOF for a plain
  body)?
- ``facts``: usage, response id, model and finish reasons, never any text.

Until the first token a reader decodes every event; after it only the few events that can carry
usage, an error or the end marker, so a flowing stream costs a byte split and a few substring checks
per chunk.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

FailureKind = Literal["error_event", "error_body", "malformed", "json_body", "not_sse", "truncated"]
"""error_event: an error event inside a 200 stream; error_body: a 200 JSON body that is an error object;
malformed: an event (or body) that is not the protocol's JSON; json_body / not_sse: a stream was asked
for and a JSON / other non-SSE body came; truncated: EOF before the end marker."""


ANSWER_FAILED = "answer_failed"
"""The cause of a call whose answer says it failed (`ResponseFacts.failed`)."""

MALFORMED_BODY = "malformed_body"
"""The cause of a call whose non-streaming answer is not a JSON object (`ResponseFacts.failed`): cut short,
invalid UTF-8, not JSON. The SDK raises its own error at it (``JSONDecodeError``, ``UnicodeDecodeError``)."""


@dataclass(frozen=True, slots=True)
class StreamFailure:
    """Why a 200 answer is not a usable one.

    ``status`` is the HTTP status the failure stands for when the server said so (a numeric ``code``
    such as vLLM's 503, or a known error type such as ``overloaded_error`` -> 529), else None;
    ``code`` the server's own code or type as sent; ``overload`` whether it signals overload (503, 429,
    529, ``overloaded_error``, ``Service Unavailable``); ``retry_after`` seconds if the event said;
    ``body`` an equivalent JSON error body, handed back if this failure is the call's last answer.
    """

    kind: FailureKind
    message: str
    status: int | None = None
    code: str | None = None
    overload: bool = False
    retry_after: float | None = None
    body: bytes = b""

    @property
    def cause(self) -> str:
        """``stream_<kind>``: the record's and the exception's cause."""
        return f"stream_{self.kind}"


class ResponseFacts:
    """What the guard learns from a response body; no text is ever kept."""

    __slots__ = ("completion_tokens", "failed", "finish_reasons", "model", "prompt_tokens", "response_id")

    def __init__(self) -> None:
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.response_id: str | None = None
        self.model: str | None = None
        self.finish_reasons: list[str] = []
        self.failed: str | None = None
        """Why the answer, handed over as it came, is not a usable one: it says it failed (a Responses API
        ``status: "failed"``, `ANSWER_FAILED`) or is no JSON object (`MALFORMED_BODY`). The call is recorded
        ``error`` with this cause, though the guard retries and raises nothing (the SDK decides, as without it)."""

    def identify(self, obj: dict[str, object]) -> None:
        """Take ``id`` and ``model`` from an object, the first time they appear."""
        if self.response_id is None and isinstance(obj.get("id"), str):
            self.response_id = obj["id"]  # type: ignore[assignment]
        if self.model is None and isinstance(obj.get("model"), str):
            self.model = obj["model"]  # type: ignore[assignment]

    def count(self, usage: object, prompt_key: str, completion_key: str) -> None:
        """Take token counts from a usage object (the keys differ per protocol)."""
        if not isinstance(usage, dict):
            return
        prompt, completion = usage.get(prompt_key), usage.get(completion_key)
        if isinstance(prompt, int) and not isinstance(prompt, bool):
            self.prompt_tokens = prompt
        if isinstance(completion, int) and not isinstance(completion, bool):
            self.completion_tokens = completion


class StreamReader(ABC):
    """Reads one response body for the guard; see the module docstring."""

    __slots__ = ("accepted", "complete", "facts", "failure", "first_token")

    protocol: str = "?"
    """``chat``, ``completions``, ``responses``, ``messages``, ``body`` or ``passthrough``."""
    errors_are_events: bool = False
    """An error after the first content token is an event of the stream that the SDK hands to its caller and
    reads past (the Responses API's ``error`` and ``response.failed``), rather than one it raises at."""

    def __init__(self) -> None:
        self.first_token = False
        self.accepted = False
        self.failure: StreamFailure | None = None
        self.complete = False
        self.facts = ResponseFacts()

    @property
    def chunks(self) -> int | None:
        """Events from the first content token on (the token's own included) for event streams; else None."""
        return None

    def keep_text(self) -> bool:
        """Keep the answer's text from now on (for a continuation); True if this reader can."""
        return False

    @abstractmethod
    def feed(self, chunk: bytes) -> bool:
        """Consume one chunk of the body; returns `first_token`."""

    @abstractmethod
    def end_of_body(self) -> StreamFailure | None:
        """The body ended (EOF): settle `complete` / `failure` and return the failure, if any."""
