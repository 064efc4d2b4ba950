"""The fleet store: one Redis (or Valkey, or Redis Cluster) connection per Guard that never slows a call.

Calls never wait on it. What the fleet shares reaches each process in the background (a pub/sub listener and
periodic reads, `FleetStore.subscribe` / `FleetStore.every`) and is mirrored into local state that calls read.
Code that must ask Redis during a call uses `FleetStore.run`, bounded by ``op_timeout`` (50 ms by default):
on any failure or timeout it returns the caller's default at once. A timeout alone is no outage (a Redis one
region away, a latency spike): the store turns *slow*, and calls decide locally at once, without a round trip,
until a heartbeat is answered within ``op_timeout``; the heartbeat's own failure degrades it, as any error does.

The store runs on the asyncio loop of the first call (redis-py's asyncio client is asyncio-only; under trio
the fleet stays off and the Guard keeps its state in process). One supervisor task connects, subscribes,
runs the resync hooks (`FleetStore.on_connect`), then the listener, the writer of queued publications
(`FleetStore.submit`), a heartbeat (PING every ``heartbeat`` s, to every primary of a cluster: it finds a paused
server or a lost node) and the periodic reads. Any error marks the store degraded (one warning per transition,
the credentials redacted), closes the connections and reconnects with exponential backoff (``backoff_initial``
doubling to ``backoff_max``). A session counts as working once its first heartbeat is answered: only then is the
backoff reset and "connected again" said. One that fails before (a permission the server's ACL refuses on the
first call, say) backs off as a failed connection does, and a failure the log has told of already is not told
again: before, such a store reconnected ~10 times a second, warning each time. The subscription is confirmed
before the session counts as connected, so that a refused channel fails the connection itself.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import secrets
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import anyio
import anyio.abc

from llmguard_client._core.forks import in_forked_child
from llmguard_client._core.randomness import jitter
from llmguard_client._fleet.acl import explain
from llmguard_client._fleet.nodes import close_client, ping
from llmguard_client._fleet.url import FleetURL, redact_text

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.client import PubSub

__all__ = ["FleetSnapshot", "FleetStore"]

logger = logging.getLogger("llmguard_client")
_DIGITS = re.compile(r"\d+")
"""Numbers in a failure's text, masked to tell whether it is the failure the log told of already."""

_LISTEN_WAIT = 5.0
"""Seconds the pub/sub listener waits for a message per read (then reads again): any span works, as a lost
connection ends the read at once; it only has to be a read timeout of the listener's own (see `_listen`)."""

_SLOW_WARNING_EVERY = 60.0
"""Seconds between two warnings that the store answers too slowly for calls (a far Redis would warn on and on)."""

T = TypeVar("T")
Op = Callable[["Redis"], Awaitable[T]]
State = Literal["idle", "connecting", "connected", "degraded", "closed"]


def _spawn(tg: anyio.abc.TaskGroup, coro: Coroutine[Any, Any, None]) -> Coroutine[Any, Any, None]:
    """Start ``coro`` in ``tg``; returned, to be closed once ``tg`` has ended. An event loop that ends just as the
    session starts its tasks cancels them before their first step, and anyio (4.14 and later, which awaits a
    task's coroutine inside a wrapper of its own) then leaves the coroutine unawaited: Python warned
    "coroutine 'FleetStore._guarded' was never awaited" as it was collected (11 of 30 runs of the loop-ending
    test). Closing a coroutine that has run does nothing; closing one that never ran ends it without a warning."""
    tg.start_soon(lambda: coro, name=getattr(coro, "__qualname__", None))
    return coro


