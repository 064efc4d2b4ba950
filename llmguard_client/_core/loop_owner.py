"""The one event loop a Guard's connections belong to at a time, and the Guard's move to the next.

A connection pool opened on one event loop cannot be used from another: two threads each running
``asyncio.run`` with one Guard failed as "Connection error." over ``RuntimeError: ... bound to a different
event loop``, and a second ``asyncio.run`` after the first returned failed with ``RuntimeError: Event loop
is closed`` (the pool's kept connections belong to the ended loop). The first loop that makes a call owns
the Guard. While it runs, a call from any other loop is refused before anything is sent, with the fix in
the message. Once it has ended (a script's second ``asyncio.run``, a loop per test, a task queue running each
task in ``asyncio.run``), the next loop that calls takes the Guard over, with pools of its own.

The owner's pools are swapped for new ones, and closed, while it ends: the loop finalizes its async
generators then (``asyncio.run``, ``asyncio.Runner``, ``anyio.run``, pytest-asyncio, uvloop), and one of them,
parked from the first call on, is this module's. A loop closed without that (``loop.close()`` alone) leaves its
connections unclosed; the next loop to call drops them, as an httpx client's would be dropped. A trio run is an
event loop here as an asyncio loop is (`llmguard_client._core.event_loops`): ``trio.run`` finalizes its async
generators as it ends too.

Sync calls run on the Guard's own loop, on a thread of its own (its *home*, `llmguard_client.edges`), unless an
event loop of the caller's owns the Guard: then they run on that loop (`sync_loop`) as its guests (`as_guest`), so
a web app's sync handlers (in worker threads) and its async ones share one Guard. As that loop ends, the Guard
leaves it at once (sync calls go home, with new pools) and cancels and waits for its guests; a guest cut before its
answer arrived is sent again by the sync edge (`LoopEnded`). A loop stopped for a moment with guests in flight
(``asyncio.run`` between its main task and its clean-up) is waited for, up to `STOPPED_WAIT`.

The other way round, the first call of async code takes the Guard over from its home loop once the sync calls
running there have handed their responses over (new ones wait for that, so it comes even under steady sync traffic),
within its tier's ttft: a call that has handed its response over sends nothing more, and its body is read on at
home, from the home's pools, which are closed there once the last such body has ended. A sync call made on the owner
loop's own thread (a notebook cell after an awaited call) blocks that loop until it returns: if nothing of the
Guard's is in flight there, the Guard leaves that loop for its home (`leave_blocked_owner`, its pools closed on the
old loop once it runs again) and the call runs on the home loop; else it is refused, as it would wait for the calls
of the very loop it blocks. A loop blocked by anything else (its thread waiting for sync calls it fanned out to a
thread pool) is seen from the waiting threads: a guest not started within `BLOCKED_AFTER` of being handed to it
(`Handed`) takes it for blocked, and the Guard leaves it the same way (`leave_blocked_loop`); that guest is refused
there for good, and sent again where the Guard runs.

A process forked while a loop owned the Guard (its home, or a loop of the caller's that had not ended: gunicorn
``--preload``, a prefork pool, ``multiprocessing`` with fork) has neither that loop running nor connections of its
own: in the child the Guard is `forked`, and every call there is refused at once (`FORKED`); nothing of the
parent's (its loop, its connections, its calls in flight) is touched there.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import TypeVar

import anyio
import httpx

from llmguard_client._core.event_loops import EventLoop, running_loop, running_task, start_soon
from llmguard_client._core.forks import catch_up_with_fork, in_forked_child
from llmguard_client.errors import GuardClosed

logger = logging.getLogger("llmguard_client")
T = TypeVar("T")

BLOCKS_ITS_LOOP = (
    "a sync call from the event loop this Guard's calls run on, while calls of that loop are in flight, would block "
    "the loop they need; await the async client there (guard.http_client(), guard.httpx2_client()), or run the sync "
    "code in a worker thread (asyncio.to_thread, trio.to_thread.run_sync), where the Guard's sync clients run their "
    "calls on this loop"
)
"""Why a sync call from the owner loop's own thread is refused while the Guard has calls in flight there."""

HANDOVER_TIMED_OUT = (
    "sync calls running on this Guard's own thread were still waiting for their first token when this call's ttft "
    "ran out, so the Guard could not move to this event loop (their connections are that thread's); make an async "
    "call first (the app's startup), so that sync calls from worker threads run on this loop from the start"
)
"""Why a call from another loop is refused while the home loop's sync calls outlast its ttft."""

