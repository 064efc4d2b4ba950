"""Guard: the configuration, the state shared by every call, and the ways in."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

import anyio
import httpx

from llmguard_client._admission.layer import AdmissionLayer
from llmguard_client._admission.policy import Admission
from llmguard_client._budget.budget import RetryBudget
from llmguard_client._chaos import Chaos, chaos_switch, refuse_unless_enabled
from llmguard_client._compose import Policies, SharedState, build_transport
from llmguard_client._core.clock import Clock, loop_clock
from llmguard_client._core.lazy_module import LazyModule
from llmguard_client._core.lease import CLOSE_GRACE, LeaseRegistry
from llmguard_client._core.transport import GuardTransport, RecordCallback
from llmguard_client._fleet import make_fleet, share_budgets
from llmguard_client._http.pool import replica_transport
from llmguard_client._http.proxy import environment_proxy
from llmguard_client._http.tls import default_tls_context
from llmguard_client._layers.bulkhead import TierBulkhead
from llmguard_client._ratelimit.buckets import FleetOps, build_rate_limiter
from llmguard_client._rollout.passthrough import PassthroughPool
from llmguard_client._rollout.rollout import FractionSource, KeyFunction, Rollout, disabled_by_env, log_rollout_state
from llmguard_client._routing.affinity.routing import resolve_affinity, session_for
from llmguard_client._routing.replicas import ReplicaSet
from llmguard_client._routing.ttft_stats import TTFTStats
from llmguard_client.config import (
    AffinityChoice,
    BudgetPolicy,
    Bulkhead,
    ContinuationPolicy,
    FailureMode,
    HedgePolicy,
    RateLimit,
    Replica,
    RetryPolicy,
    Tier,
    per_tier,
    per_tier_continuation,
    resolve_replicas,
)
from llmguard_client.edges._registry import stop_sync_runner
from llmguard_client.edges.httpx_async import httpx_client
from llmguard_client.edges.sdk import TakesAnything, TakesHttpClient
from llmguard_client.errors import GuardClosed, GuardConfigError, UnknownTierError
from llmguard_client.snapshot import GuardSnapshot, build_snapshot
from llmguard_client.telemetry.capture import Capture, capture
from llmguard_client.telemetry.contained import ContainedCallback, contained
from llmguard_client.telemetry.default import default_instrumentation
from llmguard_client.telemetry.hooks import NO_INSTRUMENTATION, Instrumentation
from llmguard_client.telemetry.record_logger import RecordLogger

if TYPE_CHECKING:
    import httpx2
else:  # optional: imported when typing.get_type_hints reads an annotation that names it
    httpx2 = LazyModule("httpx2")

_H = TypeVar("_H")

_DEFAULT_TIERS: Mapping[str, Tier] = {
    # The deadlines are the user's SLOs: a call that names no tier has none of the guard's own. Only the caller's
    # read timeout bounds it (each read, the silence after the first token included: `within_read_timeout`), as
    # without a guard, so the guard never fails a call the plain SDK would have served: a server that sends
    # keep-alives while it thinks for longer than the read timeout, or a stream that lasts for hours.
    "default": Tier(ttft=math.inf, total=math.inf, stall=None),
    "interactive": Tier(ttft=2.0, total=60.0, stall=10.0),
    "batch": Tier(ttft=60.0, total=900.0, stall=60.0),
}
DEFAULT_POOL_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
"""Each replica's connection pool (``Guard(pool_limits=...)``): the openai SDK's own limits, so a burst through
the guard reuses as many warm connections as one through the SDK alone (`benchmarks/burst.py`)."""


class _Default:
    """The default of a ``Guard`` argument whose default is built per Guard (``hedge``, ``retry``, ...): shown as
    ``<default>`` in ``help(Guard)``."""

    def __repr__(self) -> str:
        return "<default>"


_UNSET: Any = _Default()

logger = logging.getLogger("llmguard_client")


def default_transport(replica: Replica, limits: httpx.Limits = DEFAULT_POOL_LIMITS) -> httpx.AsyncBaseTransport:
    """One connection pool per replica (`replica_transport`), all sharing one TLS context (building one loads
    the CA bundle, 0.3-1.7 s each on a busy 2-core machine), through the proxy the environment names for the
    replica, as the SDKs' own clients would (`environment_proxy`)."""
    return replica_transport(limits, default_tls_context(), environment_proxy(replica.url))


