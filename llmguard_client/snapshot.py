"""A read-only view of a Guard's state, for health endpoints, dashboards and leak checks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

# Imported at run time, not under TYPE_CHECKING, so that typing.get_type_hints(GuardSnapshot) resolves (FastAPI,
# pydantic); the package has imported them all already.
from llmguard_client._admission.view import AdmissionSnapshot as AdmissionSnapshot
from llmguard_client._budget.budget import BudgetSnapshot as BudgetSnapshot
from llmguard_client._budget.budget import FleetBudgetSnapshot as FleetBudgetSnapshot
from llmguard_client._budget.budget import RetryBudget
from llmguard_client._core.lease import LeaseRegistry
from llmguard_client._fleet.store import FleetSnapshot as FleetSnapshot
from llmguard_client._layers.bulkhead import TierBulkhead
from llmguard_client._routing.health import server_waiting
from llmguard_client._routing.replicas import ReplicaSet, ReplicaState
from llmguard_client.config import Tier


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    name: str
    """The replica's URL without credentials."""
    in_flight: int
    """Attempts on this replica not yet finished (a winner counts until its body is done)."""
    cooling_for: float
    """Seconds left of a Retry-After cool-down (0: none)."""
    circuit_open_for: float
    """Seconds left before an open circuit lets a probe through (0: closed)."""
    healthy: bool
    """Neither cooling nor open (``drained`` is told apart)."""
    open_connections: int | None
    """Connections in its pool (None: a custom transport the guard cannot inspect)."""
    server_waiting: float | None = None
    """Requests its server reported queued, from every client (``poll_vllm_metrics`` or ``vllm_metrics_polled``,
    or vLLM's load header on a non-streamed answer with `Admission`), while the report is believed (None: no
    report, or a stale one)."""
    drained: bool = False
    """Drained as degraded by the router (slow, failing, or rejecting with 401/403/404 what the others serve): it
    takes only probes until they show it recovered."""


@dataclass(frozen=True, slots=True)
class TierSnapshot:
    in_flight: int
    """Calls holding a bulkhead slot (0 for a tier without a bulkhead)."""
    waiting: int
    """Calls waiting for a slot."""
    max_in_flight: int | None
    max_waiting: int | None


@dataclass(frozen=True, slots=True)
class GuardSnapshot:
    """Point-in-time view of a `Guard` (``guard.snapshot()``)."""

    closed: bool
    calls_in_flight: int
    """Calls started and not yet ended (a stream ends when its body is done or closed)."""
    replicas: tuple[ReplicaSnapshot, ...]
    tiers: Mapping[str, TierSnapshot]
    budget: BudgetSnapshot | None
    """The shared retry budget (None: unbounded)."""
    tier_budgets: Mapping[str, BudgetSnapshot]
    fleet: FleetSnapshot | None = None
    """The fleet store: connected or degraded, the last error, the lag (None: no ``Guard(fleet=...)``)."""
    admission: Mapping[str, AdmissionSnapshot] = field(default_factory=dict)
    """Per replica name, adaptive admission (empty without ``Guard(admission=...)``)."""
    panic: bool = False
    """Panic mode: fewer than `RetryPolicy.panic_threshold` of the replicas are healthy (circuit closed, not
    degraded), so replicas with an open circuit take calls too, ranked last."""

    @property
    def idle(self) -> bool:
        """Nothing held: no call, attempt, bulkhead slot, admission slot or pending budget ticket."""
        budgets = [b for b in (self.budget, *self.tier_budgets.values()) if b is not None]
        return (
            self.calls_in_flight == 0
            and all(r.in_flight == 0 for r in self.replicas)
            and all(t.in_flight == 0 and t.waiting == 0 for t in self.tiers.values())
            and all(b.pending == 0 for b in budgets)
            and all(a.in_flight == 0 and a.waiting == 0 for a in self.admission.values())
        )


def open_connections(transport: httpx.AsyncBaseTransport) -> int | None:
    """Connections held by an `httpx.AsyncHTTPTransport`'s pool; None for other transports."""
    pool = getattr(transport, "_pool", None)
    connections = getattr(pool, "connections", None)
    if not isinstance(connections, list):
        return None
    return sum(1 for c in connections if not c.is_closed())


def _replica_view(s: ReplicaState, now: float) -> ReplicaSnapshot:
    """One replica at ``now``, read without changing it (a snapshot may be taken from any thread, on a clock other
    than the loop's): instants a clock that went back left ahead are read as `ReplicaState.settle` would move them."""
    by = s.behind(now)
    cooling_for = max(0.0, s.cooling_until + by - now)
    circuit_open_for = max(0.0, s.open_until + by - now)
    return ReplicaSnapshot(
        name=s.name,
        in_flight=s.in_flight,
        cooling_for=cooling_for,
        circuit_open_for=circuit_open_for,
        healthy=cooling_for == 0.0 and circuit_open_for == 0.0,
        open_connections=open_connections(s.transport),
        server_waiting=server_waiting(s.health, now - by),
        drained=s.health.drained,
    )


def build_snapshot(
    now: float,
    registry: LeaseRegistry,
    replica_set: ReplicaSet,
    tiers: Mapping[str, Tier],
    bulkheads: Mapping[str, TierBulkhead],
    budget: RetryBudget | None,
    tier_budgets: Mapping[str, RetryBudget],
    fleet: FleetSnapshot | None = None,
    admission: Mapping[str, AdmissionSnapshot] | None = None,
) -> GuardSnapshot:
    """The `GuardSnapshot` of a Guard's parts at ``now``."""
    replicas = tuple(_replica_view(s, now) for s in replica_set.states)
    tier_views = {}
    for name in tiers:
        bulkhead = bulkheads.get(name)
        if bulkhead is None:
            tier_views[name] = TierSnapshot(0, 0, None, None)
        else:
            limits = bulkhead.config
            tier_views[name] = TierSnapshot(
                bulkhead.in_flight, bulkhead.waiting, limits.max_in_flight, limits.max_waiting
            )
    return GuardSnapshot(
        closed=registry.closed,
        calls_in_flight=len(registry.live),
        replicas=replicas,
        tiers=tier_views,
        budget=budget.snapshot() if budget is not None else None,
        tier_budgets={name: b.snapshot() for name, b in tier_budgets.items()},
        fleet=fleet,
        admission=dict(admission or {}),
        panic=replica_set.panic(now),
    )