WRONG_LOOP = (
    "this Guard's connections belong to another event loop, which is still running (e.g. two threads each "
    "running asyncio.run); use one Guard per running event loop (build it inside that loop: `async with "
    "Guard(...)`), or the Guard's sync clients (guard.sync_http_client(), guard.sync_httpx2_client()), which "
    "serve every thread from one loop"
)

LEFT_BEHIND = (
    "the event loop this call ran on (an event loop of yours that owned the Guard) ended, or the Guard left it, "
    "before the call's response arrived"
)
"""Why a call on a caller's loop ended without an answer: a sync call's edge sends it again where the Guard runs;
an async call (made in that loop's clean-up) is refused, nothing sent."""

GUESTS_END_WITHIN = 5.0
"""Seconds an ending owner loop waits for the sync calls it cancelled to end (each closes its connection)."""

OWNER_RUNS = "the event loop that owns this Guard was stopped for a moment as this sync call started, and runs again"
"""Why a sync call that came to the Guard's own loop is sent again (to the owner loop, as its guest)."""

OWNER_STOPPED = (
    "the event loop this Guard's calls run on is stopped (between two runs of run_until_complete) with calls of its "
    "own in flight, which go on only when it runs again; run it again first (or close those calls), or make the "
    "sync calls from another thread while it runs"
)
"""Why a call is refused while the owner loop stays stopped with calls in flight."""

FORKED = (
    "this Guard's calls ran on an event loop (its own thread's, for sync calls, or one of yours) when the process "
    "forked: that loop and the Guard's connections stayed in the parent, so it cannot serve this process; build the "
    "Guard in each worker process, after the fork (e.g. in gunicorn's post_fork hook, or without --preload; uWSGI "
    "with --lazy-apps)"
)
"""Why every call is refused in a child forked while a loop owned the Guard."""

STOPPED_WAIT = 1.0
"""Seconds a call waits for an owner loop stopped with calls in flight to run again or end: asyncio.run stops
its loop for a moment between its main task and its clean-up; a loop stopped for good would wait for ever."""

BLOCKED_AFTER = 5.0
"""Seconds a sync call handed to the owner loop from another thread waits to start there before the loop is taken
for blocked. Its start is a callback queued on that loop, which runs its ready callbacks at every turn: not started
within this long, the loop has run no turn for about as long. A loop busy with CPU work for a second or two (parsing,
tokenising) is not blocked, and taking it for blocked costs its next async call a wait for the moved calls' first
tokens, refused past its ``ttft`` (measured at 1 s: a 1.5 s CPU stretch then had an async call with a 2 s ttft
refused); a loop that runs no turn for 5 s is stuck (its own timers are late by as much). One that is blocked costs
its waiting threads this long once (later calls go where the Guard runs then)."""

LOOP_BLOCKED = (
    f"the event loop this sync call was handed to (one of yours, which owned the Guard) did not start it within "
    f"{BLOCKED_AFTER:g}s: it was taken for blocked (e.g. waiting for this very call), and the Guard left it"
)
"""Why a guest never started on a blocked loop: the sync edge sends it again where the Guard runs."""

HANDOVER_POLL = 0.01
"""Seconds between two looks, while a loop waits to take the Guard over, at whether the home loop's sync calls
have ended."""

SwapPools = Callable[[], Sequence[httpx.AsyncBaseTransport]]
"""Give the Guard new connection pools and return the old ones (to close, or to drop)."""


