"""The guard's OpenTelemetry instruments and what each measurement carries.

`Instruments` creates every instrument once per meter provider (`shared_instruments`) and records the
measurements of a call (GenAI client metrics once per logical call, HTTP and llmguard metrics once per
attempt) and of the guard (cool-downs, bulkhead refusals). `BudgetRegistry` feeds the budget-level gauge.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from llmguard_client.telemetry import semconv as sc
from llmguard_client.telemetry._otel_attributes import Attrs
from llmguard_client.telemetry._otel_genai_metrics import gen_ai_metrics
from llmguard_client.telemetry._otel_providers import VERSION
from llmguard_client.telemetry._record_builder import AnyAttempt, AnyCall
from llmguard_client.telemetry.record import PhaseRecord

__all__ = ["BudgetRegistry", "Instruments", "budget_registry", "shared_instruments"]

V = TypeVar("V")


class BudgetRegistry:
    """The budget levels reported by one observable gauge.

    An SDK meter keeps the callbacks of the *first* observable gauge registered under a name,
    so every instrumentation sharing a meter provider shares one registry. An entry lives as
    long as the instrumentation that registered it (a guard's default instrumentation dies
    with the guard); a bound method is also held weakly (the guard registers its budget's
    ``published_level``: nothing here refers to the guard). Each live entry keeps a stable
    index; the lowest free one is reused, and index 0 is reported without attributes.

    `observe` runs on the exporter's thread: it only calls the registered functions.
    """

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: list[tuple[weakref.ref[Any], Callable[[], Callable[[], float] | None], int]] = []

    def _prune(self) -> None:
        self._entries = [e for e in self._entries if e[0]() is not None and e[1]() is not None]

    def add(self, owner: object, level: Callable[[], float]) -> None:
        """Report ``level()`` for as long as ``owner`` (and ``level``, if a bound method) lives."""
        self._prune()
        used = {index for _, _, index in self._entries}
        index = next(i for i in range(len(used) + 1) if i not in used)
        ref: Callable[[], Callable[[], float] | None] = (
            weakref.WeakMethod(level) if inspect.ismethod(level) else _strong(level)
        )
        self._entries.append((weakref.ref(owner), ref, index))

    def observe(self, options: CallbackOptions) -> Iterable[Observation]:
        """The gauge's callback: one observation per live entry."""
        self._prune()
        out = []
        for _, ref, index in self._entries:
            level = ref()
            if level is None:
                continue
            try:
                value = float(level())
            except Exception:  # a broken level must not break the export of the others
                continue
            out.append(Observation(value, {sc.LLMGUARD_BUDGET_INDEX: index} if index else None))
        return out


def _strong(level: Callable[[], float]) -> Callable[[], Callable[[], float] | None]:
    return lambda: level


class _PerProvider(Generic[V]):
    """One value per meter provider, found by the provider's identity.

    Not a ``WeakKeyDictionary``: that needs a hashable key, and a valid provider may not be hashable (logfire's
    global provider is a dataclass with ``eq``, so ``__hash__`` is None). An entry goes when its provider is
    collected; a provider that cannot be weakly referenced is kept for the process's life, as a global one is.
    """

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[int, tuple[Callable[[], object], V]] = {}

    def get(self, provider: object, make: Callable[[], V]) -> V:
        """The value of ``provider``, made by ``make()`` the first time."""
        key = id(provider)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is provider:
            return entry[1]
        value = make()
        entries = self._entries

        def forget(ref: object) -> None:  # the provider is being collected; its id may be reused after
            if entries.get(key, (None,))[0] is ref:
                entries.pop(key, None)

        ref: Callable[[], object]
        try:
            ref = weakref.ref(provider, forget)
        except TypeError:  # not weakly referable (``__slots__`` without ``__weakref__``)
            ref = _strong_provider(provider)
        entries[key] = (ref, value)
        return value

    def __len__(self) -> int:
        return len(self._entries)


def _strong_provider(provider: object) -> Callable[[], object]:
    return lambda: provider


_GLOBAL_BUDGETS = BudgetRegistry()
_BUDGETS_BY_PROVIDER: _PerProvider[BudgetRegistry] = _PerProvider()


