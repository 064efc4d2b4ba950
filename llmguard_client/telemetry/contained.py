"""An application's own `Instrumentation` and ``on_record`` callback, held so that an error in them never reaches a
call.

The hooks run inside the call's path: in the attempt that sends, and in the lease's last act that ends the
call. A hook the application wrote that raises there must neither fail a call the server answered nor leave
it unfinished (an exception in the last act would skip the release of what the call holds). Each hook runs
in ``try``; its first error is logged with the traceback on ``llmguard_client``, later ones are only counted
(``errors``), and the call goes on as if the hook had returned. This package's own instrumentations are used
as they are. The ``on_record`` callback is held the same way (`ContainedCallback`): a callback with a bug, called
at the end of every call, would otherwise print a traceback per call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping

from llmguard_client.errors import GuardConfigError
from llmguard_client.telemetry.hooks import (
    NO_INSTRUMENTATION,
    CallObservation,
    Instrumentation,
    LiveAttempt,
    LiveCall,
)
from llmguard_client.telemetry.record import PhaseRecord

__all__ = ["ContainedCallback", "ContainedInstrumentation", "contained"]

logger = logging.getLogger("llmguard_client")


HOOKS = ("call_started", "replica_cooled", "bulkhead_rejected", "register_budget")
"""The methods of `Instrumentation`."""


def contained(instrumentation: Instrumentation) -> Instrumentation:
    """``instrumentation`` itself when it is one of this package's own, else held in a `ContainedInstrumentation`;
    a `GuardConfigError` when it lacks one of the `HOOKS`."""
    if type(instrumentation).__module__.startswith("llmguard_client."):
        return instrumentation
    missing = [hook for hook in HOOKS if not callable(getattr(instrumentation, hook, None))]
    if missing:
        raise GuardConfigError(
            f"instrumentation must implement llmguard_client.telemetry.hooks.Instrumentation ({', '.join(HOOKS)}) "
            f"or be None (no telemetry); got {type(instrumentation).__name__}, which lacks {', '.join(missing)}"
        )
    return ContainedInstrumentation(instrumentation)


class ContainedCallback:
    """Runs an application's ``on_record``: its first error is logged with the traceback, later ones only counted."""

    __slots__ = ("_inner", "errors")

    def __init__(self, inner: Callable[[PhaseRecord], None]) -> None:
        self._inner = inner
        self.errors = 0
        """Errors raised by the callback so far."""

    def __call__(self, record: PhaseRecord) -> None:
        try:
            self._inner(record)
        except Exception:
            self.errors += 1
            if self.errors == 1:
                logger.exception(
                    "llmguard: the on_record callback raised; the call itself is unaffected "
                    "(logged once, later errors are not)"
                )


class ContainedInstrumentation:
    """Runs an application's `Instrumentation`, logging (once per hook) and counting what its hooks raise."""

    __slots__ = ("_inner", "_logged", "errors")

    def __init__(self, inner: Instrumentation) -> None:
        self._inner = inner
        self._logged: set[str] = set()
        self.errors = 0
        """Errors raised by the hooks so far."""

    def failed(self, hook: str) -> None:
        """A hook raised (call from its ``except`` block: the traceback is logged the first time)."""
        self.errors += 1
        if hook not in self._logged:
            self._logged.add(hook)
            logger.exception(
                "llmguard: the instrumentation's %s raised; the call goes on without it "
                "(logged once per hook, counted after)",
                hook,
            )

    def call_started(self, record: LiveCall) -> CallObservation:
        try:
            return _ContainedCall(self, self._inner.call_started(record))
        except Exception:
            self.failed("call_started")
            return NO_INSTRUMENTATION.call_started(record)

    def replica_cooled(self, replica: str, seconds: float, reason: str) -> None:
        try:
            self._inner.replica_cooled(replica, seconds, reason)
        except Exception:
            self.failed("replica_cooled")

    def bulkhead_rejected(self, tier: str) -> None:
        try:
            self._inner.bulkhead_rejected(tier)
        except Exception:
            self.failed("bulkhead_rejected")

    def register_budget(self, level: Callable[[], float]) -> None:
        try:
            self._inner.register_budget(level)
        except Exception:
            self.failed("register_budget")


class _ContainedCall:
    """One call's observation, each hook in ``try``."""

    __slots__ = ("_inner", "_owner")

    def __init__(self, owner: ContainedInstrumentation, inner: CallObservation) -> None:
        self._owner = owner
        self._inner = inner

    def attempt_started(self, attempt: LiveAttempt, url: str, headers: MutableMapping[str, str]) -> None:
        try:
            self._inner.attempt_started(attempt, url, headers)
        except Exception:
            self._owner.failed("attempt_started")

    def attempt_finished(self, attempt: LiveAttempt) -> None:
        try:
            self._inner.attempt_finished(attempt)
        except Exception:
            self._owner.failed("attempt_finished")

    def call_finished(self, record: PhaseRecord) -> None:
        try:
            self._inner.call_finished(record)
        except Exception:
            self._owner.failed("call_finished")

    def budget_refused(self, record: LiveCall) -> None:
        try:
            self._inner.budget_refused(record)
        except Exception:
            self._owner.failed("budget_refused")