class LoopOwner:
    """Which running event loop may use the Guard's connections now."""

    __slots__ = (
        "__weakref__",
        "_ended_loop",
        "_forked",
        "_guests",
        "_home",
        "_home_calls",
        "_home_idle",
        "_home_streams",
        "_idle",
        "_left_at_home",
        "_lock",
        "_loop",
        "_moved",
        "_pending",
        "_pending_wait",
        "_released",
        "_swap",
        "_token",
        "_watch",
    )

    def __init__(self, swap_pools: SwapPools, idle: Callable[[], bool]) -> None:
        self._swap = swap_pools
        self._idle = idle
        """Whether the Guard has nothing in flight (no call, no request in a pool)."""
        self._loop: weakref.ref[EventLoop] | None = None
        self._watch: AsyncGenerator[None] | None = None
        """Parked in the owner loop until it ends (see the module's docstring); held here, as a loop holds its
        async generators only weakly."""
        self._token: object | None = None
        """The current watcher's: one left behind by a move to another loop does nothing as it ends."""
        self._released = True
        """Whether the owner's pools were swapped out as it ended (True before any loop owned them)."""
        self._home: asyncio.AbstractEventLoop | None = None
        """The Guard's own loop for sync calls, once it has started."""
        self._home_calls = 0
        """Sync calls on the home loop that have not handed their response over: while there are any, no other loop
        takes the Guard over (they may send attempts, through the pools of the loop that owns the Guard)."""
        self._home_streams = 0
        """Sync calls on the home loop whose bodies are still read there (`HomeCall.delivered`)."""
        self._left_at_home: list[httpx.AsyncBaseTransport] = []
        """Home pools the Guard left while bodies were still read from them: closed there after the last one."""
        self._pending: EventLoop | None = None
        """A loop waiting for the home loop's sync calls to end, to take the Guard over (`claim`)."""
        self._pending_wait = 0.0
        self._ended_loop: weakref.ref[EventLoop] | None = None
        """The last owner loop the Guard left as it ended: no call there takes the Guard back."""
        self._guests: set[object] = set()
        """The tasks of sync calls running on the owner loop, from other threads (`as_guest`)."""
        self._lock = threading.Lock()
        self._home_idle = threading.Condition(self._lock)
        """Notified when the pending loop has taken the Guard over, or given up."""
        self._moved = threading.Condition(self._lock)
        """Notified when the Guard leaves a loop as it ends."""
        self._forked = False
        in_forked_child(self._after_fork)

    @property
    def forked(self) -> bool:
        """Whether this is a child process forked while a loop owned the Guard (`_after_fork`): its calls are
        refused. Read at the entry of every call and close, so it first catches up with a fork that ran no at-fork
        hooks (`catch_up_with_fork`: uWSGI's workers), where the Guard took its loop, left in the parent, for one
        still running here."""
        catch_up_with_fork()
        return self._forked

    def _after_fork(self) -> None:
        """In a child process just forked (only the forking thread runs): the locks are new (another thread of the
        parent may have held one), and the Guard is `forked` if a loop owned it: the Guard's own loop thread, or a
        loop of the caller's still running (a trio run's is forgotten as it ends), which nothing runs here (the fork
        came from another thread) or which the child must not go on with (its connections are the parent's). Its
        watcher, still parked in that loop, does nothing if the loop ends in the child."""
        self._lock = threading.Lock()
        self._home_idle = threading.Condition(self._lock)
        self._moved = threading.Condition(self._lock)
        owner = self._loop() if self._loop is not None else None
        if isinstance(owner, asyncio.AbstractEventLoop) and not owner.is_running():
            owner = None  # ended without finalizing (``loop.close()`` alone), or stopped between its runs (a loop kept
            # for the process, run with ``run_until_complete``): the next loop takes the Guard over, as in the parent
        home = self._home
        if owner is not None or (home is not None and not home.is_closed()):
            self._forked = True
            self._token = None

    def owns(self) -> bool:
        """Whether the running loop may make a call without claiming (it owns the Guard, or there is none)."""
        loop = running_loop()
        owner = self._loop
        return loop is None or (owner is not None and owner() is loop)

    def _owner(self) -> EventLoop | None:
        owner = self._loop() if self._loop is not None else None
        return None if owner is None or owner.is_closed() else owner

    async def claim(self, wait: float = 0.0) -> str | None:
        """Make the running loop the owner if no other loop runs with the Guard's connections; else why not. From
        the Guard's own loop, busy with sync calls, the Guard is handed over once they have ended, waited for up to
        ``wait`` seconds: meanwhile new sync calls wait for the handover (`sync_loop`), so the busy loop drains."""
        loop = running_loop()
        assert loop is not None, "claimed from a running event loop"
        if self.forked:  # read before the first call too (a metrics poller): a parent's loop is not to be taken over
            return FORKED
        if self._ended_loop is not None and self._ended_loop() is loop:  # a sync call that started before it ended
            raise LoopEnded(LEFT_BEHIND)
        give_up = loop.time() + wait
        stopped_since = loop.time()
        left: tuple[EventLoop, AsyncGenerator[None] | None, Sequence[httpx.AsyncBaseTransport]] | None = None
        dropped: AsyncGenerator[None] | None = None
        try:
            while True:
                with self._lock:
                    owner = self._owner()
                    if owner is loop:
                        return None
                    stopped_busy = False
                    if owner is not None and owner is not self._home:
                        if owner.is_running() and loop is self._home:
                            # a sync call that came home while the owner was stopped for a moment (asyncio.run
                            # between its main task and its clean-up): it is sent again, to run on that loop
                            raise OwnerRuns(OWNER_RUNS)
                        if owner.is_running():
                            return WRONG_LOOP
                        if self._idle():  # stopped (run_until_complete between runs), nothing in flight: left
                            left, owner = (owner, *self._leave()), None
                        elif loop.time() >= min(give_up, stopped_since + STOPPED_WAIT):
                            return OWNER_STOPPED
                        else:  # stopped with calls in flight: they end, or go on, when it ends or runs again
                            stopped_busy = True
                    # no owner, or the home loop: taken now unless sync calls run, or are about to, on the home loop
                    if stopped_busy:
                        pass
                    elif loop is self._home or not self._home_calls:
                        if self._pending is loop:  # the sync calls waiting for this handover go on
                            self._pending = None
                            self._home_idle.notify_all()
                        self._loop = weakref.ref(loop)
                        stale = not self._released and owner is None
                        self._released = False
                        self._token = token = object()
                        dropped, self._watch = self._watch, self._until_loop_ends(token)
                        watch = self._watch
                        break
                    elif self._pending not in (None, loop) or loop.time() >= give_up:
                        return HANDOVER_TIMED_OUT if self._pending in (None, loop) else WRONG_LOOP
                    else:
                        self._pending, self._pending_wait = loop, wait
                await anyio.sleep(HANDOVER_POLL)
        finally:
            with self._lock:
                if self._pending is loop:  # given up, or cancelled: the sync calls stop waiting for it
                    self._pending = None
                    self._home_idle.notify_all()
        # The old watch, if any, is dropped with the lock free: a loop that never set the async generator hooks (one
        # driven by nest_asyncio) ends it here, on this thread, and its finally takes the lock.
        del dropped
        if left is not None:
            _settle_on(*left)
        if stale:  # the old loop ended without finalizing: its connections cannot be closed, only dropped
            self._swap()
        elif owner is not None and self._home is not None:  # taken over from the home loop: closed there
            self._leave_home(self._swap())
        await watch.__anext__()  # parked: the loop closes it as it ends
        return None

    async def retire(self) -> None:
        """The Guard is closing its pools: end the generator parked in the owner loop, if that is the running loop,
        so that it is not collected unfinished once the Guard is gone (trio warns of such a generator; asyncio
        finalizes it quietly). From another loop it is left to its own loop's end."""
        with self._lock:
            watch = self._watch
            if watch is None or self._owner() is not running_loop():
                return
            self._watch = self._token = None  # its finally does nothing now: the Guard closes the pools itself
        await watch.aclose()

    async def _until_loop_ends(self, token: object) -> AsyncGenerator[None]:
        try:
            yield
        finally:
            with self._lock:
                current = self._token is token  # else the Guard moved on while this loop still ran
                if current:  # from now on sync calls run at home, with new pools
                    self._ended_loop = self._loop
                    old = self._swap()
                    self._loop = self._watch = self._token = None
                    self._released = True
                    guests, self._guests = self._guests, set()
                    self._moved.notify_all()
            if current:
                with anyio.CancelScope(shield=True):  # a trio run ends its async generators in a cancelled scope
                    await _end_guests(guests)
                    await _close_all(old)

    # --- sync calls ------------------------------------------------------------------------

    def set_home(self, loop: asyncio.AbstractEventLoop) -> None:
        """The Guard's own loop for sync calls has started."""
        self._home = loop

    def sync_loop(self, count: bool = True) -> EventLoop | None:
        """Where a sync call runs: the caller's running event loop that owns the Guard (not the home loop); or
        None, the home loop, where the call is counted (`home_call`; unless not ``count``: the sync server-hints
        poller, which holds no loop). While a loop waits to take the Guard over from the home loop, the call waits
        for that (at most as long as that loop does)."""
        with self._lock:
            pending, started = self._pending, time.monotonic()
            while (
                pending is not None
                and not pending.is_closed()
                and running_loop() is not pending  # else that loop waits for this very call
                and time.monotonic() - started < self._pending_wait
            ):
                self._home_idle.wait(HANDOVER_POLL * 10)
                pending = self._pending
            owner = self.sync_owner()
            if owner is None and count:
                self._home_calls += 1
            return owner

    def leave_blocked_owner(self) -> bool:
        """A sync call on the owner loop's own thread, which blocks that loop until it returns: if nothing of the
        Guard's is in flight, the Guard leaves the loop (`_leave_idle`) and True, the call goes to the home loop; else
        False. A guest that has started there is in flight before its call counts as such; one handed to the loop
        but not started yet is refused as it starts (`LoopEnded`), and sent again where the Guard runs then."""
        loop = running_loop()
        if loop is None:
            return False
        with self._lock:
            left = self._leave_idle(loop)
        if left is None:
            return False
        _settle_on(loop, *left)
        return True

    def hand(self, loop: EventLoop) -> Handed:
        """A sync call about to be handed to ``loop``, the owner, from another thread (`as_guest`)."""
        return Handed(self, loop)

    def leave_blocked_loop(self, handed: Handed) -> bool:
        """From the thread of a sync call handed to the owner loop that has not started there within
        `BLOCKED_AFTER`: the loop is taken for blocked (its thread may wait for this very call). If nothing of the
        Guard's is in flight there, the Guard leaves it as `leave_blocked_owner` does; once the Guard is not there,
        the call is refused there for good (never started, even if the Guard comes back to the loop before it would
        start) and True: it is sent where the Guard runs now. False, to wait on, if it has started, or the Guard
        has calls in flight on that loop."""
        loop = handed.loop
        with self._lock:
            if handed.started:
                return False
            left = self._leave_idle(loop)
            if left is None and self._owner() is loop:
                return False
            handed.refused = True
        if left is not None:
            _settle_on(loop, *left)
        return True

    def _leave_idle(
        self, loop: EventLoop
    ) -> tuple[AsyncGenerator[None] | None, Sequence[httpx.AsyncBaseTransport]] | None:
        """With the lock held: `_leave` ``loop``, a loop of the caller's that owns the Guard and blocks, if nothing
        of the Guard's is in flight there (no call, no guest: one that has started is in flight before its call
        counts as such); else None."""
        if loop is self._home or self._owner() is not loop or self._guests or not self._idle():
            return None
        return self._leave()

    def _leave(self) -> tuple[AsyncGenerator[None] | None, Sequence[httpx.AsyncBaseTransport]]:
        """With the lock held: the owner loop gives the Guard up as if it had ended (new pools for the next loop to
        claim); its parked generator (whose finally does nothing now) and its pools, for `_settle_on`."""
        watch, old = self._watch, self._swap()
        self._loop = self._watch = self._token = None
        self._released = True
        return watch, old

    async def as_guest(self, call: Callable[[], Awaitable[T]], handed: Handed | None = None) -> T:
        """Run a sync call from another thread on the owner loop (the running one), as one of its guests: cancelled
        and waited for as that loop ends (`asyncio.run` cancels only the tasks it has when its main task returns).
        `LoopEnded` if the Guard has left the loop by the time the call starts, or its ``handed`` was given up on
        as the loop blocked (`leave_blocked_loop`), before anything is sent."""
        loop, task = running_loop(), running_task()
        with self._lock:
            if handed is not None and handed.refused:  # sent where the Guard ran then: never here too
                raise LoopEnded(LOOP_BLOCKED)
            # an asyncio loop ending its async generators is about to end this Guard's too (and warns of new ones)
            if loop is None or self._owner() is not loop or getattr(loop, "_asyncgens_shutdown_called", False):
                raise LoopEnded(LEFT_BEHIND)
            if handed is not None:
                handed.started = True
            self._guests.add(task)
        try:
            return await call()
        finally:
            with self._lock:
                self._guests.discard(task)

    def wait_left(self, loop: EventLoop, timeout: float) -> None:
        """From a sync caller's thread whose call ``loop`` cancelled (it is ending): wait until the Guard has left
        it, at most ``timeout`` seconds."""
        with self._lock:
            self._moved.wait_for(lambda: self._owner() is not loop, timeout)

    def sync_owner(self) -> EventLoop | None:
        """The running event loop that owns the Guard, if it is not the home loop."""
        owner = self._owner()
        return owner if owner is not None and owner is not self._home and owner.is_running() else None

    def home_call(self) -> HomeCall:
        """The sync call just counted by `sync_loop` (on the home loop): what it tells as it goes on."""
        return HomeCall(self)

    def _delivered(self) -> None:
        with self._lock:
            self._home_calls -= 1
            self._home_streams += 1

    def _ended(self, delivered: bool) -> None:
        with self._lock:
            if not delivered:
                self._home_calls -= 1
                return
            self._home_streams -= 1
            if self._home_streams or not self._left_at_home:
                return
            left, self._left_at_home = self._left_at_home, []
        assert self._home is not None
        _settle_on(self._home, None, left)

    def _leave_home(self, pools: Sequence[httpx.AsyncBaseTransport]) -> None:
        """The home loop's pools, which the Guard left: closed there, at once or after the last body read from
        them."""
        with self._lock:
            self._left_at_home.extend(pools)
            if self._home_streams:
                return
            left, self._left_at_home = self._left_at_home, []
        assert self._home is not None
        _settle_on(self._home, None, left)

    async def close_left_at_home(self) -> None:
        """On the home loop, as the Guard closes: the home pools it left, with any body still read from them."""
        with self._lock:
            left, self._left_at_home = self._left_at_home, []
        await _close_all(left)

    def home_owns(self) -> bool:
        """Whether the Guard's connections are the home loop's (or no running loop's)."""
        owner = self._owner()
        return owner is None or owner is self._home


