"""The internal builders of the phase records: the only code that writes a record's fields.

A call's `CallRecordBuilder` (and one `AttemptRecordBuilder` per attempt) is filled in by the transport,
the layers and the stream stages through named methods (``attempt_sent``, ``attempt_headers``,
``attempt_first_token``, ``attempt_finished``, ``call_finished``...); their fields read like a record's
(read-only properties of the same names), so the layers and the instrumentation read a call in flight as
they would read its record. The caller only ever gets frozen `PhaseRecord` / `AttemptRecord` copies:
`CallRecordBuilder.snapshot` (what ``response.extensions["llmguard"]`` holds from the hand-over) and the
final record `CallRecordBuilder.call_finished` returns (what ``on_record``, the instrumentation,
``capture()``, ``extensions["llmguard"]`` and a `GuardFailure`'s ``.record`` hold once the call ended).
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping, Sequence
from dataclasses import MISSING, fields
from typing import Any, Literal

from llmguard_client.telemetry.hooks import LiveAttempt, LiveCall
from llmguard_client.telemetry.record import (
    AttemptKind,
    AttemptOutcome,
    AttemptRecord,
    CallStatus,
    NotContinued,
    OneAttempt,
    PhaseRecord,
    from_fields,
)

EXTENSION = "llmguard"
"""The response extension that holds the call's record."""
ATTEMPT_EXTENSION = "llmguard.attempt"
"""The attempt request's extension that holds its `AttemptRecordBuilder` (fault injection marks it)."""


def _template(record_class: type[Any]) -> dict[str, Any]:
    """Every field of ``record_class`` with its default (None where it has none), in declaration order."""
    return {f.name: None if f.default is MISSING else f.default for f in fields(record_class)}


_ATTEMPT = _template(AttemptRecord)
"""A new attempt's fields: each builder's storage starts as a copy (`freeze` copies it again)."""
_CALL = _template(PhaseRecord)
"""A new call's fields (`snapshot` copies them; ``attempts`` is filled in then)."""


class AttemptRecordBuilder:
    """One attempt in flight: read like an `AttemptRecord`, written only through its methods."""

    __slots__ = ("_fields",)

    def __init__(
        self, index: int, replica: str, kind: AttemptKind, start: float, resumes: tuple[int, int, str] | None
    ) -> None:
        f = self._fields = _ATTEMPT.copy()  # (a copy of a built dict: a third of the cost of a dict display)
        f["index"], f["replica"], f["kind"], f["start"] = index, replica, kind, start
        if resumes is not None:
            f["resumed_at"], f["resumed_tokens"], f["break_cause"] = resumes

    # --- writes ------------------------------------------------------------------------------

    def attempt_sent(self, t: float) -> None:
        """The request (and its body) was written."""
        self._fields["sent"] = t

    def attempt_headers(self, t: float, status_code: int) -> None:
        """The response headers arrived (also the send time when the transport reported none, unless the
        answer was injected by chaos mode: nothing was sent)."""
        f = self._fields
        f["headers"] = t
        if f["sent"] is None and not f["chaos"]:
            f["sent"] = t
        f["status_code"] = status_code

    def attempt_accepted(self, t: float) -> None:
        """The server's stream said it accepted the request (``response.created``, ``message_start``)."""
        self._fields["accepted"] = t

    def attempt_first_token(self, t: float, *, complete: bool = False) -> None:
        """The first content token arrived (``complete``: the whole body was read with it)."""
        f = self._fields
        f["first_token"] = t
        if complete:
            f["finish"] = t

    def attempt_finished(
        self, outcome: AttemptOutcome, t: float | None, *, error: str | None = None, retry_after: float | None = None
    ) -> None:
        """The attempt ended at ``t`` (None: keep the end already stamped) with ``outcome``; ``error`` and
        ``retry_after`` are set when given."""
        f = self._fields
        f["outcome"] = outcome
        if t is not None:
            f["finish"] = t
        if error is not None:
            f["error"] = error
        if retry_after is not None:
            f["retry_after"] = retry_after

    def attempt_outcome(self, outcome: AttemptOutcome) -> None:
        """The attempt won (its stream reaches the caller) or lost (another won), its end unchanged."""
        self._fields["outcome"] = outcome

    def attempt_broke(self, cause: str) -> None:
        """The attempt's stream broke after its first token (``cause``) and a continuation was sent."""
        self._fields["error"] = cause

    def attempt_chaos(self, fault: str) -> None:
        """`Chaos` injected ``fault`` into this attempt."""
        self._fields["chaos"] = (*self._fields["chaos"], fault)

    def freeze(self) -> AttemptRecord:
        """A frozen copy of the attempt as it stands."""
        return from_fields(AttemptRecord, dict(self._fields))

    # --- reads (an `AttemptRecord`'s names) ----------------------------------------------------

    @property
    def index(self) -> int:
        return self._fields["index"]  # type: ignore[no-any-return]

    @property
    def replica(self) -> str:
        return self._fields["replica"]  # type: ignore[no-any-return]

    @property
    def kind(self) -> AttemptKind:
        return self._fields["kind"]  # type: ignore[no-any-return]

    @property
    def start(self) -> float:
        return self._fields["start"]  # type: ignore[no-any-return]

    @property
    def sent(self) -> float | None:
        return self._fields["sent"]  # type: ignore[no-any-return]

    @property
    def headers(self) -> float | None:
        return self._fields["headers"]  # type: ignore[no-any-return]

    @property
    def accepted(self) -> float | None:
        return self._fields["accepted"]  # type: ignore[no-any-return]

    @property
    def first_token(self) -> float | None:
        return self._fields["first_token"]  # type: ignore[no-any-return]

    @property
    def finish(self) -> float | None:
        return self._fields["finish"]  # type: ignore[no-any-return]

    @property
    def status_code(self) -> int | None:
        return self._fields["status_code"]  # type: ignore[no-any-return]

    @property
    def outcome(self) -> AttemptOutcome:
        return self._fields["outcome"]  # type: ignore[no-any-return]

    @property
    def error(self) -> str | None:
        return self._fields["error"]  # type: ignore[no-any-return]

    @property
    def retry_after(self) -> float | None:
        return self._fields["retry_after"]  # type: ignore[no-any-return]

    @property
    def resumed_at(self) -> int | None:
        return self._fields["resumed_at"]  # type: ignore[no-any-return]

    @property
    def resumed_tokens(self) -> int | None:
        return self._fields["resumed_tokens"]  # type: ignore[no-any-return]

    @property
    def break_cause(self) -> str | None:
        return self._fields["break_cause"]  # type: ignore[no-any-return]

    @property
    def chaos(self) -> tuple[str, ...]:
        return self._fields["chaos"]  # type: ignore[no-any-return]

    @property
    def ttft(self) -> float | None:
        """Seconds from this attempt's start to its first content token."""
        f = self._fields
        return None if f["first_token"] is None else f["first_token"] - f["start"]


