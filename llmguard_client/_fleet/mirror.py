"""Cool-downs and open circuits, shared: what one process learns reaches the others within milliseconds.

Each is published twice when learned here: a key with the remaining time as its TTL
(``llmguard:{name}:cool:{replica}``, ``...:open:{replica}``), for processes that (re)connect later, and an
event on ``llmguard:{name}:events`` (``...@db{N}`` on database N) on which every process's listener reads that
key's time left into its own replica states (`FleetMirror._read_keys`). Calls read only those local states. A
probe that succeeds ends the cool-down and the circuit everywhere; a circuit that closes here (a success after
failures) ends only the circuit elsewhere: a Retry-After another process was given is that process's to probe.
What a fault injected by chaos mode taught a process (`ReplicaState.local_cool`, ``local_open``) is neither
published nor written, nor ended by an event. An event names the replica (its URL without credentials), what
happened and for how long, and for a 429's cool-down the limit it holds for, as a 64-bit hash of the key
(`llmguard_client._routing.caller`; the key's value is ``{origin} {hash}``); nothing about a user or a prompt is
stored.

A cool-down learned from another process is probed by that process; this one probes it only a step after that
process's next probe would be, should it send none (`llmguard_client._routing.cooldown.mirror_cool_down`). A
mirrored change of a cool-down (one renewed or ended elsewhere) wakes the calls waiting here for it, as a change
learned here does.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from llmguard_client._fleet.store import FleetStore
from llmguard_client._routing.caller import calling_as, scopes
from llmguard_client._routing.cooldown import mirror_cool_down
from llmguard_client._routing.replicas import ReplicaState

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["FleetMirror"]

Kind = Literal["cool", "open", "clear", "close"]
_SLACK = 0.01
"""A mirrored deadline within this many seconds of the local one is the same event (not an extension)."""


READ_AGAIN = 1.0
"""Seconds after which the next event hands a read of the keys the events named to the store again, when the read
handed before has not run (the store dropped it: its queue full, its connection lost, after which the resync reads
every key anyway)."""


class FleetMirror:
    """Publishes this process's cool-downs and circuit changes; applies the others' (the ReplicaSet's
    ``shared`` hooks)."""

    def __init__(
        self,
        store: FleetStore,
        states: Sequence[ReplicaState],
        clock: Callable[[], float],
        cooling_changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.states = list(states)
        self._by_name = {s.name: s for s in self.states}
        self._clock = clock
        self._cooling_changed = cooling_changed
        """Wakes the calls waiting for a cool-down (`llmguard_client._routing.wakeup.Wakeup.notify`)."""
        self._unread: dict[tuple[Kind, str], float] = {}
        """The keys events named that are still to be read (`_read_keys`): (kind, replica) and the longest time one
        of those events that held for every caller announced, in ms (-1: none did)."""
        self._asked_at: float | None = None
        """When the read of `_unread` was handed to the store (None: none waiting to run)."""
        self.channel = store.channel("events")
        store.subscribe(store.key("events"), self.receive)
        store.on_connect(self.resync)

    # --- learned here -----------------------------------------------------------------------

    def cooled(self, state: ReplicaState, seconds: float, holder: str | None) -> None:
        self._publish(state, "cool", seconds, holder)

    def opened(self, state: ReplicaState, seconds: float) -> None:
        self._publish(state, "open", seconds)

    def cleared(self, state: ReplicaState) -> None:
        self._publish(state, "clear", 0.0)

    def closed(self, state: ReplicaState) -> None:
        self._publish(state, "close", 0.0)

    def _publish(self, state: ReplicaState, kind: Kind, seconds: float, holder: str | None = None) -> None:
        """Tell the fleet of ``state``'s change (a cool-down: for the keys of ``holder``, the 429's that set it)."""
        if not self.store.available:
            return  # the next resync writes what is still in force
        ms = max(1, math.ceil(seconds * 1000)) if kind in ("cool", "open") else 0
        holder = holder if kind == "cool" else state.holder if kind == "clear" else None
        payload = self._event(state, kind, ms, holder)
        cool, opened = self.store.key("cool", state.name), self.store.key("open", state.name)
        ended = {"clear": [cool, opened], "close": [opened]}.get(kind, [])
        channel, origin = self.channel, self.store.origin

        async def write(client: Redis) -> None:
            # Redis Cluster: the two keys may live on different nodes, and redis-py's cluster pipeline refuses
            # PUBLISH and multi-key DEL; so one key per command, and the event after the key is written.
            pipe = client.pipeline(transaction=False)
            for key in ended:
                pipe.delete(key)
            if not ended:
                pipe.set(cool if kind == "cool" else opened, _held(origin, holder), px=ms)
            await pipe.execute()
            await client.publish(channel, payload)

        self.store.submit(write)

    def _event(self, state: ReplicaState, kind: Kind, ms: int, holder: str | None = None) -> str:
        event: dict[str, object] = {"o": self.store.origin, "r": state.name, "k": kind, "ms": ms, "t": time.time()}
        if holder is not None:  # the hash of the limit a 429 cooled it for, never the key
            event["c"] = holder
        return json.dumps(event)

    # --- learned elsewhere ------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """One event from the channel (the store's listener calls it)."""
        try:
            event = json.loads(data)
            origin, name, kind, ms, sent = event["o"], event["r"], event["k"], float(event["ms"]), float(event["t"])
            holder = event.get("c")
        except (ValueError, KeyError, TypeError, AttributeError):
            return
        if holder is not None and not isinstance(holder, str):
            return
        state = self._by_name.get(name)
        if origin == self.store.origin or state is None or not math.isfinite(ms) or ms < 0:
            return
        self.store.lag = max(0.0, time.time() - sent)
        now = self._clock()
        if kind in ("cool", "open"):
            every = ms if holder is None else -1.0
            self._unread[kind, name] = max(self._unread.get((kind, name), -1.0), every)
            if self._asked_at is None or now - self._asked_at > READ_AGAIN:
                self._asked_at = now
                self.store.submit(self._read_keys)
            return
        if kind in ("clear", "close"):
            if not state.local_open:  # a circuit an injected fault opened here is this process's to close
                state.open_until = min(state.open_until, now)
                state.tripped = False
            if kind == "clear" and not state.local_cool and _overlaps(holder, state.holder):
                state.cooling_until = min(state.cooling_until, now)
                state.probing = False
                state.probe_at = math.inf
                self._cooling_changed()

    async def _read_keys(self, client: Redis) -> None:
        """Mirror the time left on each key the events named (`_unread`), in one round trip, and the limit scope the
        key's value names: every caller's, when one of those events was and announced at least that time left (one
        process's 503 and another's 429 written over its key at once; a 503's that had ended when the key was read
        is not the 429's that wrote it next). What an event of a cool-down or an opened circuit tells is read where
        it is kept, on Redis's clock, not taken at its word: an event read late (this process frozen between a
        serverless runtime's invocations, or its loop stopped) gave a cool-down that had ended meanwhile its whole
        length from the thaw, and no comparison of the publisher's clock with this host's can tell a late event
        when the clocks disagree by about as much as it was held up. A burst of events is one read of the keys
        they name."""
        unread, self._unread, self._asked_at = self._unread, {}, None
        if not unread:
            return
        pipe = client.pipeline(transaction=False)
        for kind, name in unread:
            pipe.pttl(self.store.key(kind, name))
            pipe.get(self.store.key(kind, name))
        replies = await pipe.execute()
        now, changed = self._clock(), False
        for i, ((kind, name), every_ms) in enumerate(unread.items()):
            left, value = replies[2 * i], replies[2 * i + 1]
            every = isinstance(left, int) and left <= every_ms  # an every-caller cool-down that may still be in force
            changed |= self._mirror_left(self._by_name[name], kind, now, left, None if every else _holder_of(value))
        if changed:
            self._cooling_changed()

    async def resync(self, client: Redis) -> None:
        """After a (re)connection: write what is in force here and missing there, and publish it (the processes
        that reconnected first read the store before it was written); then mirror what is there."""
        now = self._clock()
        pipe = client.pipeline(transaction=False)
        written: list[tuple[ReplicaState, Kind, int, str | None]] = []
        for s in self.states:
            kinds: tuple[tuple[Kind, float, bool], ...] = (
                ("cool", s.cooling_until, s.local_cool),
                ("open", s.open_until, s.local_open),
            )
            for kind, until, local in kinds:
                if until - now > 0.001 and not local:  # an injected fault's (`Chaos`) stays in this process
                    ms = math.ceil((until - now) * 1000)
                    holder = s.holder if kind == "cool" else None
                    pipe.set(self.store.key(kind, s.name), _held(self.store.origin, holder), px=ms, nx=True)
                    written.append((s, kind, ms, holder))
        for s in self.states:
            pipe.pttl(self.store.key("cool", s.name))
            pipe.get(self.store.key("cool", s.name))
            pipe.pttl(self.store.key("open", s.name))
        replies = await pipe.execute()
        for (s, kind, ms, holder), reply in zip(written, replies, strict=False):
            if reply:  # missing there: the others may have resynced before it was written
                await client.publish(self.channel, self._event(s, kind, ms, holder))
        read = replies[len(replies) - 3 * len(self.states) :]
        now = self._clock()
        for i, s in enumerate(self.states):
            cool, value, opened = read[3 * i : 3 * i + 3]
            self._mirror_left(s, "cool", now, cool, _holder_of(value))
            self._mirror_left(s, "open", now, opened, None)

    def _mirror_left(self, state: ReplicaState, kind: Kind, now: float, left: object, holder: str | None) -> bool:
        """Mirror what ``state``'s ``kind`` key has ``left`` (its ``PTTL`` reply, ms; none unless a positive number:
        ended, or cleared, whose event follows), a cool-down for ``holder``'s calls; whether a cool-down changed."""
        if not isinstance(left, int) or left <= 0:
            return False
        if kind == "open":
            self._open(state, now, now + left / 1000)
            return False
        return self._cool(state, now, now + left / 1000, holder)

    @staticmethod
    def _cool(state: ReplicaState, now: float, until: float, holder: str | None = None) -> bool:
        """Mirror a cool-down until ``until``, for the calls of ``holder`` (a 429's limit scope; None: every
        caller); whether it changed this process's (a new or longer one)."""
        state.holder, latest, _ = state.hold_for(now, holder)
        until = min(until, latest)
        noted = state.note_ends(holder, until, None, None)
        if until <= state.cooling_until + _SLACK:
            return noted
        with calling_as(state.holder):  # the cool-down in force as the one it renews sees it
            mirror_cool_down(state, now, until)
        state.local_cool = False  # the fleet's now, not an injected fault's
        return True

    @staticmethod
    def _open(state: ReplicaState, now: float, until: float) -> None:
        if until > state.open_until + _SLACK:
            state.open_until, state.set_at = until, now
            state.tripped = True
            state.local_open = False


def _overlaps(cleared: str | None, holder: str | None) -> bool:
    """Whether a probe served for the keys of ``cleared`` ends a cool-down held for those of ``holder`` (None: every
    caller's): one that holds a key of it, as a probe served here ends a cool-down shared by several keys."""
    if cleared is None or holder is None:
        return cleared is None
    return not set(scopes(cleared)).isdisjoint(scopes(holder))


def _held(origin: str, holder: str | None) -> str:
    """A cool or open key's value: the process that wrote it, and the limit scope a 429's cool-down holds for."""
    return origin if holder is None else f"{origin} {holder}"


def _holder_of(value: object) -> str | None:
    """The limit scope a cool key's value (`_held`) names; None (every caller) for one without, or unreadable."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str):
        return None
    _, _, holder = value.partition(" ")
    return holder or None
