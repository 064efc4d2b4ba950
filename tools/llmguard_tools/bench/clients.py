"""The clients the bench compares, by name, each sending one streaming chat completion per planned request.

* ``plain``, ``openai-default``, ``naive-retry``: the baselines (`llmguard_tools.bench.baselines`);
* ``guarded``, ``guarded-nohedge``, ``guarded-noretry``, ``guarded-continuation``, ``guarded-affinity``,
  ``guarded-noaffinity``, ``guarded-admission``, ``guarded-hints``: this library
  (`llmguard_tools.bench.guarded`).

Every client is measured the same way, client-side (`llmguard_tools.bench.measure`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmguard_tools.bench.baselines import NaiveRetryClient, OpenAIDefaultClient, PlainClient
from llmguard_tools.bench.client_base import BenchClient
from llmguard_tools.bench.guarded import (
    GuardedAdmissionClient,
    GuardedAffinityClient,
    GuardedClient,
    GuardedContinuationClient,
    GuardedHintsClient,
    GuardedNoAffinityClient,
    GuardedNoHedgeClient,
    GuardedNoRetryClient,
    guard_api,
)
from llmguard_tools.bench.measure import Sample, TierSpec
from llmguard_tools.bench.rollout import RolloutClient

__all__ = [
    "CLIENT_NAMES",
    "BenchClient",
    "ClientFactory",
    "Sample",
    "TierSpec",
    "guard_api",
    "make_client",
    "parse_clients",
]

CLIENT_NAMES = (
    "plain",
    "openai-default",
    "naive-retry",
    "guarded",
    "guarded-nohedge",
    "guarded-noretry",
    "guarded-continuation",
    "guarded-affinity",
    "guarded-noaffinity",
    "guarded-admission",
    "guarded-hints",
    "rollout",
)

_CLIENTS: dict[str, type[BenchClient]] = {
    c.name: c
    for c in (
        PlainClient,
        OpenAIDefaultClient,
        NaiveRetryClient,
        GuardedClient,
        GuardedNoHedgeClient,
        GuardedNoRetryClient,
        GuardedContinuationClient,
        GuardedAffinityClient,
        GuardedNoAffinityClient,
        GuardedAdmissionClient,
        GuardedHintsClient,
    )
}


def parse_clients(spec: str) -> list[str]:
    """Validate a comma-separated client list (order kept, duplicates dropped)."""
    names: list[str] = []
    for raw in spec.split(","):
        name = raw.strip()
        if not name:
            continue
        if name not in CLIENT_NAMES:
            raise ValueError(f"unknown client {name!r}; choose from {', '.join(CLIENT_NAMES)}")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError("--clients is empty")
    return names


def make_client(
    name: str,
    urls: Sequence[str],
    *,
    model: str,
    tier: TierSpec,
    deadline: float | None = None,
    api_key: str | None = None,
    rollout: float | None = None,
    records: str | None = None,
) -> BenchClient:
    if name == "rollout":  # bench/rollout.py: a Guard at a partial rollout, records for `llmguard compare`
        return RolloutClient(
            urls, model=model, tier=tier, deadline=deadline, api_key=api_key, fraction=rollout, records=records
        )
    if name not in _CLIENTS:
        raise ValueError(f"unknown client {name!r}; choose from {', '.join(CLIENT_NAMES)}")
    return _CLIENTS[name](urls, model=model, tier=tier, deadline=deadline, api_key=api_key)


ClientFactory = Callable[[str, Sequence[str]], BenchClient]