def _require_httpx2(method: str) -> None:
    """A missing httpx2 named with the extra that brings it, not only as a module that is not there."""
    if importlib.util.find_spec("httpx2") is None:
        raise ModuleNotFoundError(
            f"guard.{method}() needs httpx2, the [httpx2] extra: pip install 'llmguard-client[httpx2]' "
            "(openai >= 3 and anthropic >= 1 bring it; for openai 1.x/2.x use guard.http_client(), or "
            "guard.http_client_for(SDKClass) for whichever the installed SDK takes)",
            name="httpx2",
        )


def _check_policy(label: str, value: object, kind: type) -> None:
    if value is not None and not isinstance(value, kind):
        raise GuardConfigError(f"{label} must be a {kind.__name__} or None, got {value!r}")


def _check_grace(grace: object) -> None:
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace < math.inf:
        raise GuardConfigError(f"grace must be a finite number of seconds >= 0, got {grace!r}")


def _check_on_record(on_record: object) -> None:
    if on_record is not None and not callable(on_record):
        raise GuardConfigError(
            "on_record must be None or a callable taking each call's PhaseRecord (e.g. "
            f"RecordLogger('records.jsonl') or a list's append), got {on_record!r}"
        )


def _async_transport(transport: object) -> bool:
    """An httpx async transport, or one that serves as such (``handle_async_request`` and ``aclose``), but not
    httpx2's pool (`_httpx2_pool`)."""
    if isinstance(transport, httpx.AsyncBaseTransport):
        return True
    if _httpx2_pool(transport):
        return False
    return callable(getattr(transport, "handle_async_request", None)) and callable(getattr(transport, "aclose", None))


def _httpx2_pool(transport: object) -> bool:
    """``transport`` sends requests through httpx2's own pool (``httpx2.AsyncHTTPTransport``'s way), which reads the
    same as httpx's yet takes httpx2 requests only, not the httpx ones the guard sends. Another transport built on
    httpx2's classes (its ``MockTransport``, an adapter) is judged by what it does, as any other."""
    if not any(kind.__module__.partition(".")[0] == "httpx2" for kind in type(transport).__mro__):
        return False  # httpx2 is not imported for a transport that is none of its
    pool = httpx2.AsyncHTTPTransport
    return isinstance(transport, pool) and type(transport).handle_async_request is pool.handle_async_request


def _checked_factory(
    factory: Callable[[Replica], httpx.AsyncBaseTransport],
) -> Callable[[Replica], httpx.AsyncBaseTransport]:
    """``transport_factory`` checked: a callable, and each transport it builds an async httpx one (the Guard
    calls it while it is built, so a wrong one is refused there, not at the first call)."""
    wanted = (
        "transport_factory must be a callable returning an httpx.AsyncBaseTransport (or an object with "
        "handle_async_request() and aclose())"
    )
    if not callable(factory):
        raise GuardConfigError(
            f"{wanted}, got an {type(factory).__name__} instance; pass a function, "
            "e.g. lambda replica: httpx.AsyncHTTPTransport(http2=True)"
        )
    if (signature := _refused_signature(factory, object())) is not None:
        raise GuardConfigError(
            f"transport_factory must take one argument, the Replica to build a transport for: "
            f"factory(replica) -> httpx.AsyncBaseTransport (e.g. lambda replica: httpx.AsyncHTTPTransport()); "
            f"got {factory!r}, which takes {signature}"
        )

    def build(replica: Replica) -> httpx.AsyncBaseTransport:
        transport: object = factory(replica)
        if not _async_transport(transport):
            got = "None" if transport is None else type(transport).__name__
            if _httpx2_pool(transport):
                got = f"httpx2.{got}"
                hint = (
                    " (httpx2's: build the same with httpx, e.g. httpx.AsyncHTTPTransport(uds=...), whichever client "
                    "the guard hands out)"
                )
            elif isinstance(transport, httpx.BaseTransport):
                hint = " (a sync transport: use its async kind, e.g. httpx.AsyncHTTPTransport)"
            else:
                hint = ""
            if isinstance(transport, httpx.BaseTransport):
                transport.close()  # refused, so the Guard never holds it: nothing it opened stays open
            raise GuardConfigError(f"{wanted}, got {got} for replica {replica.name!r}{hint}")
        return cast(httpx.AsyncBaseTransport, transport)

    return build


