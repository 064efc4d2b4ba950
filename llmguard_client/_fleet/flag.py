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

A flag last read longer ago than the poll interval (a step more: `STEP`) was not read when it was due: the event
loop was not running (one kept for the process, stopped between invocations; a frozen process). The first call
after such a lapse asks for a read and waits for it (`FleetFlag.settling`), as a new process's first calls wait
for the store's first connection: at most the store's ``op_timeout``, once per lapse.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, cast

import anyio

from llmguard_client._fleet.deadline import STEP
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
    store's first connection under way or a read of a flag gone stale (`FleetFlag.settling`), is awaited."""


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
        self.poll_interval = max(poll_interval, 0.05)
        self._loop: asyncio.AbstractEventLoop | None = None
        """The event loop the store reads the flag on: only its calls ask for a read (`settling`)."""
        self._asked_at = self._read_at = -math.inf
        """When (on that loop's clock) the last read started, and when the last one ended."""
        self._refresh: asyncio.Event | None = None
        """Set by the first read asked at `_refresh_asked` or later (a stale flag's: `settling`)."""
        self._refresh_asked = -math.inf
        self._waited_out = False
        """A wait for `_refresh` ran out: the next calls do not wait for it again."""
        self._refused = False
        """The store refused the last write-back (and that was said once)."""
        self._warned_at: float | None = None
        self._losses = 0
        """Losses since the last warning (a store evicting the flag again and again is told once a `LOSS_WARNING`)."""
        store.every(self.poll_interval, self.read)  # also run once right after each (re)connection
        store.subscribe(store.key("rollout"), lambda _: store.submit(self.read))

    def settling(self) -> Awaitable[bool] | None:
        """What each call waits for before its cohort is decided (`FleetRollout.settle`): the store's first
        connection while it is under way (`FleetStore.settling`); else, connected, when the flag was not read when
        it was due (see the module docstring), a read asked now, at most the store's ``op_timeout``. None, at once,
        otherwise, and once a wait for that read has run out."""
        connecting = self.store.settling()
        if connecting is not None or not self.store.available:
            return connecting
        if self._refresh is None:
            loop = asyncio.get_running_loop()
            now = loop.time()
            if loop is not self._loop or now - max(self._asked_at, self._read_at) <= self.poll_interval + STEP:
                return None
            self._refresh, self._refresh_asked, self._waited_out = asyncio.Event(), now, False
            self.store.submit(self.read)
        return None if self._waited_out else self._fresh(self._refresh)

    async def _fresh(self, refresh: asyncio.Event) -> bool:
        with anyio.move_on_after(self.store.op_timeout) as waited:
            await refresh.wait()
        if waited.cancelled_caught and refresh is self._refresh:
            self._waited_out = True  # until it is read: the next calls do not wait for it again
        return refresh.is_set()

    async def read(self, client: Redis) -> None:
        """Read both keys; write back a known value the store lost, then take the values in force."""
        loop = self._loop = asyncio.get_running_loop()
        asked = self._asked_at = loop.time()
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
        self._read_at = loop.time()
        if self._refresh is not None and asked >= self._refresh_asked:
            self._refresh.set()
            self._refresh = None
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
