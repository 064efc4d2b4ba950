"""Helpers the fleet tests share: wait for a condition, enter Guards and wait for their stores to connect."""

from __future__ import annotations

from collections.abc import Callable

import anyio

from llmguard_client import Guard
from llmguard_client._fleet import FleetStore
from llmguard_client._routing.replicas import ReplicaState


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Wait for ``condition`` (a generous bound: behaviour, not speed, is what is asserted)."""
    with anyio.fail_after(seconds):
        while not condition():  # noqa: ASYNC110 (polled state has no event)
            await anyio.sleep(0.005)


def store(g: Guard) -> FleetStore:
    """The Guard's fleet store."""
    assert g._fleet is not None
    return g._fleet.store


def states(g: Guard) -> list[ReplicaState]:
    """The Guard's replica states, in its replicas' order."""
    return g._replica_set.states


async def connected(*guards: Guard) -> None:
    """Enter each Guard and wait until every one's fleet store is connected."""
    for g in guards:
        await g.__aenter__()
    await until(lambda: all(store(g).available for g in guards))