async def _in_own_task(work: Awaitable[T]) -> T:
    """``await work``, such that a cancellation of this task is never lost. redis-py loses one that lands in some
    of its waits (a ping while connecting returns as if uncancelled: redis/redis-py#2028, #2551), and a supervisor
    that went on to wait for trouble then kept ``asyncio.run`` from ever returning (it cancels each task once).
    Here the work is a task of its own, waited for through `asyncio.wait`, which a cancellation always ends;
    the work is then cancelled and given a second to stop. A cancellation that came as the work ended is raised
    here too, before the caller goes on (to start the session's tasks, which would be cancelled unstarted)."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait({task})
        await asyncio.sleep(0)
    except BaseException:
        task.cancel()
        task.add_done_callback(_retrieve)
        with anyio.CancelScope(shield=True):
            await asyncio.wait({task}, timeout=1.0)
        raise
    return task.result()


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # read, so that asyncio does not log it as never retrieved


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """The fleet store's state (``guard.snapshot().fleet``)."""

    url: str
    """The store's address, password masked."""
    name: str
    """The Guard's name: every key starts with ``llmguard:{name}:``."""
    state: State
    """idle (no call yet, or the event loop it ran on has ended), connecting, connected, degraded (running on local
    state), closed."""
    connected: bool
    degraded: bool
    last_error: str | None
    """The last failure, credentials masked (None: none yet)."""
    lag: float | None
    """Seconds between another process publishing the last event mirrored here and its arrival, on the two hosts'
    wall clocks: across hosts it includes their clocks' difference (0 when that makes it negative)."""
    transitions: int
    """How many times the store went from connected to degraded or back."""
    resyncs: int
    """Completed (re)connections, each followed by a resync of the mirrored state."""
    hints: Literal["polling", "following"] | None = None
    """Server hints (``poll_vllm_metrics``): this process polls the servers for the fleet (or for itself, while
    the store is unreachable), or believes the process that does; None: no poller runs here."""
    slow: bool = False
    """Connected, but an operation a call waited for took longer than it may wait: calls decide locally (a
    fleet-wide rate limit by this process's share) until a heartbeat is answered in time."""


