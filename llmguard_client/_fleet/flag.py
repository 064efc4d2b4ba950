"""The rollout flag, fleet-wide: the guarded fraction and the kill switch kept in the fleet store.

``llmguard rollout set 0.10 --fleet URL --name checkout`` writes ``llmguard:checkout:rollout:fraction``;
``... kill`` writes ``llmguard:checkout:rollout:kill``; each process reads both every poll interval (and
at once when the command announces a change on ``llmguard:checkout:rollout``) and hands the result to its
`llmguard_client._rollout.rollout.Rollout` as an override. The kill switch wins over the fraction; with
neither set a process uses its own ``Guard(rollout=...)``. While the store is unreachable the last value
read stays in force. The command never deletes a key (``set`` and ``clear`` write the kill switch ``0`` and
``clear`` the fraction `UNSET`), so a key that is missing was lost by the store: a restart without
persistence, ``FLUSHALL``, an eviction, a failover to an empty primary. The read that finds it missing keeps
the value last read in force and writes it back (``SET NX``, so that a concurrent ``set`` wins), with one
warning (at most one in `LOSS_WARNING`, counting the losses since the last: a store that evicts it again and
again is told, not repeated): the kill switch is lifted only by ``set`` or ``clear``. A process that never read a
value has nothing to write back. So that a process cut off while the command ran cannot undo it on
reconnecting, what the command wrote is read, never overwritten. Every process computes a key's cohort with the
same hash, so widening the fraction only moves keys into the guarded cohort, on every process.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, cast

import anyio

from llmguard_client._fleet.store import FleetStore

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["UNSET", "FleetFlag", "FleetRollout", "parse_flag"]

UNSET = "unset"
"""The stored fraction after ``clear``: no fleet-wide fraction (each process uses its own ``rollout=``)."""

logger = logging.getLogger("llmguard_client")

LOSS_WARNING = 600.0
"""Seconds between two warnings of a process about losses of the flag (the others are logged at INFO)."""


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
        self.known: tuple[object, object] = (None, None)
        """The two values last read (raw; None: never read), written back where the store lost them."""
        self.reads = 0
        """Reads completed (each poll, each announcement, each resync)."""
        self._refused = False
        """The store refused the last write-back (and that was said once)."""
        self._warned_at: float | None = None
        self._losses = 0
        """Losses since the last warning (a store evicting the flag again and again is told once a `LOSS_WARNING`)."""
        store.every(max(poll_interval, 0.05), self.read)  # also run once right after each (re)connection
        store.subscribe(store.key("rollout"), lambda _: store.submit(self.read))

    async def read(self, client: Redis) -> None:
        """Read both keys; write back a known value the store lost, then take the values in force."""
        values = await self._get(client)
        lost = [i for i, v in enumerate(values) if v is None and isinstance(self.known[i], (bytes, str))]
        if lost:
            refused = await self._write_back(client, lost)
            values = await self._get(client)  # ours, or what a concurrent `set` wrote first
            if self._refused and refused is None:
                logger.info("llmguard rollout: wrote the lost rollout flag back (fleet %r)", self.store.name)
            elif not self._refused:  # once per loss (a store refusing the write-back finds it lost at each read)
                self._told_lost(lost, values, refused)
            self._refused = refused is not None
        self.known = (
            self.known[0] if values[0] is None else values[0],
            self.known[1] if values[1] is None else values[1],
        )
        self.reads += 1
        value = parse_flag(*self.known)
        if value != self.rollout.override:
            logger.info(
                "llmguard rollout: %s (fleet %r)",
                "the guard's own fraction" if value is None else f"{value:g} of calls guarded",
                self.store.name,
            )
            self.rollout.override = value

    def _told_lost(self, lost: list[int], values: tuple[object, object], refused: str | None) -> None:
        """A warning for the first loss, then at most one a `LOSS_WARNING` (the losses between counted in it), the
        others logged at INFO: a store that evicts the flag again and again (``allkeys-lru`` under memory pressure)
        would otherwise warn in every process at each eviction."""
        self._losses += 1
        now = anyio.current_time()
        warn = self._warned_at is None or now - self._warned_at >= LOSS_WARNING
        kept = _describe(*(self.known[i] if values[i] is None else values[i] for i in range(2)))
        again = f"; lost {self._losses} times since the last warning" if warn and self._losses > 1 else ""
        logger.log(
            logging.WARNING if warn else logging.INFO,
            "llmguard rollout: the fleet store %s (name %r) lost the rollout flag (the %s); %s%s",
            self.store.url.redacted,
            self.store.name,
            " and the ".join(("fraction", "kill switch")[i] for i in lost),
            f"restored the last known value ({kept})"
            if refused is None
            else f"keeping the last known value ({kept}) in force, but could not write it back: {refused}",
            again,
        )
        if warn:
            self._warned_at, self._losses = now, 0

    async def _get(self, client: Redis) -> tuple[object, object]:
        if self.store.url.cluster:  # the two keys may live on two nodes
            return await client.get(self.keys[0]), await client.get(self.keys[1])
        fraction, kill = await client.mget(*self.keys)
        return fraction, kill

    async def _write_back(self, client: Redis, lost: list[int]) -> str | None:
        """``SET NX`` each lost key's known value; the process that wrote it announces it, so that a process that
        never read it follows at once. The store's refusal (a read-only replica, an ACL) is returned, not raised:
        the known values stay in force and the next read tries again."""
        from redis.exceptions import ResponseError

        try:
            wrote = [await client.set(self.keys[i], cast("bytes | str", self.known[i]), nx=True) for i in lost]
            if any(wrote):
                await client.publish(self.store.channel("rollout"), "restore")
        except ResponseError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None


def _describe(fraction: object, kill: object) -> str:
    value = parse_flag(fraction, kill)
    return "no fleet-wide rollout" if value is None else f"{value:g} of calls guarded"