def budget_registry(meter_provider: MeterProvider | None) -> BudgetRegistry:
    """The registry shared by every instrumentation on ``meter_provider`` (None: the global one)."""
    if meter_provider is None:
        return _GLOBAL_BUDGETS
    return _BUDGETS_BY_PROVIDER.get(meter_provider, BudgetRegistry)


_GLOBAL_INSTRUMENTS: dict[bool, Instruments] = {}
_INSTRUMENTS_BY_PROVIDER: _PerProvider[dict[bool, Instruments]] = _PerProvider()


def shared_instruments(meter_provider: MeterProvider | None, latest: bool) -> Instruments:
    """The instruments of every instrumentation on ``meter_provider`` (None: the global one), made once per
    provider and naming: the global provider's proxy keeps every meter it hands out, with its instruments, for
    the process's life, so a meter made per Guard (a Guard per test, per request, per ``asyncio.run``) grew by
    about 2 KB a Guard until an SDK was set, and then made real instruments of them all."""
    by_naming = _GLOBAL_INSTRUMENTS if meter_provider is None else _INSTRUMENTS_BY_PROVIDER.get(meter_provider, dict)
    instruments = by_naming.get(latest)
    if instruments is None:
        meter = metrics.get_meter(sc.INSTRUMENTATION_SCOPE, VERSION, meter_provider, sc.SCHEMA_URL)
        instruments = by_naming[latest] = Instruments(meter, budget_registry(meter_provider), latest=latest)
    return instruments


