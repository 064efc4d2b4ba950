"""Gradual rollout: which calls take the guarded path, and which form the measured control cohort.

A call's cohort is decided first, before anything else the guard does::

    off (LLMGUARD_DISABLED, or a fraction of 0)   -> control, whatever the (valid) headers say
    x-llmguard-cohort: guarded|control             -> pinned (any other value: `UnknownCohortError`,
                                                      even while off, so a typo fails at 0 % as at 100 %)
    a key (x-llmguard-key header, guard.rollout_key(...), Guard(rollout_key=fn))
                                                   -> sticky: guarded iff hash(key) < fraction
    no key                                         -> per call: guarded with probability fraction; the retries
                                                      of an SDK call (`sdk_call`) keep the cohort its first
                                                      request drew (the newest `CALLS_REMEMBERED` calls')

The key's position is a 64-bit BLAKE2b hash mapped to [0, 1), so a key keeps its cohort
for a given fraction on every process and run, and raising the fraction only moves
control keys into the guarded cohort (never back). The fraction is live: `Rollout.set`
swaps it (a float written under a lock, read once per call), or a zero-argument
callable (a flag service) is polled at most once per ``poll_interval`` seconds; a
failing callable keeps the last good value and logs once until it recovers.

Control calls are passed through untouched (`llmguard_client._rollout.passthrough`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import random
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import httpx

from llmguard_client._core.call import Call
from llmguard_client._core.clock import loop_clock
from llmguard_client._core.given_up import SdkCall
from llmguard_client._core.headers import COHORT_HEADER, CallerHeaders
from llmguard_client._core.outcome import Outcome, Route
from llmguard_client._core.pipeline import Next
from llmguard_client._core.randomness import process_random
from llmguard_client.errors import GuardConfigError, UnknownCohortError

logger = logging.getLogger("llmguard_client")

COHORTS = ("guarded", "control")
DISABLE_ENV = "LLMGUARD_DISABLED"
"""Set to 1 (or true/yes/on) before a `Guard` is built: every call is passed through as control."""
_ENABLED_VALUES = frozenset({"", "0", "false", "no", "off"})
_DISABLED_VALUES = frozenset({"1", "true", "yes", "on"})

Cohort = Literal["guarded", "control"]
AssignedBy = Literal["off", "pin", "key", "call"]
FractionSource = Callable[[], float]
"""A zero-argument callable returning the fraction (e.g. a feature-flag lookup); it must not block."""
CALLS_REMEMBERED = 16_384
"""The keyless SDK calls whose cohort is kept for their retries, the newest (about 2 MB; at 1,000 calls a second,
the last 16 s): a retry of a call forgotten draws again."""
KeyFunction = Callable[[httpx.Request], "str | int | None"]
"""Returns a call's sticky rollout key (e.g. the user id), or None for per-call assignment."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """A call's cohort, the fraction in force when it was decided, and what decided it."""

    cohort: Cohort
    fraction: float
    by: AssignedBy


class FloatFlagClient(Protocol):
    """The part of an OpenFeature client `flag_fraction` uses."""

    def get_float_value(self, flag_key: str, default_value: float, *args: Any, **kwargs: Any) -> float: ...


def flag_fraction(client: FloatFlagClient, flag_key: str, default: float = 0.0) -> FractionSource:
    """A fraction source reading a float flag from an OpenFeature-style client (no dependency on it).

    >>> from openfeature import api
    >>> guard = Guard(..., rollout=flag_fraction(api.get_client(), "llmguard-rollout"))

    A ``client`` without a ``get_float_value`` method, or a ``flag_key`` that is not a non-empty string, is a
    `GuardConfigError` here; a client that raises or answers a non-fraction later keeps the last good value.
    """
    if not callable(getattr(client, "get_float_value", None)):
        raise GuardConfigError(
            "flag_fraction needs an OpenFeature-style client with get_float_value(flag_key, default_value) "
            f"(e.g. openfeature.api.get_client()), got {type(client).__name__} {client!r}; for the fleet-wide "
            "flag, use Guard(fleet=..., name=...) and llmguard-rollout instead"
        )
    if not isinstance(flag_key, str) or not flag_key:
        raise GuardConfigError(f"flag_fraction flag_key must be the flag's non-empty name, got {flag_key!r}")
    check_fraction(default, "flag_fraction default")
    return lambda: client.get_float_value(flag_key, default)


def check_fraction(value: object, what: str = "rollout") -> float:
    """``value`` as a float in [0, 1], else a `GuardConfigError` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise GuardConfigError(
            f"{what} must be the fraction of calls to guard, from 0.0 to 1.0 (e.g. 0.05), got {value!r}"
        )
    return float(value)