class CallRecordBuilder:
    """One call in flight: read like a `PhaseRecord`, written only through its methods."""

    __slots__ = ("_attempts", "_extensions", "_fields", "_final")

    def __init__(
        self,
        *,
        request_id: str,
        tier: str,
        cohort: Literal["guarded", "control"],
        method: str,
        path: str,
        start: float,
        start_unix: float,
        model: str | None,
        stream: bool,
        max_tokens: int | None,
        rollout_fraction: float | None,
        sdk_call: tuple[str | None, int] = (None, 0),
    ) -> None:
        f = self._fields = _CALL.copy()
        f["request_id"], f["tier"], f["cohort"], f["method"], f["path"] = request_id, tier, cohort, method, path
        f["start"], f["start_unix"], f["model"], f["stream"] = start, start_unix, model, stream
        f["max_tokens"], f["rollout_fraction"] = max_tokens, rollout_fraction
        f["sdk_call"], f["sdk_retry"] = sdk_call
        self._attempts: list[AttemptRecordBuilder] = []
        self._extensions: MutableMapping[str, Any] | None = None
        self._final: PhaseRecord | None = None

    # --- writes ------------------------------------------------------------------------------

    def queued_until(self, t: float) -> None:
        """The call left its bulkhead queue."""
        self._fields["queued"] = t

    def attempt_started(
        self, replica: str, kind: AttemptKind, start: float, resumes: tuple[int, int, str] | None = None
    ) -> AttemptRecordBuilder:
        """A new attempt (``resumes``: a continuation's characters delivered, tokens generated, break cause)."""
        attempt = AttemptRecordBuilder(len(self._attempts), replica, kind, start, resumes)
        self._attempts.append(attempt)
        return attempt

    def delivered(self, attempt: AttemptRecordBuilder, http_status: int) -> None:
        """``attempt``'s response is handed to the caller: the call's phases are its phases."""
        f, a = self._fields, attempt._fields
        f["replica"], f["sent"], f["headers"], f["accepted"] = a["replica"], a["sent"], a["headers"], a["accepted"]
        f["first_token"], f["http_status"] = a["first_token"], http_status

    def opening_read(self, attempt: AttemptRecordBuilder) -> None:
        """The delivered ``attempt``'s acceptance and first token, stamped as the caller read its opening (a stream
        handed over at its headers, `Call.opening_live`): the call's phases too."""
        f, a = self._fields, attempt._fields
        f["accepted"], f["first_token"] = a["accepted"], a["first_token"]

    def continued_on(self, attempt: AttemptRecordBuilder) -> None:
        """The caller reads on from ``attempt``, a continuation that took over a broken stream: the call's replica is
        now its (the call's phases stay those of the attempt that delivered its first token)."""
        self._fields["replica"] = attempt._fields["replica"]

    def answered(self, http_status: int | None, replica: str | None = None) -> None:
        """The caller gets an answer with ``http_status`` (a server's, from ``replica``, or the guard's own)."""
        f = self._fields
        f["http_status"] = http_status
        if replica is not None:
            f["replica"] = replica

    def first_token_at(self, t: float) -> None:
        """The call's first content token (the control cohort, which reads its own stream)."""
        self._fields["first_token"] = t

    def response_facts(
        self,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        response_id: str | None,
        response_model: str | None,
        finish_reasons: Iterable[str],
        chunks: int | None,
    ) -> None:
        """What the delivered response said about itself (usage, id, model, finish reasons) and its chunk count."""
        f = self._fields
        f["prompt_tokens"], f["completion_tokens"] = prompt_tokens, completion_tokens
        f["response_id"], f["response_model"] = response_id, response_model
        f["finish_reasons"], f["chunks"] = tuple(finish_reasons), chunks

    def not_continued_because(self, reason: NotContinued | None) -> None:
        """Why the last break after the first token was not continued (None: it was)."""
        self._fields["not_continued"] = reason

    def one_attempt_because(self, reason: OneAttempt) -> None:
        """The guard gives the call one attempt only (no hedge, no retry), for ``reason``."""
        self._fields["one_attempt"] = reason

    def hand_over(self, extensions: MutableMapping[str, Any]) -> None:
        """Put a snapshot in the caller's response ``extensions`` (the response's own dict) now, and the final
        record when the call ends."""
        extensions[EXTENSION] = self.snapshot()
        self._extensions = extensions

    def call_finished(self, status: CallStatus, cause: str | None, t: float) -> PhaseRecord:
        """The call ended at ``t``: its final record (also replacing the hand-over snapshot). Only the first call
        counts (later ones return the same record)."""
        if self._final is not None:
            return self._final
        f = self._fields
        f["status"], f["cause"], f["finish"] = status, cause, t
        final = self._final = self.snapshot()
        extensions, self._extensions = self._extensions, None
        if extensions is not None:
            extensions[EXTENSION] = final
        return final

    def snapshot(self) -> PhaseRecord:
        """A frozen copy of the call as it stands (the final record once it ended)."""
        if self._final is not None:
            return self._final
        values = dict(self._fields)
        values["attempts"] = tuple([a.freeze() for a in self._attempts])
        return from_fields(PhaseRecord, values)

    @property
    def final(self) -> PhaseRecord | None:
        """The final record, once `call_finished` made it."""
        return self._final

    # --- reads (a `PhaseRecord`'s names) -------------------------------------------------------

    @property
    def attempts(self) -> Sequence[AttemptRecordBuilder]:
        return self._attempts

    @property
    def request_id(self) -> str:
        return self._fields["request_id"]  # type: ignore[no-any-return]

    @property
    def tier(self) -> str:
        return self._fields["tier"]  # type: ignore[no-any-return]

    @property
    def cohort(self) -> Literal["guarded", "control"]:
        return self._fields["cohort"]  # type: ignore[no-any-return]

    @property
    def method(self) -> str:
        return self._fields["method"]  # type: ignore[no-any-return]

    @property
    def path(self) -> str:
        return self._fields["path"]  # type: ignore[no-any-return]

    @property
    def start(self) -> float:
        return self._fields["start"]  # type: ignore[no-any-return]

    @property
    def start_unix(self) -> float:
        return self._fields["start_unix"]  # type: ignore[no-any-return]

    @property
    def model(self) -> str | None:
        return self._fields["model"]  # type: ignore[no-any-return]

    @property
    def stream(self) -> bool:
        return self._fields["stream"]  # type: ignore[no-any-return]

    @property
    def max_tokens(self) -> int | None:
        return self._fields["max_tokens"]  # type: ignore[no-any-return]

    @property
    def first_token(self) -> float | None:
        return self._fields["first_token"]  # type: ignore[no-any-return]

    @property
    def rollout_fraction(self) -> float | None:
        return self._fields["rollout_fraction"]  # type: ignore[no-any-return]

    @property
    def not_continued(self) -> NotContinued | None:
        return self._fields["not_continued"]  # type: ignore[no-any-return]

    @property
    def one_attempt(self) -> OneAttempt | None:
        return self._fields["one_attempt"]  # type: ignore[no-any-return]


AnyAttempt = LiveAttempt
"""An attempt in flight or its frozen record (what the instrumentation reads): both offer `LiveAttempt`."""
AnyCall = LiveCall
"""A call in flight or its frozen record (what the instrumentation reads): both offer `LiveCall`."""
