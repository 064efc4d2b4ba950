"""The per-request phase record (`RecordLogger`, in `llmguard_client.telemetry.record_logger`, writes it).

Every logical call through the guard produces one `PhaseRecord`, delivered to
``Guard(on_record=...)`` when the call ends and readable on the response as
``response.extensions["llmguard"]``. All timestamps are monotonic seconds on the
Guard's clock (by default the event loop's: ``time.monotonic()`` on asyncio);
``start_unix`` anchors them to wall-clock time.

Records are immutable (frozen dataclasses; lists are tuples): the guard builds each one internally
(`llmguard_client.telemetry._record_builder`) and hands out a frozen copy. ``on_record``, the
OpenTelemetry export, ``capture()`` and a `GuardFailure`'s ``.record`` get the final record.
``response.extensions["llmguard"]`` holds a snapshot taken when the response was handed over (for a
stream: its first token, ``status == "pending"``), replaced by the final record when the call ends
(a stream read to its end or closed; a non-streamed body read): read it after that.

Phases, in order (each ``None`` when the call never got there)::

    start <= queued <= sent <= headers <= first_token <= finish

``queued`` is when the call left the bulkhead queue; ``sent``, ``headers`` and
``first_token`` are those of the winning attempt. For a non-streaming response
``first_token`` is when its body was complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeVar

AttemptKind = Literal["primary", "retry", "hedge", "continuation"]
"""Why an attempt was sent: the first one, a retry after a failure, a hedge, or a continuation of a
stream that broke after its first token (``ContinuationPolicy``)."""

AttemptOutcome = Literal["pending", "won", "lost", "cancelled", "failed"]
"""won: its response reached the caller; lost: another attempt won first (it was closed);
cancelled: the call ended (deadline, caller) while it ran; failed: it errored or got an error status."""

NotContinued = Literal[
    "no_text",
    "not_text",
    "max_continuations",
    "time_left",
    "max_tokens",
    "no_replica",
    "budget",
    "guard_closed",
    "continuation_failed",
    "total_deadline",
    "guard_moved",
]
"""Why a stream that broke after its first token was not continued (``ContinuationPolicy`` on): no answer text
was kept or delivered; the answer is not a plain single-choice text answer (tool calls, logprobs, ``n > 1``);
the policy's ``max_continuations`` were used; less than its ``min_time_left`` was left before ``total``; no
tokens left under ``max_tokens``; no other replica to send it to; the retry budget refused it; the Guard was
closed; the continuation attempt failed or got no first token in time; the break was the total deadline; the
Guard had moved to another event loop since the call started (a sync stream read on the Guard's own thread after
async code took it over)."""

OneAttempt = Literal["streamed_body", "other_origin", "signed_other_origin", "background"]
"""Why the guard sent a call once, with no hedge and no retry of its own: ``streamed_body``, its request body
was an iterator, sent as it came (its chunks cannot be produced again); ``other_origin``, the request followed a
redirect to an origin that is no replica's, and was sent there as it is (``replica`` names that origin);
``signed_other_origin``, the client signed the request's host (AWS SigV4) for an origin that is no replica's, and it
was sent there as it is; ``background``, the request starts a job the server runs on its own (the Responses API's
``background: true``), which a second request would start again: sent once it may have reached a server (a refused
connection is still retried), never hedged, and its stream handed over as it comes."""

CallStatus = Literal["pending", "ok", "timeout", "http_error", "error", "rejected", "cancelled", "abandoned"]
"""ok; timeout (see ``cause``); http_error (a server error status reached the caller);
error (a transport error); rejected (the guard refused: budget, cool-down, bulkhead);
cancelled (the caller cancelled); abandoned (the caller closed a stream before its end)."""


@dataclass(frozen=True)
class AttemptRecord:
    """One physical request to one replica."""

    index: int
    replica: str
    kind: AttemptKind
    start: float
    sent: float | None = None
    headers: float | None = None
    accepted: float | None = None
    """When the server's stream said it accepted the request (Responses ``response.created``, Messages
    ``message_start``), before any content; None for other answers."""
    first_token: float | None = None
    finish: float | None = None
    status_code: int | None = None
    outcome: AttemptOutcome = "pending"
    error: str | None = None
    retry_after: float | None = None
    resumed_at: int | None = None
    """A continuation: the characters of answer text already delivered when it was sent."""
    resumed_tokens: int | None = None
    """A continuation: the tokens already generated (what ``max_tokens`` was reduced by)."""
    break_cause: str | None = None
    """A continuation: why the stream it continues broke (``read_error``, ``stream_truncated``, ...)."""
    chaos: tuple[str, ...] = ()
    """The faults `Chaos` injected into this attempt, in order (``latency``, ``status_429``, ``status_503``,
    ``status_500``, ``reset``, ``stall``, ``cut``); empty for an attempt left alone."""

    @property
    def ttft(self) -> float | None:
        """Seconds from this attempt's start to its first content token."""
        return None if self.first_token is None else self.first_token - self.start


