"""What a Guard shares with the other processes of its fleet through Redis (``Guard(fleet=..., name=...)``).

`FleetStore` is the connection (bounded, failing open); `FleetMirror` shares cool-downs and open circuits;
`FleetFlag` the rollout fraction and kill switch; `FleetHints` the servers' load reports, polled by one
process; `FleetBudgetSync` the retry budgets of ``BudgetPolicy(scope="fleet")``. `Fleet` puts them together for a Guard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from llmguard_client._budget.budget import RetryBudget
from llmguard_client._budget.fleet_sync import FleetBudgetSync
from llmguard_client._fleet.flag import FleetFlag, FleetRollout
from llmguard_client._fleet.hints import FleetHints
from llmguard_client._fleet.mirror import FleetMirror
from llmguard_client._fleet.store import FleetSnapshot, FleetStore
from llmguard_client._fleet.url import FleetURL, check_name, parse_fleet_url
from llmguard_client._routing.replicas import ReplicaSet
from llmguard_client.config import BudgetPolicy
from llmguard_client.errors import GuardConfigError

__all__ = [
    "Fleet",
    "FleetSnapshot",
    "FleetStore",
    "FleetURL",
    "check_name",
    "make_fleet",
    "parse_fleet_url",
    "share_budgets",
]


class Fleet:
    """A Guard's fleet: its store, the mirror of its replica states, its rollout flag, its servers' hints."""

    def __init__(
        self,
        store: FleetStore,
        replicas: ReplicaSet,
        rollout: FleetRollout,
        *,
        poll_interval: float,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.clock = clock
        self.mirror = FleetMirror(store, replicas.states, clock, replicas.cooling_changed.notify)
        replicas.shared = self.mirror
        self.hints = FleetHints(store, replicas, clock)
        self.flag = FleetFlag(store, rollout, poll_interval)
        rollout.settle = store.settling
        self.budgets: FleetBudgetSync | None = None

    def share_budget(self, budget: RetryBudget, label: str) -> None:
        """Count ``budget`` fleet-wide (``BudgetPolicy(scope="fleet")``); ``label`` tells the Guard's from a tier's."""
        if self.budgets is None:
            self.budgets = FleetBudgetSync(self.store, clock=self.clock)
        self.budgets.add(budget, label)

    def snapshot(self) -> FleetSnapshot:
        return dataclasses.replace(self.store.snapshot(), hints=self.hints.role)

    async def aclose(self) -> None:
        await self.store.aclose()


def make_fleet(
    url: object,
    name: str | None,
    replicas: ReplicaSet,
    rollout: FleetRollout,
    *,
    poll_interval: float,
    clock: Callable[[], float],
) -> Fleet | None:
    """``Guard(fleet=url, name=name)`` checked and built: None without ``url`` (everything stays in process) or
    for a store object that is not a `FleetStore` (it serves the rate limit alone)."""
    if name is not None:
        check_name(name)
    if isinstance(url, FleetStore):
        return Fleet(url, replicas, rollout, poll_interval=poll_interval, clock=clock)
    if url is None:
        return None
    if not isinstance(url, str):
        _check_store_object(url)
        return None
    address = parse_fleet_url(url)
    if name is None:
        raise GuardConfigError(
            "fleet needs a name: Guard(fleet=..., name='checkout'); it namespaces the keys, so that two "
            "services sharing one Redis never share cool-downs or a rollout flag"
        )
    return Fleet(FleetStore(address, name), replicas, rollout, poll_interval=poll_interval, clock=clock)


def _check_store_object(store: object) -> None:
    """A ``fleet=`` that is neither a URL nor a `FleetStore` must offer what the rate limiter calls on it."""
    missing = [n for n in ("key", "run") if not callable(getattr(store, n, None))]
    missing += [] if hasattr(store, "available") else ["available"]
    if missing:
        raise GuardConfigError(
            f"fleet must be a Redis/Valkey URL (e.g. 'redis://host:6379/0', also for a Redis client you hold: "
            f"pass its URL) or a store object offering key/available/run; got {type(store).__name__}, "
            f"which lacks {'/'.join(missing)}"
        )


def share_budgets(
    fleet: Fleet | None,
    guard: Mapping[str, tuple[BudgetPolicy | None, RetryBudget | None]],
    tier_policies: Mapping[str, BudgetPolicy],
    tier_budgets: Mapping[str, RetryBudget],
) -> None:
    """Hand the budgets whose policy says ``scope="fleet"`` to the fleet; a `GuardConfigError` without one."""
    labelled = {**guard, **{f"tier.{t}": (tier_policies[t], b) for t, b in tier_budgets.items()}}
    for label, (policy, budget) in labelled.items():
        if policy is None or budget is None or policy.scope != "fleet":
            continue
        if fleet is None:
            raise GuardConfigError(
                "BudgetPolicy(scope='fleet') shares the retry budget through the fleet store: it needs "
                "Guard(fleet='redis://...', name='checkout'); use scope='process' (the default) without one"
            )
        fleet.share_budget(budget, label)