class HomeCall:
    """A sync call running on the home loop: it keeps the Guard there until it has handed its response over
    (`delivered`); its body is then read on at home, from the home's pools, until it has `ended`."""

    __slots__ = ("_delivered", "_owner")

    def __init__(self, owner: LoopOwner) -> None:
        self._owner = owner
        self._delivered = False

    def delivered(self) -> None:
        """The response is the caller's: the call sends nothing more (another loop may take the Guard over)."""
        if not self._delivered:
            self._delivered = True
            self._owner._delivered()

    def ended(self) -> None:
        """The call's task is over (once)."""
        self._owner._ended(self._delivered)


class Handed:
    """A sync call handed to the owner loop from another thread: it starts there (`LoopOwner.as_guest`) or, the
    loop taken for blocked first, is refused there for good (`LoopOwner.leave_blocked_loop`); never both."""

    __slots__ = ("_owner", "loop", "refused", "since", "started")

    def __init__(self, owner: LoopOwner, loop: EventLoop) -> None:
        self._owner = owner
        self.loop = loop
        self.since = time.monotonic()
        self.started = False
        self.refused = False

    def given_up(self) -> bool:
        """From its waiting thread: True if it has waited `BLOCKED_AFTER` unstarted and is refused on its loop now
        (`LoopOwner.leave_blocked_loop`): it is to be sent where the Guard runs."""
        if self.started or time.monotonic() - self.since < BLOCKED_AFTER:
            return False
        return self._owner.leave_blocked_loop(self)