class FleetStore:
    """The Guard's connection to the fleet; see the module docstring. Owned by the Guard (`start` on the
    first call, `aclose` with the Guard)."""

    def __init__(
        self,
        url: FleetURL,
        name: str,
        *,
        op_timeout: float = 0.05,
        connect_timeout: float = 1.0,
        heartbeat: float = 0.5,
        backoff_initial: float = 0.1,
        backoff_max: float = 1.0,
    ) -> None:
        self.url = url
        self.name = name
        self.op_timeout = op_timeout
        self.connect_timeout = connect_timeout
        self.heartbeat = heartbeat
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.origin = secrets.token_hex(6)
        """This store's id in published events (a process ignores its own)."""
        self._client: Redis | None = None
        self._state: State = "idle"
        self._task: asyncio.Task[None] | None = None
        self._stop: anyio.CancelScope | None = None
        self._trouble: asyncio.Event | None = None
        self._settled: asyncio.Event | None = None
        """Set once the first connection succeeded or failed (`first_connection` waits for it)."""
        self._outbox: deque[Op[object]] = deque(maxlen=256)
        self._outbox_ready: asyncio.Event | None = None
        self._channels: dict[str, Callable[[bytes], None]] = {}
        self._on_connect: list[Op[None]] = []
        self._periodic: list[tuple[float, Op[None]]] = []
        self._last_error: str | None = None
        self._told: str | None = None
        """The failure the log last told of (its digits masked); None once it has said the store works again (or
        said nothing)."""
        self._working = False
        """This session's first heartbeat was answered (see the module docstring)."""
        self._warned_backend = False
        self._moving = False
        """The supervisor was asked to stop on the loop it ran on (see `start`)."""
        self.lag: float | None = None
        self.transitions = 0
        self.resyncs = 0
        self._slow = False
        """An operation of a call timed out while connected (see the module docstring)."""
        self._waited_out = False
        """A call's wait for the first connection ran out (`settling`); reset when a supervisor starts."""
        self._slow_warned = -math.inf
        in_forked_child(self.forked)

    # --- the contract -----------------------------------------------------------------------

    def key(self, *parts: str) -> str:
        """``llmguard:{name}:`` + the parts joined by ``:``."""
        return f"llmguard:{self.name}:" + ":".join(parts)

    def channel(self, *parts: str) -> str:
        """The pub/sub channel to publish on for `key` ``(*parts)``: it names the database unless it is 0, as
        pub/sub ignores the database (`FleetURL.channel`)."""
        return self.url.channel(self.key(*parts))

    @property
    def closed(self) -> bool:
        return self._state == "closed"

    @property
    def available(self) -> bool:
        """Connected and not degraded right now."""
        return self._state == "connected"

    async def run(self, op: Op[T], default: T) -> T:
        """``op`` against Redis within ``op_timeout``; on any failure or timeout ``default`` at once (and the
        store degrades and reconnects in the background). Never raises, except the caller's cancellation.
        While the store is not connected, ``default`` is returned without trying."""
        client = self._client
        if client is None or self._state != "connected":
            self.start()
            return default
        if self._slow:
            return default
        try:
            with anyio.fail_after(self.op_timeout):
                return await op(client)
        except anyio.get_cancelled_exc_class():
            raise
        except TimeoutError:
            self._turn_slow()
            return default
        except Exception as exc:
            self.degrade(exc)
            return default

    def _turn_slow(self) -> None:
        self._slow = True
        self._last_error = f"TimeoutError: no answer within {self.op_timeout * 1000:g} ms"
        now = anyio.current_time()
        if now - self._slow_warned >= _SLOW_WARNING_EVERY:
            self._slow_warned = now
            logger.warning(
                "llmguard fleet %s (name %r) answers slower than a call may wait (%g ms): calls decide locally "
                "until it answers in time",
                self.url.redacted,
                self.name,
                self.op_timeout * 1000,
            )

    def settling(self) -> Awaitable[bool] | None:
        """`start` (per call: cheap once it runs), then `first_connection` while the first connection is under
        way (what a call's cohort waits for, so that a process's first calls follow the fleet's kill switch);
        None, at once, otherwise, and once a wait for it has run out (a store that accepts connections and
        never answers slows one wait, not every call)."""
        self.start()
        if self._state not in ("idle", "connecting") or self._waited_out or self._settled is None:
            return None
        return self.first_connection()

    async def first_connection(self) -> bool:
        """Connected now; or, while the first connection is under way, once it is, waiting at most
        ``op_timeout`` (what a fleet-wide rate limit's first admission awaits). False at once otherwise, and
        once a wait for this connection has run out."""
        if self._state == "connected":
            return True
        if self._state not in ("idle", "connecting"):
            return False
        self.start()
        settled = self._settled
        if settled is None or self._waited_out:  # no asyncio loop (the fleet stays off), or waited for in vain
            return False
        with anyio.move_on_after(self.op_timeout) as waited:
            await settled.wait()
        if waited.cancelled_caught:
            self._waited_out = True  # until this connection settles: the next calls do not wait for it again
        return self.available  # (re-read: the wait may have changed the state)

    # --- for the parts that share through the store -----------------------------------------

    def subscribe(self, name: str, handler: Callable[[bytes], None]) -> None:
        """Call ``handler(payload)`` for each message published on the channel of ``name`` (a `key`: the store
        subscribes to its `channel` on this database). Set up before `start`."""
        self._channels[self.url.channel(name)] = handler

    def on_connect(self, hook: Op[None]) -> None:
        """Run ``hook(client)`` after each (re)connection, before the store reports connected: a resync."""
        self._on_connect.append(hook)

    def every(self, seconds: float, read: Op[None]) -> None:
        """Run ``read(client)`` every ``seconds`` while connected (and once right after each resync)."""
        self._periodic.append((seconds, read))

    def submit(self, op: Op[object]) -> None:
        """Queue ``op`` for the background writer (dropped while not connected: the next resync covers it)."""
        if self._state == "connected" and self._outbox_ready is not None:
            self._outbox.append(op)
            self._outbox_ready.set()

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the supervisor on the running asyncio loop, unless it runs already (cheap: called per call). If it
        runs on another loop that still runs (the Guard's calls moved from its own sync loop to async code's),
        stop it there: a call after it has stopped starts it here."""
        task = self._task
        if task is not None and not task.done():
            self._leave_other_loop(task)
            return
        if self._state == "closed":
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop, or not asyncio (trio): the Guard keeps its state in process
            if not self._warned_backend:
                self._warned_backend = True
                self._last_error = "the fleet store needs an asyncio event loop; running on local state"
                logger.warning("llmguard fleet %s: %s", self.url.redacted, self._last_error)
            return
        self._stop = None
        self._waited_out = False
        self._trouble = asyncio.Event()
        self._outbox_ready = asyncio.Event()
        self._settled = asyncio.Event()
        self._task = loop.create_task(self._supervise(), name=f"llmguard-fleet-{self.name}")

    def forked(self) -> None:
        """In a child process just forked: take an id of its own for what it publishes. A store ignores the events
        that carry its id (its own), so workers forked from a parent whose Guard was built before the fork (gunicorn
        ``--preload``, a prefork pool) would otherwise ignore each other's. A store that had started there is the
        parent's: its Guard refuses every call in the child (``FORKED``), so nothing here starts it again. The id is
        the operating system's: Python reseeds `random` only where its at-fork hooks ran, which uWSGI's workers
        skip, so sibling workers drew the same."""
        self.origin = secrets.token_hex(6)

    def _leave_other_loop(self, task: asyncio.Task[None]) -> None:
        home = task.get_loop()
        if self._moving or home is asyncio._get_running_loop() or asyncio._get_running_loop() is None:
            return
        stop = self._stop
        try:  # the supervisor finishes its shielded cleanup there, then ends: the store is idle
            home.call_soon_threadsafe(stop.cancel if stop is not None else task.cancel)
        except RuntimeError:  # that loop has closed: its task is gone with it
            return
        self._moving = True
        task.add_done_callback(self._moved)

    def _moved(self, _: asyncio.Task[None]) -> None:
        self._moving = False

    async def aclose(self) -> None:
        """Stop the background work and close the connections (idempotent)."""
        self._state = "closed"
        task, self._task = self._task, None
        if task is not None and not task.done():
            if self._stop is not None:
                self._stop.cancel()  # the supervisor finishes its shielded cleanup, then ends
            else:
                task.cancel()  # not started yet: nothing to clean up
            home = task.get_loop()
            if home is not asyncio.get_running_loop() and not home.is_running():
                return  # a stopped loop (one kept for the process, between its runs): it ends there if it runs again
            with anyio.CancelScope(shield=True):
                await asyncio.wait([task], timeout=5.0)
            if not task.done():
                task.cancel()

    def snapshot(self) -> FleetSnapshot:
        return FleetSnapshot(
            url=self.url.redacted,
            name=self.name,
            state=self._state,
            connected=self._state == "connected",
            degraded=self._state == "degraded",
            last_error=self._last_error,
            lag=self.lag,
            transitions=self.transitions,
            resyncs=self.resyncs,
            slow=self._slow and self._state == "connected",
        )

    def degrade(self, exc: BaseException) -> None:
        """Note a failure: run on local state now, reconnect in the background."""
        detail = redact_text(f"{type(exc).__name__}: {exc}".rstrip(": "), self.url)
        if isinstance(exc, TimeoutError) and not str(exc):
            detail = "TimeoutError: no answer in time"
        if (missing := explain(exc)) is not None:
            detail = f"{detail}; {missing}"
        self._last_error = detail
        if self._state in ("closed", "degraded"):
            return
        if self._state == "connected":
            self.transitions += 1
        self._state = "degraded"
        self._client = None
        if self._settled is not None:
            self._settled.set()
        told = _DIGITS.sub("#", detail)  # the same failure, whatever counts or times its text quotes (an OOM's)
        if told != self._told:  # else the log says so already: a session that failed again as the last one did
            self._told = told
            logger.warning(
                "llmguard fleet %s (name %r) degraded: %s; running on local state, reconnecting in the background",
                self.url.redacted,
                self.name,
                detail,
            )
        if self._trouble is not None:
            self._trouble.set()

    # --- the supervisor ---------------------------------------------------------------------

    async def _supervise(self) -> None:
        """The background task: `aclose` cancels this scope, not the task, so the shielded closing of the
        connections always runs to its end (a task's own cancellation would cut through the shield and leave
        sockets behind). Cancelled as its event loop ends, it leaves the store idle: the next loop's first call
        starts it again."""
        try:
            with anyio.CancelScope() as self._stop:
                await self._connect_forever()
        finally:
            if self._state != "closed":
                self._state, self._waited_out = "idle", False

    async def _connect_forever(self) -> None:
        delay = self.backoff_initial
        while self._state != "closed":
            if self._state == "idle":
                self._state = "connecting"
            assert self._trouble is not None
            self._trouble.clear()
            self._working = False
            client: Redis | None = None
            try:
                made = self.url.client(socket_timeout=self.connect_timeout, connect_timeout=self.connect_timeout)
                client = cast("Redis", made)
                with anyio.fail_after(self.connect_timeout):
                    await _in_own_task(client.ping())
                await self._session(client)
            except Exception as exc:
                self.degrade(exc)
            finally:
                self._client = None
                if client is not None:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                        await close_client(client)
            if self.closed:
                return
            if self._working:
                delay = self.backoff_initial  # it worked: the next outage starts from a short wait
            await self._pause(delay)
            delay = min(delay * 2, self.backoff_max)

    async def _pause(self, delay: float) -> None:
        """The wait before the next connection: ``delay`` with jitter (half of it to all of it)."""
        await anyio.sleep(delay * jitter(0.5, 1.0))

    async def _session(self, client: Redis) -> None:
        pubsub = client.pubsub()
        spawned: list[Coroutine[Any, Any, None]] = []
        try:
            with anyio.fail_after(self.connect_timeout):
                await _in_own_task(self._resync(client, pubsub))
            was = self._state
            self._state, self._client, self._slow = "connected", client, False
            self.resyncs += 1
            if self._settled is not None:
                self._settled.set()
            if was == "degraded":
                self.transitions += 1  # said in the log once it works (`_beat`)
            async with anyio.create_task_group() as tg:
                if self._channels:
                    spawned.append(_spawn(tg, self._guarded(self._listen, pubsub)))
                spawned.append(_spawn(tg, self._guarded(self._write, client)))
                spawned.append(_spawn(tg, self._guarded(self._beat, client)))
                for seconds, read in self._periodic:
                    spawned.append(_spawn(tg, self._guarded(self._repeat, client, seconds, read)))
                assert self._trouble is not None
                await self._trouble.wait()  # set by `degrade`: a task's failure, or `run`'s
                tg.cancel_scope.cancel()
        finally:
            for coro in spawned:  # a task cancelled before it started left its coroutine unawaited (see `_spawn`)
                coro.close()
            with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # untyped in older redis-py

    async def _resync(self, client: Redis, pubsub: PubSub) -> None:
        """Subscribe (confirmed: a refused channel is the server's answer to it), then run the resync hooks and
        each periodic read once."""
        if self._channels:
            await pubsub.subscribe(*self._channels)
            confirmed = 0
            while confirmed < len(self._channels):
                message = await pubsub.get_message(timeout=None)
                if message is not None and message.get("type") == "subscribe":
                    confirmed += 1
                elif message is not None:
                    self._dispatch(message)
        for hook in self._on_connect:
            await hook(client)
        for _, read in self._periodic:
            await read(client)

    async def _guarded(self, task: Callable[..., Awaitable[None]], *args: object) -> None:
        """Run one of the session's tasks; its failure degrades the store, which ends the session."""
        try:
            await task(*args)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            self.degrade(exc)

    async def _listen(self, pubsub: object) -> None:
        """Dispatch what the subscription receives, waiting at most ``_LISTEN_WAIT`` s per read. Not
        ``pubsub.listen()``: before redis-py 8.1 its blocking read gives up at the client's socket timeout, so an
        idle subscription raised TimeoutError every ``connect_timeout`` and the store degraded against a healthy
        Redis. A read with a timeout of its own returns None when nothing came (redis-py 5.0.1 on), and raises at
        once when the connection is lost, as the blocking read did."""
        from redis.asyncio.client import PubSub

        assert isinstance(pubsub, PubSub)
        while pubsub.subscribed:
            message = await pubsub.get_message(timeout=_LISTEN_WAIT)
            if message is not None:
                self._dispatch(message)
        raise ConnectionError("the pub/sub connection closed")

    def _dispatch(self, message: dict[str, Any]) -> None:
        """A published message to its channel's handler (anything else is ignored)."""
        if message.get("type") != "message":
            return
        channel = message["channel"]
        handler = self._channels.get(channel.decode() if isinstance(channel, bytes) else str(channel))
        data = message["data"]
        if handler is not None and isinstance(data, bytes):
            handler(data)

    async def _write(self, client: Redis) -> None:
        assert self._outbox_ready is not None
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            while self._outbox:
                op = self._outbox.popleft()
                with anyio.fail_after(self.connect_timeout):
                    await op(client)

    async def _beat(self, client: Redis) -> None:
        while True:
            await anyio.sleep(self.heartbeat)
            sent = anyio.current_time()
            with anyio.fail_after(max(self.heartbeat, self.op_timeout)):
                await ping(client)  # on a cluster, every primary: a lost node is noticed within one beat
            self._working = True
            if self._told is not None:
                self._told = None
                logger.warning("llmguard fleet %s (name %r) connected again; resynced", self.url.redacted, self.name)
            if self._slow and anyio.current_time() - sent < self.op_timeout:
                self._slow = False
                logger.info("llmguard fleet %s (name %r) answers in time again", self.url.redacted, self.name)

    async def _repeat(self, client: Redis, seconds: float, read: Op[None]) -> None:
        while True:
            await anyio.sleep(seconds)
            with anyio.fail_after(max(self.connect_timeout, self.op_timeout)):
                await read(client)