class Instruments:
    """Every instrument of one meter provider's instrumentations, and the attributes of each measurement."""

    __slots__ = (
        "attempts",
        "budget_refusals",
        "bulkhead",
        "calls",
        "cooldown_s",
        "cooldowns",
        "genai",
        "http_duration",
    )

    def __init__(self, meter: Meter, budgets: BudgetRegistry, latest: bool = False) -> None:
        """``latest``: emit the GenAI metrics under the latest names (see `_otel_genai_metrics`)."""
        seconds = sc.UNIT_SECONDS
        self.genai = gen_ai_metrics(meter, latest)
        self.http_duration = meter.create_histogram(
            sc.HTTP_CLIENT_REQUEST_DURATION,
            unit=seconds,
            description="Duration of HTTP client requests (one per physical attempt).",
            explicit_bucket_boundaries_advisory=sc.HTTP_DURATION_BUCKETS,
        )
        self.calls = meter.create_counter(
            sc.LLMGUARD_CLIENT_CALLS, unit=sc.UNIT_CALL, description="Logical calls, by cohort and status."
        )
        self.attempts = meter.create_counter(
            sc.LLMGUARD_CLIENT_ATTEMPTS,
            unit=sc.UNIT_ATTEMPT,
            description="Physical attempts, by kind (primary, retry, hedge) and outcome.",
        )
        self.budget_refusals = meter.create_counter(
            sc.LLMGUARD_CLIENT_BUDGET_REFUSALS,
            unit=sc.UNIT_ATTEMPT,
            description="Extra attempts (retries, hedges) refused by the shared budget.",
        )
        self.cooldowns = meter.create_counter(
            sc.LLMGUARD_CLIENT_REPLICA_COOLDOWNS,
            unit=sc.UNIT_COOLDOWN,
            description="Replicas put in cool-down, by reason.",
        )
        self.cooldown_s = meter.create_histogram(
            sc.LLMGUARD_CLIENT_REPLICA_COOLDOWN_DURATION,
            unit=seconds,
            description="Length of the cool-downs imposed on replicas.",
            explicit_bucket_boundaries_advisory=sc.COOLDOWN_BUCKETS,
        )
        self.bulkhead = meter.create_counter(
            sc.LLMGUARD_CLIENT_BULKHEAD_REJECTIONS,
            unit=sc.UNIT_CALL,
            description="Calls refused because their tier's bulkhead was full.",
        )
        meter.create_observable_gauge(
            sc.LLMGUARD_CLIENT_BUDGET_LEVEL,
            callbacks=[budgets.observe],
            unit=sc.UNIT_ATTEMPT,
            description="Extra attempts the shared retry budget allows now.",
        )

    # -- the guard ------------------------------------------------------------------------------
    def replica_cooled(self, server: tuple[str, int] | None, seconds: float, reason: str) -> None:
        attrs: Attrs = {sc.LLMGUARD_COOLDOWN_REASON: reason}
        if server is not None:
            attrs[sc.SERVER_ADDRESS], attrs[sc.SERVER_PORT] = server
        self.cooldowns.add(1, attrs)
        self.cooldown_s.record(seconds, attrs)

    def bulkhead_rejected(self, tier: str) -> None:
        self.bulkhead.add(1, {sc.LLMGUARD_TIER: tier})

    # -- one call -------------------------------------------------------------------------------
    def budget_refused(self, record: AnyCall) -> None:
        self.budget_refusals.add(1, {sc.LLMGUARD_TIER: record.tier, sc.LLMGUARD_COHORT: record.cohort})

    def attempt_kind_outcome(self, record: AnyCall, attempt: AnyAttempt) -> None:
        """``llmguard.client.attempts``: one per attempt, whatever the span settings."""
        attrs: Attrs = {
            sc.LLMGUARD_TIER: record.tier,
            sc.LLMGUARD_COHORT: record.cohort,
            sc.LLMGUARD_ATTEMPT_KIND: attempt.kind,
            sc.LLMGUARD_ATTEMPT_OUTCOME: attempt.outcome,
        }
        self.attempts.add(1, attrs)

    def http_request(
        self, record: AnyCall, attempt: AnyAttempt, server: tuple[str, int] | None, err: str | None
    ) -> None:
        """``http.client.request.duration`` of a finished attempt."""
        finish = attempt.finish
        if finish is None:
            return
        http: Attrs = {
            sc.HTTP_REQUEST_METHOD: record.method,
            sc.LLMGUARD_TIER: record.tier,
            sc.LLMGUARD_COHORT: record.cohort,
            sc.LLMGUARD_ATTEMPT_OUTCOME: attempt.outcome,
        }
        if server is not None:
            http[sc.SERVER_ADDRESS], http[sc.SERVER_PORT] = server
        if attempt.status_code is not None:
            http[sc.HTTP_RESPONSE_STATUS_CODE] = attempt.status_code
        if err is not None:
            http[sc.ERROR_TYPE] = err
        self.http_duration.record(max(finish - attempt.start, 0.0), http)

    def gen_ai_call(
        self, record: PhaseRecord, op: str, provider: str, err: str | None, server: tuple[str, int] | None
    ) -> None:
        """The GenAI client metrics, once per logical call."""
        attrs: Attrs = {
            sc.GEN_AI_OPERATION_NAME: op,
            sc.GEN_AI_PROVIDER_NAME: provider,
            sc.LLMGUARD_TIER: record.tier,
            sc.LLMGUARD_COHORT: record.cohort,
        }
        if record.model:
            attrs[sc.GEN_AI_REQUEST_MODEL] = record.model
        if record.response_model:
            attrs[sc.GEN_AI_RESPONSE_MODEL] = record.response_model
        if server is not None:
            attrs[sc.SERVER_ADDRESS], attrs[sc.SERVER_PORT] = server
        self.genai.record(record, op, attrs, err)

    def call(self, record: PhaseRecord, op: str, err: str | None) -> None:
        """``llmguard.client.calls``, once per logical call: each request an SDK sent is one, its retries marked
        (``llmguard.sdk_retry``), so that the SDK's calls can be counted (those not marked) beside their outcomes."""
        calls: Attrs = {
            sc.GEN_AI_OPERATION_NAME: op,
            sc.LLMGUARD_TIER: record.tier,
            sc.LLMGUARD_COHORT: record.cohort,
            sc.LLMGUARD_STATUS: record.status,
            sc.LLMGUARD_SDK_RETRY: record.sdk_retry > 0,
        }
        if err is not None:
            calls[sc.ERROR_TYPE] = err
        self.calls.add(1, calls)