def disabled_by_env(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``LLMGUARD_DISABLED`` asks for the kill switch.

    1/true/yes/on disable; unset, empty, 0/false/no/off do not. Any other value also
    disables (with a warning): in an incident a typo must not leave the guard on.
    """
    raw = (os.environ if environ is None else environ).get(DISABLE_ENV)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in _ENABLED_VALUES:
        return False
    if value not in _DISABLED_VALUES:
        logger.warning("%s=%r is not one of 1/true/yes/on or 0/false/no/off; treating it as 1", DISABLE_ENV, raw)
    return True


def log_rollout_state(rollout: Rollout, replicas: int) -> None:
    """One INFO line on ``llmguard_client`` when a Guard is built: is it on, for which fraction of calls."""
    if rollout.disabled:
        logger.info("llmguard guard OFF: %s is set; every call is passed through unguarded (control)", DISABLE_ENV)
        return
    source = f", from {rollout.source!r}" if rollout.source is not None else ""
    fraction = rollout.fraction
    if fraction == 0.0:
        logger.info(
            "llmguard guard on for no calls (rollout=0%s): every call is passed through until it is raised", source
        )
    else:
        logger.info(
            "llmguard guard on: %g%% of calls guarded (rollout=%g%s), %d replica(s)",
            fraction * 100,
            fraction,
            source,
            replicas,
        )


def key_position(key: str) -> float:
    """Where a rollout key falls in [0, 1): stable across processes, runs and platforms."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8, person=b"llmguard.rollout").digest()
    return int.from_bytes(digest, "big") / 2.0**64


def _as_key(value: object) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (str, int)):
        text = str(value).strip()
        return text or None
    raise TypeError(f"a rollout key must be a str or int, got {type(value).__name__}")


