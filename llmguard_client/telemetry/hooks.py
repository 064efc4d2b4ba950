"""The instrumentation protocol the transport calls at each phase.

The transport owns no telemetry logic: it calls an `Instrumentation` when a call
starts, and the returned `CallObservation` when an attempt starts, when an attempt
ends and when the call ends. `llmguard_client.telemetry.otel` implements it with
OpenTelemetry; `NO_INSTRUMENTATION` does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Protocol

from llmguard_client.telemetry._record_builder import AttemptRecordBuilder, CallRecordBuilder
from llmguard_client.telemetry.record import PhaseRecord


class CallObservation(Protocol):
    """Receives the events of one logical call."""

    def attempt_started(self, attempt: AttemptRecordBuilder, url: str, headers: MutableMapping[str, str]) -> None:
        """An attempt is about to be sent to ``url``; ``headers`` may be amended (e.g. ``traceparent``).
        ``attempt`` is live and read-only: the attempt as it is built, with an `AttemptRecord`'s attributes."""

    def attempt_finished(self, attempt: AttemptRecordBuilder) -> None:
        """The attempt ended; its ``outcome`` is final (``attempt.freeze()`` is its frozen `AttemptRecord`)."""

    def call_finished(self, record: PhaseRecord) -> None:
        """The call ended (success, failure, cancellation or end of stream); ``record`` is the final, frozen one."""

    def budget_refused(self, record: CallRecordBuilder) -> None:
        """An extra attempt (retry or hedge; or a continuation, by its own budget) for this call was refused."""


class Instrumentation(Protocol):
    """Creates one `CallObservation` per logical call."""

    def call_started(self, record: CallRecordBuilder) -> CallObservation:
        """A logical call started (``record`` is live and read-only: the call's record as it is built, with the
        request's attributes of a `PhaseRecord`; the final one comes to ``call_finished``)."""

    def replica_cooled(self, replica: str, seconds: float, reason: str) -> None:
        """A replica was put in cool-down (``reason``: retry_after, circuit_open)."""

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

    def attempt_started(self, attempt: AttemptRecordBuilder, url: str, headers: MutableMapping[str, str]) -> None:
        return None

    def attempt_finished(self, attempt: AttemptRecordBuilder) -> None:
        return None

    def call_finished(self, record: PhaseRecord) -> None:
        return None

    def budget_refused(self, record: CallRecordBuilder) -> None:
        return None


class _NoInstrumentation:
    __slots__ = ()
    _call = _NoCall()

    def call_started(self, record: CallRecordBuilder) -> CallObservation:
        return self._call

    def replica_cooled(self, replica: str, seconds: float, reason: str) -> None:
        return None

    def bulkhead_rejected(self, tier: str) -> None:
        return None

    def register_budget(self, level: Callable[[], float]) -> None:
        return None


NO_INSTRUMENTATION: Instrumentation = _NoInstrumentation()
"""An `Instrumentation` that records nothing."""
