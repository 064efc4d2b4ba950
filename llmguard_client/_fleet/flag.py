"""The rollout flag, fleet-wide: the guarded fraction and the kill switch kept in the fleet store.

``llmguard rollout set 0.10 --fleet URL --name checkout`` writes ``llmguard:checkout:rollout:fraction``;
``... kill`` writes ``llmguard:checkout:rollout:kill``; each process reads both every poll interval (and
at once when the command announces a change on ``llmguard:checkout:rollout``) and hands the result to its
`llmguard_client._rollout.rollout.Rollout` as an override. The kill switch wins over the fraction; with
neither set a process uses its own ``Guard(rollout=...)``. While the store is unreachable the last value
read stays in force, and a store that comes back empty (a restarted Redis) gets it written back (``SET NX``,
as the cool-downs are): a kill switch is not lifted by a restart, only by ``set`` or ``clear``. So that a
process cut off while the command ran cannot undo it on reconnecting, the command never deletes a key:
``set`` and ``clear`` write the kill switch ``0`` and ``clear`` the fraction `UNSET`. Every
process computes a key's cohort with the same hash, so widening the fraction only moves keys into the guarded
cohort, on every process.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from llmguard_client._fleet.store import FleetStore

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["UNSET", "FleetFlag", "FleetRollout", "parse_flag"]

UNSET = "unset"
"""The stored fraction after ``clear``: no fleet-wide fraction (each process uses its own ``rollout=``)."""

logger = logging.getLogger("llmguard_client")


def parse_flag(fraction: object, kill: object) -> float | None:
    """The fraction in force from the two stored values (None: neither set, or the fraction is not one)."""
    if _text(kill) in ("1", "true", "yes", "on"):
        return 0.0
    text = _text(fraction)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0.0 <= value <= 1.0 else None


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value.strip().lower() if isinstance(value, str) else None


class FleetRollout(Protocol):
    """What the fleet drives of a Guard's rollout (`llmguard_client._rollout.rollout.Rollout`)."""

    override: float | None
    """The fleet's fraction in force (None: the process's own)."""
    settle: Callable[[], Awaitable[bool] | None] | None
    """Called before each call's cohort is decided (the store connects on first use); what it gives, the
    store's first connection under way, is awaited."""


class FleetFlag:
    """Keeps a rollout's fleet override current (see the module docstring)."""

    def __init__(self, store: FleetStore, rollout: FleetRollout, poll_interval: float) -> None:
        self.store = store
        self.rollout = rollout
        self.keys = (store.key("rollout", "fraction"), store.key("rollout", "kill"))
        self._stored: tuple[object, object] = (None, None)
        """The two values last read (raw), written back after a reconnection to a store that lost them."""
        store.on_connect(self.restore)
        store.every(max(poll_interval, 0.05), self.read)
        store.subscribe(store.key("rollout"), lambda _: store.submit(self.read))

    async def restore(self, client: Redis) -> None:
        """Write back the values last read where the store has none (it restarted empty); the read that
        follows every resync then takes whichever values are in force."""
        for key, value in zip(self.keys, self._stored, strict=True):
            if isinstance(value, (bytes, str)):
                await client.set(key, value, nx=True)

    async def read(self, client: Redis) -> None:
        fraction, kill = (
            await client.mget(*self.keys) if not self.store.url.cluster else [await client.get(k) for k in self.keys]
        )
        self._stored = (fraction, kill)
        value = parse_flag(fraction, kill)
        if value != self.rollout.override:
            logger.info(
                "llmguard rollout: %s (fleet %r)",
                "the guard's own fraction" if value is None else f"{value:g} of calls guarded",
                self.store.name,
            )
            self.rollout.override = value