class Rollout:
    """Assigns each call to a cohort; safe to use from several threads and tasks."""

    def __init__(
        self,
        fraction: float | FractionSource,
        *,
        key: KeyFunction | None = None,
        poll_interval: float = 5.0,
        disabled: bool = False,
        rng: random.Random | None = None,
        clock: Callable[[], float] = loop_clock,
    ) -> None:
        if key is not None and not callable(key):
            raise GuardConfigError(f"rollout_key must be a function(request) -> str | None, got {key!r}")
        if (
            isinstance(poll_interval, bool)
            or not isinstance(poll_interval, (int, float))
            or not math.isfinite(poll_interval)
            or poll_interval < 0
        ):
            raise GuardConfigError(f"rollout_poll_interval must be seconds >= 0 (e.g. 5.0), got {poll_interval!r}")
        self.disabled = disabled
        """The kill switch (``LLMGUARD_DISABLED``): fixed for this guard's lifetime."""
        self.key_var: ContextVar[str | None] = ContextVar(f"llmguard_rollout_key_{id(self)}", default=None)
        self._key_fn = key
        self._poll_interval = float(poll_interval)
        self._rng = rng or process_random()
        self._drawn: OrderedDict[str, Cohort] = OrderedDict()
        """The cohort each keyless SDK call's first request drew, by call id: its retries keep it."""
        self._drawing = threading.Lock()
        self._clock = clock
        self._write = threading.Lock()
        self._polling = threading.Lock()
        self._source: FractionSource | None = None
        self._fraction = 0.0
        self._next_poll = 0.0
        self._polled_at = -math.inf
        self._failing = False
        self._key_failing = False
        self.override: float | None = None
        """The fleet-wide fraction (0.0 for its kill switch) when the fleet store holds one: it wins over
        the Guard's own (`llmguard_client._fleet.flag`). None: the Guard's own."""
        self.settle: Callable[[], Awaitable[bool] | None] | None = None
        """Called before each call is assigned: starts the fleet store on the call's event loop, and gives its
        first connection while it is under way (at most its operation timeout, 50 ms), which the caller awaits
        before `assign`, so that a new process's first calls follow the fleet's flag."""
        self.set(fraction)

    # --- the fraction ---------------------------------------------------------------------

    @property
    def source(self) -> FractionSource | None:
        """The callable the fraction is polled from, or None for a fixed number."""
        return self._source

    @property
    def fraction(self) -> float:
        """The fraction in force now: 0.0 while the kill switch is on; the fleet's, when it sets one."""
        if self.disabled:
            return 0.0
        override = self.override
        return override if override is not None else self._current()

    def set(self, fraction: float | FractionSource) -> None:
        """Use a new fraction from now on (a callable source replaces any previous one; a number detaches it)."""
        if callable(fraction):
            with self._write:
                self._source, self._failing = fraction, False
            self._poll(fraction)
            return
        value = check_fraction(fraction)
        with self._write:
            self._source, self._fraction = None, value

    def _current(self) -> float:
        source = self._source
        if source is not None and self._due() and self._polling.acquire(blocking=False):
            try:  # one poller at a time; the others use the last value rather than wait
                self._poll(source)
            finally:
                self._polling.release()
        return self._fraction

    def _due(self) -> bool:
        """Time to poll again: the interval has passed, or the clock reads before the last poll (a read from
        another time line: from sync code, trio's loop clock is not ``time.monotonic``)."""
        now = self._clock()
        return now >= self._next_poll or now < self._polled_at

    def _poll(self, source: FractionSource) -> None:
        self._polled_at = now = self._clock()
        self._next_poll = now + self._poll_interval
        try:
            value = check_fraction(source(), "the rollout source's value")
        except Exception as exc:
            with self._write:
                first, self._failing = not self._failing, True
            if first:
                logger.warning(
                    "llmguard rollout source %r failed (%s: %s); keeping the fraction at %r until it answers",
                    source,
                    type(exc).__name__,
                    exc,
                    self._fraction,
                )
            return
        with self._write:
            if self._source is source:  # a concurrent set() wins over a poll already under way
                self._fraction, self._failing = value, False

    # --- the cohort -------------------------------------------------------------------------

    def assign(
        self, request: httpx.Request, headers: CallerHeaders | None = None, sdk_call: SdkCall = (None, 0)
    ) -> Assignment:
        """Decide one call's cohort (see the module docstring for the order of the rules); ``headers``:
        the request's, if they were read already; ``sdk_call``: the SDK call the request is a request of and its
        retry count (`llmguard_client._core.given_up.sdk_call`): a keyless call's retries keep the cohort its first
        request drew (a fresh draw would guard some retries of control calls)."""
        headers = headers if headers is not None else CallerHeaders(request)
        pinned = headers.cohort
        cohort = pinned.strip().lower() if pinned is not None else None
        if cohort is not None and cohort != "guarded" and cohort != "control":  # checked even while off
            raise UnknownCohortError(
                f"the {COHORT_HEADER} header must be one of {', '.join(COHORTS)}; got {pinned!r}", request=request
            )
        fraction = self.fraction
        if fraction <= 0.0:
            return Assignment("control", 0.0, "off")
        if cohort is not None:
            return Assignment("guarded" if cohort == "guarded" else "control", fraction, "pin")
        key = self._key(request, headers)
        if key is not None:
            return Assignment("guarded" if key_position(key) < fraction else "control", fraction, "key")
        if fraction >= 1.0:
            return Assignment("guarded", fraction, "call")
        return Assignment(self._draw(fraction, *sdk_call), fraction, "call")

    def _draw(self, fraction: float, call: str | None, retry: int) -> Cohort:
        """A keyless call's cohort: drawn at ``fraction`` for a first request, and kept for the retries of its SDK
        ``call`` (``retry`` > 0), while it is among the newest `CALLS_REMEMBERED`."""
        with self._drawing:
            kept = self._drawn.get(call) if call is not None and retry > 0 else None
            cohort: Cohort = kept or ("guarded" if self._rng.random() < fraction else "control")
            if call is not None:
                self._drawn[call] = cohort
                self._drawn.move_to_end(call)
                if len(self._drawn) > CALLS_REMEMBERED:
                    self._drawn.popitem(last=False)
        return cohort

    def _key(self, request: httpx.Request, headers: CallerHeaders) -> str | None:
        header = headers.key
        if header is not None and header.strip():
            return header.strip()
        scoped = self.key_var.get()
        if scoped is not None or self._key_fn is None:
            return scoped
        try:
            key = _as_key(self._key_fn(request))
        except Exception:
            if not self._key_failing:
                self._key_failing = True
                logger.exception("llmguard rollout_key function raised; such calls are assigned per call")
            return None
        return key

    @contextlib.contextmanager
    def keyed(self, key: str | int) -> Iterator[None]:
        """Calls made inside use ``key`` (the ``x-llmguard-key`` header still wins)."""
        try:
            value = _as_key(key)
        except TypeError:
            value = None
        if value is None:
            raise GuardConfigError(f"rollout_key needs a non-empty str or int (e.g. a user id), got {key!r}")
        token = self.key_var.set(value)
        try:
            yield
        finally:
            self.key_var.reset(token)


class RolloutLayer:
    """The pipeline's outermost layer, for guarded calls only.

    The cohort is decided before a `Call` is built (`Rollout.assign` in
    `GuardTransport.handle_async_request`): a control call is passed through
    (`llmguard_client._rollout.passthrough`) and never reaches the pipeline. Here each
    call is counted toward the retry budget (the pipeline serves guarded calls only).
    """

    def __init__(self, rollout: Rollout) -> None:
        self.rollout = rollout

    async def __call__(self, call: Call, route: Route, call_next: Next) -> Outcome:
        if call.budget is not None and route.kind != "retry":  # an SDK's retry (cooperative) is the same call
            call.budget.record_request()
        return await call_next(call, route)
