"""Guard: the configuration, the state shared by every call, and the ways in."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from types import TracebackType
from typing import Any

import httpx

from llmguard_client._config import BudgetPolicy, Bulkhead, FailureMode, HedgePolicy, Replica, RetryPolicy, Tier
from llmguard_client._errors import GuardConfigError, UnknownTierError
from llmguard_client._replicas import ReplicaSet
from llmguard_client._transport import GuardTransport, RecordCallback
from llmguard_client._ttft_stats import TTFTStats
from llmguard_client.layers.budget import RetryBudget
from llmguard_client.layers.bulkhead import TierBulkhead
from llmguard_client.layers.rollout import Rollout
from llmguard_client.telemetry.hooks import Instrumentation

_DEFAULT_TIERS: Mapping[str, Tier] = {
    "interactive": Tier(ttft=2.0, total=60.0, stall=10.0),
    "batch": Tier(ttft=60.0, total=900.0, stall=60.0),
}
_DEFAULT_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
_UNSET: Any = object()


def default_transport(replica: Replica) -> httpx.AsyncBaseTransport:
    """One connection pool per replica (no transport-level retries: the guard decides)."""
    return httpx.AsyncHTTPTransport(limits=_DEFAULT_LIMITS, retries=0)


class Guard:
    """Client-side resilience for one model served by several OpenAI-compatible replicas.

    >>> guard = Guard(replicas=["http://10.0.0.1:8000", "http://10.0.0.2:8000"],
    ...               tiers={"interactive": Tier(ttft=1.0, total=10.0, stall=2.0)})
    >>> oai = openai.AsyncOpenAI(base_url="http://10.0.0.1:8000/v1", api_key=..., http_client=guard.http_client())

    replicas:      base URLs (or `Replica` with per-replica headers) of one model's replicas.
    tiers:         SLO tiers by name; a call picks one with the ``x-llmguard-tier`` header or
                   ``with guard.tier(name)``, else ``default_tier``.
    hedge:         `HedgePolicy`, on by default with >= 2 replicas; None switches hedging off.
    retry:         `RetryPolicy`, on by default; None switches retries off.
    budget:        `BudgetPolicy` shared by retries and hedges; None: unbounded (not advised).
    tier_budgets:  a separate `BudgetPolicy` for some tiers (e.g. so batch retries cannot spend
                   the interactive tier's budget); the other tiers share ``budget``.
    bulkheads:     per-tier `Bulkhead` limits (none by default).
    rollout:       fraction of calls that take the guarded path (the rest: control cohort).
    failure_mode:  how guard failures reach the caller (see `FailureMode`).
    instrumentation: OpenTelemetry by default (a no-op without an SDK); None: none.
    on_record:     called with each call's `PhaseRecord` when it ends.
    transport_factory: builds each replica's inner transport (default: an httpx pool each).
    """

    def __init__(
        self,
        replicas: Sequence[str | Replica],
        tiers: Mapping[str, Tier] | None = None,
        default_tier: str | None = None,
        *,
        hedge: HedgePolicy | None = _UNSET,
        retry: RetryPolicy | None = _UNSET,
        budget: BudgetPolicy | None = _UNSET,
        tier_budgets: Mapping[str, BudgetPolicy] | None = None,
        bulkheads: Mapping[str, Bulkhead] | None = None,
        rollout: float = 1.0,
        failure_mode: FailureMode = "auto",
        instrumentation: Instrumentation | None = _UNSET,
        on_record: RecordCallback | None = None,
        transport_factory: Callable[[Replica], httpx.AsyncBaseTransport] = default_transport,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        resolved = _replicas(replicas)
        tiers = dict(_DEFAULT_TIERS if tiers is None else tiers)
        if not tiers:
            raise GuardConfigError("tiers must name at least one Tier, e.g. {'interactive': Tier(ttft=1, total=30)}")
        for name, tier in tiers.items():
            if not isinstance(name, str) or not name.strip() or not isinstance(tier, Tier):
                raise GuardConfigError(f"tiers must map non-empty names to Tier values, got {name!r}: {tier!r}")
        default_tier = default_tier if default_tier is not None else next(iter(tiers))
        if default_tier not in tiers:
            raise UnknownTierError(f"default_tier {default_tier!r} is not one of the tiers: {', '.join(sorted(tiers))}")
        if failure_mode not in ("auto", "response", "raise"):
            raise GuardConfigError(f"failure_mode must be 'auto', 'response' or 'raise', got {failure_mode!r}")
        if hedge is _UNSET:
            hedge = HedgePolicy() if len(resolved) >= 2 else None
        if retry is _UNSET:
            retry = RetryPolicy()
        if budget is _UNSET:
            budget = BudgetPolicy()
        policies = (("hedge", hedge, HedgePolicy), ("retry", retry, RetryPolicy), ("budget", budget, BudgetPolicy))
        for label, value, kind in policies:
            if value is not None and not isinstance(value, kind):
                raise GuardConfigError(f"{label} must be a {kind.__name__} or None, got {value!r}")
        bulkheads = dict(bulkheads or {})
        unknown = sorted(set(bulkheads) - set(tiers))
        if unknown:
            raise UnknownTierError(f"bulkheads name unknown tier(s) {unknown}; tiers: {', '.join(sorted(tiers))}")
        for name, limit in bulkheads.items():
            if not isinstance(limit, Bulkhead):
                raise GuardConfigError(
                    f"bulkheads[{name!r}] must be a Bulkhead(max_in_flight=..., max_waiting=...), got {limit!r}"
                )
        tier_budgets = dict(tier_budgets or {})
        unknown = sorted(set(tier_budgets) - set(tiers))
        if unknown:
            raise UnknownTierError(f"tier_budgets name unknown tier(s) {unknown}; tiers: {', '.join(sorted(tiers))}")
        for name, policy in tier_budgets.items():
            if not isinstance(policy, BudgetPolicy):
                raise GuardConfigError(f"tier_budgets[{name!r}] must be a BudgetPolicy, got {policy!r}")
        cohorts = Rollout(rollout)
        if instrumentation is _UNSET:
            from llmguard_client.telemetry.otel import OpenTelemetryInstrumentation

            instrumentation = OpenTelemetryInstrumentation()
        if instrumentation is None:
            from llmguard_client.telemetry.hooks import NO_INSTRUMENTATION

            instrumentation = NO_INSTRUMENTATION

        self.replicas: tuple[Replica, ...] = tuple(resolved)
        self.tiers: Mapping[str, Tier] = tiers
        self.default_tier = default_tier
        self.hedge_policy = hedge
        self.retry_policy = retry
        def make_budget(policy: BudgetPolicy) -> RetryBudget:
            return RetryBudget(policy.ratio, policy.floor, policy.window, clock=clock)

        self.budget = make_budget(budget) if budget is not None else None
        """The shared budget of retries and hedges (None: unbounded); ``budget.snapshot()`` reads it."""
        self.tier_budgets: Mapping[str, RetryBudget] = {name: make_budget(p) for name, p in tier_budgets.items()}
        self._tier_var: ContextVar[str | None] = ContextVar(f"llmguard_tier_{id(self)}", default=None)
        self._replica_set = ReplicaSet(resolved, transport_factory)
        router = self._replica_set.router
        self.ttft_stats = TTFTStats(hedge or HedgePolicy(), router.degraded, lambda: router.epoch)
        """TTFT per replica, tier and stream kind: the hedge delay and the retry layer's expected TTFT."""
        if self.budget is not None:
            instrumentation.register_budget(lambda: self.budget.level if self.budget is not None else 0.0)
        self._transport = GuardTransport(
            replicas=self._replica_set,
            tiers=tiers,
            default_tier=default_tier,
            tier_var=self._tier_var,
            hedge=hedge,
            retry=retry,
            budgets={name: self.tier_budgets.get(name, self.budget) for name in tiers},
            bulkheads={name: TierBulkhead(b) for name, b in bulkheads.items()},
            rollout=cohorts,
            failure_mode=failure_mode,
            instrumentation=instrumentation,
            on_record=on_record,
            clock=clock,
            ttft_stats=self.ttft_stats,
        )

    @property
    def transport(self) -> GuardTransport:
        """The `httpx.AsyncBaseTransport`, for building your own client."""
        return self._transport

    def http_client(self, **kwargs: Any) -> httpx.AsyncClient:
        """An `httpx.AsyncClient` whose transport is the guard.

        Its own timeout defaults to 10 s to connect and none to read, because the tier
        deadlines govern reads; pass ``timeout=`` to override. Closing the client leaves the
        guard open (``await guard.aclose()`` closes the pools).
        """
        kwargs.setdefault("timeout", httpx.Timeout(None, connect=10.0))
        return httpx.AsyncClient(transport=self._transport, **kwargs)

    @contextlib.contextmanager
    def tier(self, name: str) -> Iterator[None]:
        """Calls made inside use tier ``name`` (a request's ``x-llmguard-tier`` header still wins)."""
        if name not in self.tiers:
            raise UnknownTierError(f"unknown tier {name!r}; configured tiers: {', '.join(sorted(self.tiers))}")
        token = self._tier_var.set(name)
        try:
            yield
        finally:
            self._tier_var.reset(token)

    async def aclose(self) -> None:
        """Close every replica's connection pool; later requests fail with a clear error."""
        if not self._transport.closed:
            self._transport.closed = True
            await self._replica_set.aclose()

    async def __aenter__(self) -> Guard:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _replicas(replicas: Sequence[str | Replica]) -> list[Replica]:
    if isinstance(replicas, (str, Replica)) or not isinstance(replicas, Sequence):
        raise GuardConfigError(
            f"replicas must be a list of base URLs or Replica values, got {type(replicas).__name__}: {replicas!r}"
        )
    if not replicas:
        raise GuardConfigError("replicas must name at least one base URL, e.g. ['http://10.0.0.1:8000']")
    resolved = [r if isinstance(r, Replica) else Replica(r) for r in replicas]
    seen: set[str] = set()
    for replica in resolved:
        url = httpx.URL(replica.name)
        key = str(url.copy_with(scheme=url.scheme.lower(), host=url.host.lower())).rstrip("/")
        if key in seen:
            raise GuardConfigError(f"replica {replica.name!r} is listed twice; each replica must appear once")
        seen.add(key)
    return resolved
