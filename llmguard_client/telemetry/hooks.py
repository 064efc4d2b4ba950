"""The instrumentation protocol the transport calls at each phase.

The transport owns no telemetry logic: it calls an `Instrumentation` when a call
starts, and the returned `CallObservation` when an attempt starts, when an attempt
ends and when the call ends. `llmguard_client.telemetry.otel` implements it with
OpenTelemetry; `NO_INSTRUMENTATION` does nothing.

While a call runs, the hooks are handed live, read-only views of its record (`LiveCall`, `LiveAttempt`): the
attributes of a `PhaseRecord` / `AttemptRecord` as they stand. A frozen `AttemptRecord` and `PhaseRecord`
offer the same attributes, so code written for the views reads a finished record too.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from typing import Literal, Protocol

from llmguard_client.telemetry.record import AttemptKind, AttemptOutcome, NotContinued, OneAttempt, PhaseRecord

__all__ = ["NO_INSTRUMENTATION", "CallObservation", "Instrumentation", "LiveAttempt", "LiveCall"]


class LiveAttempt(Protocol):
    """One attempt as it is built, read-only: the attributes of its `AttemptRecord` so far."""

    @property
    def index(self) -> int: ...
    @property
    def replica(self) -> str: ...
    @property
    def kind(self) -> AttemptKind: ...
    @property
    def start(self) -> float: ...
    @property
    def sent(self) -> float | None: ...
    @property
    def headers(self) -> float | None: ...
    @property
    def accepted(self) -> float | None: ...
    @property
    def first_token(self) -> float | None: ...
    @property
    def finish(self) -> float | None: ...
    @property
    def status_code(self) -> int | None: ...
    @property
    def outcome(self) -> AttemptOutcome: ...
    @property
    def error(self) -> str | None: ...
    @property
    def retry_after(self) -> float | None: ...
    @property
    def resumed_at(self) -> int | None: ...
    @property
    def resumed_tokens(self) -> int | None: ...
    @property
    def break_cause(self) -> str | None: ...
    @property
    def chaos(self) -> tuple[str, ...]: ...
    @property
    def ttft(self) -> float | None: ...


class LiveCall(Protocol):
    """One call's record as it is built, read-only: the request's attributes of its `PhaseRecord` (the final
    record, with the response's, comes to `CallObservation.call_finished`) and its attempts so far."""

    @property
    def request_id(self) -> str: ...
    @property
    def tier(self) -> str: ...
    @property
    def cohort(self) -> Literal["guarded", "control"]: ...
    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def start(self) -> float: ...
    @property
    def start_unix(self) -> float: ...
    @property
    def model(self) -> str | None: ...
    @property
    def stream(self) -> bool: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def first_token(self) -> float | None: ...
    @property
    def rollout_fraction(self) -> float | None: ...
    @property
    def not_continued(self) -> NotContinued | None: ...
    @property
    def one_attempt(self) -> OneAttempt | None: ...
    @property
    def attempts(self) -> Sequence[LiveAttempt]: ...


class CallObservation(Protocol):
    """Receives the events of one logical call."""

    def attempt_started(self, attempt: LiveAttempt, url: str, headers: MutableMapping[str, str]) -> None:
        """An attempt is about to be sent to ``url``; ``headers`` may be amended (e.g. ``traceparent``)."""

    def attempt_finished(self, attempt: LiveAttempt) -> None:
        """The attempt ended; its ``outcome`` is final."""

    def call_finished(self, record: PhaseRecord) -> None:
        """The call ended (success, failure, cancellation or end of stream); ``record`` is the final, frozen one."""

    def budget_refused(self, record: LiveCall) -> None:
        """An extra attempt (retry or hedge; or a continuation, by its own budget) for this call was refused."""


class Instrumentation(Protocol):
    """Creates one `CallObservation` per logical call."""

    def call_started(self, record: LiveCall) -> CallObservation:
        """A logical call started (``record`` is live and read-only: the call's record as it is built, with the
        request's attributes of a `PhaseRecord`; the final one comes to ``call_finished``)."""

    def replica_cooled(self, replica: str, seconds: float, reason: str) -> None:
        """A replica was put in cool-down (``reason``: retry_after; overload, a 429/503/529 without one; failing,
        the only replica left failing past what the retry budget pays for; circuit_open)."""

    def bulkhead_rejected(self, tier: str) -> None:
        """A call was refused because its tier's bulkhead was full."""

    def register_budget(self, level: Callable[[], float]) -> None:
        """Report the shared retry budget's level (extra attempts available now) on demand.

        ``level`` may be called from a metrics exporter's thread, so it must only read a value the loop
        published (`RetryBudget.published_level`); a bound method is held weakly, so that registering
        one does not keep its object alive.
        """


class _NoCall:
    __slots__ = ()

    def attempt_started(self, attempt: LiveAttempt, url: str, headers: MutableMapping[str, str]) -> None:
        return None

    def attempt_finished(self, attempt: LiveAttempt) -> None:
        return None

    def call_finished(self, record: PhaseRecord) -> None:
        return None

    def budget_refused(self, record: LiveCall) -> None:
        return None


class _NoInstrumentation:
    __slots__ = ()
    _call = _NoCall()

    def call_started(self, record: LiveCall) -> CallObservation:
        return self._call

    def replica_cooled(self, replica: str, seconds: float, reason: str) -> None:
        return None

    def bulkhead_rejected(self, tier: str) -> None:
        return None

    def register_budget(self, level: Callable[[], float]) -> None:
        return None


NO_INSTRUMENTATION: Instrumentation = _NoInstrumentation()
"""An `Instrumentation` that records nothing."""