@dataclass(frozen=True)
class PhaseRecord:
    """Phase timestamps and outcome of one logical call."""

    request_id: str
    tier: str
    cohort: Literal["guarded", "control"]
    method: str
    path: str
    start: float
    start_unix: float
    model: str | None = None
    stream: bool = False
    max_tokens: int | None = None
    queued: float | None = None
    sent: float | None = None
    headers: float | None = None
    accepted: float | None = None
    """The winning attempt's ``accepted``: the server's stream said it accepted the request (Responses
    ``response.created``, Messages ``message_start``), before any content token; None for other answers."""
    first_token: float | None = None
    finish: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int | None = None
    """Streamed data events from the first content token to the end (None for a non-streaming body)."""
    status: CallStatus = "pending"
    cause: str | None = None
    http_status: int | None = None
    replica: str | None = None
    response_id: str | None = None
    response_model: str | None = None
    finish_reasons: tuple[str, ...] = ()
    attempts: tuple[AttemptRecord, ...] = ()
    rollout_fraction: float | None = None
    """The rollout fraction in force when the call's cohort was decided (0.0: the guard was off)."""
    not_continued: NotContinued | None = None
    """Continuation on: why the last break after the first token was not continued (None if it was, or
    if nothing broke)."""
    one_attempt: OneAttempt | None = None
    """Why the guard gave this call one attempt only, with no hedge and no retry (None: it did not limit it)."""
    sdk_call: str | None = None
    """Sent by an SDK that counts its retries (openai, anthropic): an id of the SDK's call, the same on the
    records of its retries (a record per request the SDK sent); None otherwise."""
    sdk_retry: int = 0
    """The SDK's count of this request among its call's (``x-stainless-retry-count``): 0 for the first."""

    @property
    def ttft(self) -> float | None:
        """Seconds from the call's start to the first content token."""
        return None if self.first_token is None else self.first_token - self.start

    @property
    def duration(self) -> float | None:
        """Seconds from the call's start to its end."""
        return None if self.finish is None else self.finish - self.start

    @property
    def hedged(self) -> bool:
        return any(a.kind == "hedge" for a in self.attempts)

    @property
    def retried(self) -> bool:
        return any(a.kind == "retry" for a in self.attempts)

    @property
    def continued(self) -> bool:
        """A stream broke after its first token and was finished by a continuation attempt."""
        return any(a.kind == "continuation" and a.outcome == "won" for a in self.attempts)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (lists for the tuples; no prompt, completion or header values are ever held here)."""
        out = dict(vars(self))
        out["finish_reasons"] = list(self.finish_reasons)
        out["attempts"] = [{**vars(a), "chaos": list(a.chaos)} for a in self.attempts]
        out["ttft"] = self.ttft
        out["duration"] = self.duration
        return out


_Record = TypeVar("_Record", AttemptRecord, PhaseRecord)


def from_fields(cls: type[_Record], fields: dict[str, Any]) -> _Record:
    """A frozen record holding ``fields`` (every field, in declaration order, already of the right type) as its
    own attribute dict: one allocation, without the per-field ``object.__setattr__`` of the generated
    ``__init__`` (ten times the cost). Only the record builder calls this."""
    record = object.__new__(cls)
    object.__setattr__(record, "__dict__", fields)
    return record