class LoopEnded(GuardClosed):
    """A sync call's run on an event loop of the caller's ended before its response arrived, as that loop ended (or
    the Guard left it): nothing was handed over, so the sync edge sends the call again where the Guard runs now."""


class OwnerRuns(LoopEnded):
    """A sync call came to the Guard's own loop while the owner loop was stopped for a moment, and it runs again:
    nothing was sent; the sync edge sends the call again, to run on that loop."""


async def _end_guests(guests: set[object]) -> None:
    """Cancel the sync calls still running on an ending asyncio loop, and wait for them to close their connections
    (a trio run has cancelled its system tasks, these among them, before it ends its async generators)."""
    tasks = [task for task in guests if isinstance(task, asyncio.Task) and not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=GUESTS_END_WITHIN)


async def _close_all(pools: Sequence[httpx.AsyncBaseTransport]) -> None:
    for pool in pools:
        try:
            await pool.aclose()
        except Exception:  # e.g. a connection the server reset: the others are still closed
            logger.debug("closing a connection pool its event loop no longer uses", exc_info=True)


def _settle_on(loop: EventLoop, watch: AsyncGenerator[None] | None, pools: Sequence[httpx.AsyncBaseTransport]) -> None:
    """End ``watch`` and close ``pools`` on ``loop``, a loop the Guard left (the home loop, or one that ended or
    stopped), once it runs (dropped if it never does again: its connections then go as a plain client's would)."""

    async def settle() -> None:
        with anyio.CancelScope(shield=True):  # the loop may be ending: the connections are closed all the same
            if watch is not None:
                await watch.aclose()
            await _close_all(pools)

    try:
        start_soon(settle, loop)
    except RuntimeError:  # closed in between
        logger.debug("a loop the Guard left closed before its connection pools could be closed there")