def _refused_signature(function: Callable[..., object], *args: object) -> str | None:
    """``function``'s signature when it cannot be called with ``args``; None when it can, or when Python cannot
    read its signature (some builtins): such a function is then judged by its call."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*args)
    except TypeError:
        bare = [p.replace(annotation=p.empty) for p in signature.parameters.values()]
        return str(signature.replace(parameters=bare, return_annotation=signature.empty))
    return None


def _checked_clock(clock: object) -> Clock:
    """``clock`` checked: a callable taking no argument. It is not read here: a clock may only be readable inside
    the event loop the calls run on (``trio.current_time``), or create one when read outside it
    (``asyncio.get_event_loop().time``), and any number type it returns (``numpy.int64``) is one the calls can use."""
    wanted = (
        "clock must be a callable taking no argument and returning the current time in seconds (e.g. time.monotonic)"
    )
    if not callable(clock):
        raise GuardConfigError(f"{wanted}, got {clock!r}")
    if (signature := _refused_signature(clock)) is not None:
        raise GuardConfigError(f"{wanted}, got {clock!r}, which takes {signature}")
    return cast(Clock, clock)


def _validated(
    tiers: Mapping[str, Tier] | None,
    default_tier: str | None,
    *,
    hedge: HedgePolicy | None,
    retry: RetryPolicy | None,
    continuation: ContinuationPolicy | Mapping[str, ContinuationPolicy] | None,
    failure_mode: FailureMode,
) -> Policies:
    """The tiers and the per-call policies, checked (`GuardConfigError`, `UnknownTierError`)."""
    if tiers is not None and not isinstance(tiers, Mapping):
        raise GuardConfigError(
            "tiers must map tier names to Tier values, e.g. {'interactive': Tier(ttft=1.0, total=30.0)}; "
            f"got {type(tiers).__name__} {tiers!r}"
        )
    tiers = dict(_DEFAULT_TIERS if tiers is None else tiers)
    if not tiers:
        raise GuardConfigError("tiers must name at least one Tier, e.g. {'interactive': Tier(ttft=1, total=30)}")
    for label, tier in tiers.items():
        if not isinstance(label, str) or not label.strip() or not isinstance(tier, Tier):
            raise GuardConfigError(f"tiers must map non-empty names to Tier values, got {label!r}: {tier!r}")
    default_tier = default_tier if default_tier is not None else next(iter(tiers))
    if default_tier not in tiers:
        raise UnknownTierError(f"default_tier {default_tier!r} is not one of the tiers: {', '.join(sorted(tiers))}")
    if failure_mode not in ("auto", "response", "raise"):
        raise GuardConfigError(f"failure_mode must be 'auto', 'response' or 'raise', got {failure_mode!r}")
    _check_policy("hedge", hedge, HedgePolicy)
    _check_policy("retry", retry, RetryPolicy)
    return Policies(tiers, default_tier, hedge, retry, per_tier_continuation(continuation, tiers), failure_mode)


class Guard:
    """Client-side resilience for one model served by several OpenAI-compatible replicas.

    >>> guard = Guard(replicas=["http://10.0.0.1:8000", "http://10.0.0.2:8000"],
    ...               tiers={"interactive": Tier(ttft=1.0, total=10.0, stall=2.0)})
    >>> oai = openai.AsyncOpenAI(base_url="http://10.0.0.1:8000/v1", api_key=..., http_client=guard.http_client())

    replicas:      base URLs (or `Replica` with per-replica headers) of one model's replicas.
    tiers:         SLO tiers by name; a call picks one with the ``x-llmguard-tier`` header or
                   ``with guard.tier(name)``, else ``default_tier``. Without it: ``default`` (no ttft or total
                   deadline: the client's read timeout bounds each read), ``interactive`` and ``batch``.
    hedge:         `HedgePolicy`, on by default with >= 2 replicas; None switches hedging off.
    retry:         `RetryPolicy`, on by default; None switches retries off.
    budget:        `BudgetPolicy` shared by retries and hedges; None: unbounded (not advised).
    tier_budgets:  a separate `BudgetPolicy` for some tiers (e.g. so batch retries cannot spend
                   the interactive tier's budget); the other tiers share ``budget``.
    bulkheads:     per-tier `Bulkhead` limits (none by default).
    continuation:  `ContinuationPolicy` (every tier) or {tier: policy} to finish a stream that breaks after
                   its first token on another replica; None (default): off.
    rate_limit:    the provider's `RateLimit` shared by the replicas (a `Replica` may have its own); None: none.
    admission:     `Admission`: learn each replica's capacity and refuse at once (`Overloaded`) a call it
                   could not serve within its ttft (docs/overload.md); None (default): off.
    fleet:         a Redis/Valkey URL (``redis://``, ``rediss://``, ``redis+cluster://``) shared by the processes
                   of one service: cool-downs, open circuits, the rollout flag and the rate limit's bucket are
                   then fleet-wide (docs/fleet.md); or a store object offering ``key``/``available``/``run``.
    name:          the service's name, needed with a ``fleet`` URL: it namespaces the keys (e.g. "checkout").
    rollout:       fraction of calls that take the guarded path (the rest: the control cohort, passed
                   through untouched), or a callable returning it (polled at most every
                   ``rollout_poll_interval`` s); ``guard.set_rollout()`` changes it live. The environment
                   variable ``LLMGUARD_DISABLED=1`` at construction switches the guard off (docs/rollout.md).
    rollout_key:   function(request) -> sticky key (e.g. the user id) or None; see ``guard.rollout_key()``.
    rollout_poll_interval: seconds between two reads of a callable ``rollout`` (default 5).
    affinity:      cache-aware routing: "explicit" (keys given), "auto", `AffinityPolicy`, None (docs/routing.md).
    chaos:         a `Chaos` policy: faults injected into the guard's own attempts, for testing (docs/reliability.md).
                   Refused unless the environment variable ``LLMGUARD_CHAOS=1`` is set; ``guard.set_chaos()``
                   switches it live.
    failure_mode:  how guard failures reach the caller (see `FailureMode`).
    instrumentation: OpenTelemetry by default (a no-op without an SDK); None: none.
    on_record:     called with each call's `PhaseRecord` when it ends.
    pool_limits:   each replica's connection pool limits (default `DEFAULT_POOL_LIMITS`).
    transport_factory: ``factory(replica) -> httpx.AsyncBaseTransport``, each replica's inner transport (default:
                   an httpx pool each, with ``pool_limits``).
    clock:         the clock every deadline, budget, hint and poll interval is read on: ``clock() -> float``
                   seconds (default: the running event loop's,
                   on which every timer runs too; a trio run's moved onto ``time.monotonic``'s line, so that
                   one run after another keeps one time line). To test in virtual time, pass none and run the event loop
                   in it (looptime on asyncio, ``MockClock`` on trio: docs/usage.md).
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
        rollout: float | FractionSource = 1.0,
        rollout_key: KeyFunction | None = None,
        rollout_poll_interval: float = 5.0,
        failure_mode: FailureMode = "auto",
        instrumentation: Instrumentation | None = _UNSET,
        on_record: RecordCallback | None = None,
        pool_limits: httpx.Limits | None = None,
        transport_factory: Callable[[Replica], httpx.AsyncBaseTransport] | None = None,
        clock: Clock = _UNSET,
        continuation: ContinuationPolicy | Mapping[str, ContinuationPolicy] | None = None,
        rate_limit: RateLimit | None = None,
        fleet: str | FleetOps | None = None,
        name: str | None = None,
        affinity: AffinityChoice = "explicit",  # not "auto": docs/routing.md, "The default"
        admission: Admission | None = None,
        chaos: Chaos | None = None,
    ) -> None:
        resolved = resolve_replicas(replicas)
        if hedge is _UNSET:
            hedge = HedgePolicy() if len(resolved) >= 2 else None
        policies = _validated(
            tiers,
            default_tier,
            hedge=hedge,
            retry=RetryPolicy() if retry is _UNSET else retry,
            continuation=continuation,
            failure_mode=failure_mode,
        )
        budget = BudgetPolicy() if budget is _UNSET else budget
        _check_policy("budget", budget, BudgetPolicy)
        if admission is not None and not isinstance(admission, Admission):
            raise GuardConfigError(f"admission must be an Admission(...) or None, got {admission!r}")
        _check_on_record(on_record)
        tiers = policies.tiers
        bulkheads = per_tier("bulkheads", bulkheads, tiers, Bulkhead, "a Bulkhead(max_in_flight=..., max_waiting=...)")
        tier_budgets = per_tier("tier_budgets", tier_budgets, tiers, BudgetPolicy, "a BudgetPolicy")
        if pool_limits is not None and not isinstance(pool_limits, httpx.Limits):
            kind = f"{type(pool_limits).__module__}.{type(pool_limits).__qualname__}"
            raise GuardConfigError(  # httpx2.Limits reads the same, yet is not httpx's (openai 3.x hands out httpx2)
                f"pool_limits must be an httpx.Limits(...) (the guard's pools are httpx's, whichever client it "
                f"hands out), got {kind}: {pool_limits!r}"
            )
        if pool_limits is not None and pool_limits.max_connections is not None and pool_limits.max_connections < 1:
            raise GuardConfigError(  # every call would wait for a connection until its ttft ran out
                f"pool_limits.max_connections must be at least 1 (or None: no limit), got {pool_limits.max_connections}"
            )
        if pool_limits is not None and transport_factory is not None:
            raise GuardConfigError("pass pool_limits or transport_factory, not both (the factory builds its own pools)")
        if transport_factory is None:
            transport_factory = functools.partial(default_transport, limits=pool_limits or DEFAULT_POOL_LIMITS)
        else:
            transport_factory = _checked_factory(transport_factory)
        clock = loop_clock if clock is _UNSET else _checked_clock(clock)
        self._chaos = chaos_switch(chaos, resolved)  # None unless LLMGUARD_CHAOS=1: then nothing is wrapped
        if self._chaos is not None:
            transport_factory = self._chaos.wrapping(transport_factory)
        cohorts = Rollout(
            rollout, key=rollout_key, poll_interval=rollout_poll_interval, disabled=disabled_by_env(), clock=clock
        )
        if instrumentation is _UNSET:
            instrumentation = default_instrumentation()
        instrumentation = NO_INSTRUMENTATION if instrumentation is None else contained(instrumentation)

        self.replicas: tuple[Replica, ...] = tuple(resolved)
        self.tiers: Mapping[str, Tier] = tiers
        self.default_tier = policies.default_tier
        self.hedge_policy = policies.hedge
        self.retry_policy = policies.retry

        def make_budget(policy: BudgetPolicy) -> RetryBudget:
            return RetryBudget(policy.ratio, policy.floor, policy.window, clock=clock)

        self.budget = make_budget(budget) if budget is not None else None
        """The shared budget of retries and hedges (None: unbounded); ``budget.snapshot()`` reads it."""
        self.tier_budgets: Mapping[str, RetryBudget] = {name: make_budget(p) for name, p in tier_budgets.items()}
        self._tier_var: ContextVar[str | None] = ContextVar(f"llmguard_tier_{id(self)}", default=None)
        panic = (policies.retry or RetryPolicy()).panic_threshold
        self._replica_set = ReplicaSet(
            resolved, transport_factory, affinity=resolve_affinity(affinity), panic_threshold=panic
        )
        self._fleet = make_fleet(
            fleet, name, self._replica_set, cohorts, poll_interval=rollout_poll_interval, clock=clock
        )
        share_budgets(self._fleet, {"guard": (budget, self.budget)}, tier_budgets, self.tier_budgets)
        self._bulkheads = {name: TierBulkhead(b) for name, b in bulkheads.items()}
        self._registry = LeaseRegistry()
        self._pools_closed = False
        self._clock = clock
        router = self._replica_set.router
        self.ttft_stats = TTFTStats(hedge or HedgePolicy(), router.degraded, lambda: router.epoch)
        """TTFT per replica, tier and stream kind: the hedge delay and the retry layer's expected TTFT."""
        if self.budget is not None:
            instrumentation.register_budget(self.budget.published_level)  # weakly held: no ref to the guard
        self._rollout = cohorts
        self._on_record = on_record
        ops = self._fleet.store if self._fleet is not None else None if isinstance(fleet, str) else fleet
        self.rate_limiter = build_rate_limiter(rate_limit, resolved, clock, ops)
        """The provider rate limits' buckets (None: no `RateLimit` configured)."""
        urgent_ttft = min(tier.ttft for tier in policies.tiers.values())
        self._admission = AdmissionLayer(admission, clock, self._replica_set, urgent_ttft)
        self._passthrough_pool = PassthroughPool(self._replica_set.states)
        """Control calls' transports: a replica's own pool for its origin, one shared pool otherwise."""
        state = SharedState(
            replicas=self._replica_set,
            ttft_stats=self.ttft_stats,
            budgets={name: self.tier_budgets.get(name, self.budget) for name in tiers},
            bulkheads=self._bulkheads,
            rollout=cohorts,
            rate_limiter=self.rate_limiter,
            registry=self._registry,
            passthrough_pool=self._passthrough_pool,
            instrumentation=instrumentation,
            clock=clock,
            admission=self._admission if admission is not None else None,
        )
        contained_on_record = None if on_record is None else ContainedCallback(on_record)
        self._transport = build_transport(policies, state, tier_var=self._tier_var, on_record=contained_on_record)
        log_rollout_state(cohorts, len(resolved))  # once the Guard is built: a refused one never says it is on

    @property
    def transport(self) -> GuardTransport:
        """The `httpx.AsyncBaseTransport`, for building your own client."""
        return self._transport

    def http_client(self, **kwargs: Any) -> httpx.AsyncClient:
        """An `httpx.AsyncClient` whose transport is the guard.

        It follows redirects and times out as the openai and anthropic SDKs' own clients do (5 s to
        connect, 600 s per read); under a Guard the read timeout bounds each read and caps the tier's stall (pass
        ``timeout=`` to change it). Closing the client ends its calls in flight, as closing a plain client
        does (a call waiting for its answer, or a body not read to its end, raises `httpx.ReadError`), and leaves
        the guard open (``await guard.aclose()`` closes the pools).
        """
        self._refuse_if_closed()
        return httpx_client(self._transport, **kwargs)

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

    @property
    def closed(self) -> bool:
        return self._registry.closed

    def _refuse_if_closed(self) -> None:
        if self._registry.closed:
            raise GuardClosed("this Guard is closed: it hands out no new clients; build a new Guard")

    async def aclose(self, grace: float = 0.0) -> None:
        """Shut the guard down; when it returns, every connection it opened is closed.

        At once, no new call or attempt starts (they fail with `GuardClosed`), and a server-hints poller
        (``server_hints.poll_vllm_metrics``) returns, its polls in flight cancelled. Calls in flight
        get ``grace`` seconds to finish (default 0); then each is aborted: a call still
        waiting for its first token ends with `GuardClosed` (raised, or a 503 response in
        response mode), a stream being read raises `GuardClosed` from its next read. Then the
        connection pools are closed. Idempotent. Cancelled during the grace (``asyncio.wait_for``,
        ``anyio.move_on_after``), it ends the grace there, aborts and closes as above, then raises the cancellation.
        """
        _check_grace(grace)
        if self._closed_in_fork():
            return
        if await stop_sync_runner(self, grace):  # sync calls ran on the Guard's own loop: closed there
            return
        registry = self._registry
        if registry.closed and not registry.live and self._pools_closed:
            return
        registry.closed = True
        registry.end_beside()  # e.g. a server-hints poller: it sends nothing more
        interrupted: BaseException | None = None
        try:
            await registry.wait_empty(grace)
        except anyio.get_cancelled_exc_class() as cancelled:  # a bound on the close ends the grace, not the close
            interrupted = cancelled
        with anyio.CancelScope(shield=True):
            leases = list(registry.live)
            for lease in leases:
                lease.abort()
            for lease in leases:
                await lease.aclose("error", "guard_closed")
            await registry.beside_ended(CLOSE_GRACE)
            if not self._pools_closed:
                self._pools_closed = True
                await self.transport.loops.retire()
                try:
                    if self._fleet is not None:
                        await self._fleet.aclose()
                    await self._replica_set.aclose()
                finally:
                    await self._passthrough_pool.aclose()
                    if isinstance(self._on_record, RecordLogger):
                        self._on_record.close()  # its file, if it writes one
        if interrupted is not None:
            raise interrupted

    def _closed_in_fork(self) -> bool:
        """In a child process forked while an event loop owned this Guard: mark it closed, closing nothing (that
        loop and the connections are the parent's, still in use there), and True; else False."""
        if not self.transport.loops.forked:
            return False
        self._registry.closed = True
        return True

    def snapshot(self) -> GuardSnapshot:
        """A read-only view of the guard's state now: per replica in-flight attempts, cool-down,
        circuit, pool connections; per tier bulkhead use; budget levels and pending tickets; the fleet store."""
        registry, replicas, budget = self._registry, self._replica_set, self.budget
        fleet = self._fleet.snapshot() if self._fleet is not None else None
        parts = (self.tiers, self._bulkheads, budget, self.tier_budgets, fleet)
        now = self._clock()
        return build_snapshot(now, registry, replicas, *parts, admission=self._admission.snapshot(now))

    def __repr__(self) -> str:
        names = ", ".join(s.name for s in self._replica_set.states)
        state = "closed" if self._registry.closed else "open"
        return f"<Guard {state} replicas=[{names}] tiers={sorted(self.tiers)} default_tier={self.default_tier!r}>"

    async def __aenter__(self) -> Guard:
        if self._fleet is not None:
            self._fleet.store.start()  # connect now rather than on the first call
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # --- other HTTP clients and sync code (llmguard_client.edges), the record of SDK calls ----

    def httpx2_client(self, **kwargs: Any) -> httpx2.AsyncClient:
        """An `httpx2.AsyncClient` through the guard: for openai >= 3 and anthropic >= 1 (needs httpx2).

        Same defaults as `http_client`; closing it ends its calls in flight and leaves the guard open.
        """
        _require_httpx2("httpx2_client")
        from llmguard_client.edges.httpx2_async import httpx2_client

        self._refuse_if_closed()
        return httpx2_client(self, **kwargs)

    def sync_http_client(self, **kwargs: Any) -> httpx.Client:
        """An `httpx.Client` through the guard, for sync code (``openai.OpenAI`` 1.x/2.x).

        Calls run on one background event-loop thread per Guard, started on first use;
        ``guard.close()`` stops it. Same timeout default as `http_client`.
        """
        from llmguard_client.edges.httpx_sync import sync_http_client

        self._refuse_if_closed()
        return sync_http_client(self, **kwargs)

    def sync_httpx2_client(self, **kwargs: Any) -> httpx2.Client:
        """An `httpx2.Client` through the guard, for sync code (``openai.OpenAI`` >= 3, ``anthropic.Anthropic``)."""
        _require_httpx2("sync_httpx2_client")
        from llmguard_client.edges.httpx2_sync import sync_httpx2_client

        self._refuse_if_closed()
        return sync_httpx2_client(self, **kwargs)

    # One overload per client type: a class whose http_client takes anything (its own **kwargs) is known only at
    # run time (Any); the generic last one keeps any other SDK class typed as before.
    @overload
    def http_client_for(self, sdk: TakesHttpClient[TakesAnything], **kwargs: Any) -> Any: ...
    @overload
    def http_client_for(self, sdk: TakesHttpClient[httpx.AsyncClient], **kwargs: Any) -> httpx.AsyncClient: ...
    @overload
    def http_client_for(self, sdk: TakesHttpClient[httpx.Client], **kwargs: Any) -> httpx.Client: ...
    @overload
    def http_client_for(self, sdk: TakesHttpClient[httpx2.AsyncClient], **kwargs: Any) -> httpx2.AsyncClient: ...
    @overload
    def http_client_for(self, sdk: TakesHttpClient[httpx2.Client], **kwargs: Any) -> httpx2.Client: ...
    @overload
    def http_client_for(self, sdk: TakesHttpClient[_H | None], **kwargs: Any) -> _H: ...
    def http_client_for(self, sdk: Callable[..., object], **kwargs: Any) -> Any:
        """The guarded client of the kind ``sdk``'s ``http_client=`` takes, typed to match, e.g.
        ``openai.AsyncOpenAI(..., http_client=guard.http_client_for(openai.AsyncOpenAI))``."""
        from llmguard_client.edges.sdk import http_client_for

        return http_client_for(self, sdk, **kwargs)

    def capture(self) -> contextlib.AbstractContextManager[Capture]:
        """``with guard.capture() as calls:`` collects the `PhaseRecord` of each call made and ended
        inside (see `llmguard_client.capture`)."""
        return capture()

    def close(self, grace: float = 0.0) -> None:
        """``await guard.aclose(grace)`` for sync code; also stops the sync edges' event-loop thread."""
        from llmguard_client.edges._registry import close_guard

        _check_grace(grace)
        if not self._closed_in_fork():
            close_guard(self, grace)

    def __enter__(self) -> Guard:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- rollout ------------------------------------------------------------------------------

    @property
    def rollout(self) -> float:
        """The fraction of calls guarded now (0.0 while ``LLMGUARD_DISABLED`` is set)."""
        return self._rollout.fraction

    def set_rollout(self, fraction: float | FractionSource) -> None:
        """Change the guarded fraction live, from any thread or task: a number from 0.0 (off: every call
        passed through) to 1.0, or a callable polled at most every ``rollout_poll_interval`` s. While
        ``LLMGUARD_DISABLED`` holds the guard off (read when it was built), the fraction is kept, not used, and a
        warning says so."""
        self._rollout.set(fraction)
        if self._rollout.disabled:
            logger.warning(
                "set_rollout(%r) takes no effect: LLMGUARD_DISABLED was set when this Guard was built, and keeps "
                "every call unguarded for its life; restart the process without it to guard calls",
                fraction,
            )

    # --- fault injection ------------------------------------------------------------------------

    @property
    def chaos(self) -> Chaos | None:
        """The `Chaos` policy injecting faults now (None: none)."""
        return None if self._chaos is None else self._chaos.policy

    def set_chaos(self, chaos: Chaos | None) -> None:
        """Inject ``chaos``'s faults from the next attempt on, or stop (None), from any thread or task. A policy is
        refused (`GuardConfigError`) unless ``LLMGUARD_CHAOS=1`` was set when the Guard was built (whether it
        still is does not matter)."""
        if self._chaos is None:
            if chaos is not None:
                refuse_unless_enabled()  # names the variable when it is unset now
                raise GuardConfigError("LLMGUARD_CHAOS=1 was not set when this Guard was built: build it again")
            return
        self._chaos.set(chaos)

    def session(self, key: str) -> contextlib.AbstractContextManager[None]:
        """Calls made inside carry the affinity ``key`` (e.g. a conversation id), as ``x-llmguard-session`` does."""
        return session_for(self._replica_set.affinity, key)

    def rollout_key(self, key: str | int) -> contextlib.AbstractContextManager[None]:
        """Calls made inside keep one cohort per ``key`` (e.g. a user id), as ``x-llmguard-key`` does.

        >>> with guard.rollout_key(user.id):
        ...     await oai.chat.completions.create(...)
        """
        return self._rollout.keyed(key)
