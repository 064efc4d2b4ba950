"""Which event loop serves a Guard's sync calls: the running asyncio loop of the caller's that owns the Guard
(its calls come from other threads: a web app's sync handlers beside its async ones), else the Guard's own loop
thread, started on first use and stopped with the Guard.

A process forked while a loop owned the Guard (this thread's, or a caller's loop still running: gunicorn
``--preload``, a prefork worker pool, ``multiprocessing`` with fork) runs neither: its sync calls would wait for it
for ever. In the child such a Guard refuses every sync call at once (`LoopOwner.forked`), and closing it closes
nothing (its connections are the parent's, still in use there).
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
import httpx

from llmguard_client._core.event_loops import run_threadsafe, running_loop
from llmguard_client._core.forks import in_forked_child
from llmguard_client._core.given_up import CALLER_EXTENSION
from llmguard_client._core.loop_owner import BLOCKS_ITS_LOOP, FORKED, HomeCall, LoopEnded, OwnerRuns
from llmguard_client._http.upload import rereadable
from llmguard_client.edges._runner import CLOSED, CallersLoop, LoopAccess, SyncBody, SyncRunner, send, wait_for
from llmguard_client.errors import GuardClosed, GuardUnavailable, WrongEventLoop

if TYPE_CHECKING:
    from llmguard_client.edges._client_calls import SyncClientCalls
    from llmguard_client.edges._guard_handle import GuardHandle


MOVES = 3
"""How many times one sync call is sent again because the event loop it ran on ended first."""
LEFT_WAIT = 1.0
"""Seconds a sync call whose loop cancelled it waits for the Guard to leave that loop before it is sent again."""


class _Closed:
    __slots__ = ("closer", "done", "why")

    def __init__(self, why: str, done: threading.Event | None = None) -> None:
        self.why = why
        self.done = done
        """Set once the close that refuses the calls has ended (None: it has)."""
        self.closer = threading.get_ident()
        """The thread running that close: a call it makes meanwhile (a signal handler's) must not wait for it."""

    def refuse(self) -> GuardClosed:
        """The refusal of a sync call, once the close has ended: a call made meanwhile waits for that (blocked, not
        competing for the GIL with the close's threads: callers refused at once and calling again at once, from
        many threads, held the GIL from the loop thread closing the pools for seconds)."""
        # A loop's thread, or the one closing (a signal handler's call), is refused at once: its wait would not end.
        if self.done is not None and running_loop() is None and threading.get_ident() != self.closer:
            self.done.wait()
        return GuardClosed(self.why)


_CLOSED = _Closed(CLOSED)
_runners: weakref.WeakKeyDictionary[GuardHandle, SyncRunner | _Closed] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _new_lock_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread of the parent may have held it at the fork


in_forked_child(_new_lock_in_child)


def send_sync(
    guard: GuardHandle, request: httpx.Request, calls: SyncClientCalls | None = None
) -> tuple[httpx.Response, SyncBody]:
    """Run a sync call where `sync_access` says, named as this thread's (an SDK's retry of it comes from here). A
    call whose run on an event loop of the caller's ended with that loop before its response arrived (a task queue
    running each task in ``asyncio.run``) is sent again where the Guard runs next, if its body can be read again.
    ``calls``: those of the client making it, whose close ends it."""
    request.extensions[CALLER_EXTENSION] = f"thread:{os.getpid()}:{threading.get_ident()}"
    moves = 0
    for tries in itertools.count(1):
        access, home = sync_access(guard, request)
        try:
            return send(access, guard.transport, request, home, calls)
        except LoopEnded as ended:
            moves += not isinstance(ended, OwnerRuns)  # that one sent nothing: it only missed the owner loop
            if not rereadable(request.stream):
                why = f"{ended}; it was not sent again: its request body (an iterator's) can be read only once"
                raise GuardClosed(why, request=request) from ended
            if moves > MOVES or tries > 3 * MOVES or access.loop is None:
                raise GuardClosed(f"{ended}; it was sent again {max(moves - 1, 0)} time(s)", request=request) from ended
            guard.transport.loops.wait_left(access.loop, LEFT_WAIT)  # the loop is ending: the Guard leaves it soon
    raise AssertionError("unreachable")  # pragma: no cover


def sync_access(
    guard: GuardHandle, request: httpx.Request | None = None, *, holds: bool = True
) -> tuple[LoopAccess, HomeCall | None]:
    """Where a sync call (or the sync server-hints poller) runs: on the caller's running event loop that owns the
    Guard, from another thread; else on the Guard's own loop thread, where a call (``holds``) keeps the Guard (no
    other loop takes it over) until the returned `HomeCall` says it has handed its response over. From the owner
    loop's own thread (which the call blocks) the Guard first leaves that loop for its own, if nothing is in flight
    there; else it is refused: the call would wait for the loop it blocks."""
    loops = guard.transport.loops
    if loops.forked:  # in a child forked while a loop owned the Guard: that loop stayed in the parent
        raise GuardClosed(CLOSED if guard.transport.closed else FORKED, request=request)
    owner = loops.sync_loop(holds)
    if owner is not None and running_loop() is owner:
        if not loops.leave_blocked_owner():
            raise WrongEventLoop(BLOCKS_ITS_LOOP, request=request)
        owner = loops.sync_loop(holds)
        if owner is not None:  # another loop took the Guard in between
            return CallersLoop(owner, loops), None
    if owner is None:
        home = loops.home_call() if holds else None
        try:
            return runner_for(guard), home
        except BaseException:
            if home is not None:
                home.ended()
            raise
    return CallersLoop(owner, loops), None


def runner_for(guard: GuardHandle) -> SyncRunner:
    """The Guard's event-loop thread for sync calls, started on first use. The thread is started outside the lock:
    a process gevent patched after importing this module has a real lock here, and a greenlet holding it while
    ``Thread.start`` waits for the new greenlet would block every other one. A thread or loop that could not start
    (the process out of threads or file descriptors) is not kept: its callers get a connection error
    (`SyncRunner.ready`), and the next call starts another."""
    with _lock:
        runner = _runners.get(guard)
    abandon = None
    if runner is None:
        fresh = SyncRunner(guard.transport, name=f"llmguard-sync-{id(guard):x}")
        with _lock:
            runner = _runners.get(guard)
            if runner is None:
                runner = _runners[guard] = fresh
                # A Guard dropped without close(): close its pools on that loop if they are its, and stop the
                # thread (neither the runner, the loop owner nor the pools' aclose hold a reference to the Guard).
                # At the interpreter's exit it only stops the runner (`SyncRunner.left_to_exit`).
                loops = guard.transport.loops
                abandon = weakref.finalize(
                    guard, _abandon, runner, guard._replica_set.aclose, loops.home_owns, loops.close_left_at_home
                )
                abandon.atexit = False
        if runner is not fresh:  # another caller's came first
            fresh.stop()
    if isinstance(runner, _Closed):
        raise runner.refuse()
    try:
        home = runner.ready()
    except GuardUnavailable:
        _forget(guard, runner)
        if abandon is not None:
            abandon.detach()
        raise
    guard.transport.loops.set_home(home)  # by each caller: none goes on before the home is known
    return runner


def _forget(guard: GuardHandle, runner: SyncRunner) -> None:
    """``runner``, which could not start, is not the Guard's (unless another has replaced it, or a close has)."""
    with _lock:
        if _runners.get(guard) is runner:
            del _runners[guard]


def running_runner(guard: GuardHandle) -> SyncRunner | None:
    """The Guard's event-loop thread if one is running."""
    runner = _runners.get(guard)
    return runner if isinstance(runner, SyncRunner) and runner.running else None


async def stop_sync_runner(guard: GuardHandle, grace: float = 0.0) -> bool:
    """Called first by ``Guard.aclose()``. If sync calls started the Guard's event-loop thread, close
    the Guard there (its pools belong to that loop), stop the thread and return True; the caller has
    nothing left to do. Otherwise (one that could not start included) mark the Guard closed for the sync edges and
    return False."""
    with _lock:
        runner = _runners.get(guard)
        if not isinstance(runner, SyncRunner) or runner.in_own_thread():
            if runner is None:
                _runners[guard] = _CLOSED
            return False
        _runners[guard] = _CLOSED
    loops = guard.transport.loops
    if not loops.home_owns():  # async code took the Guard over: it is closed there (the bodies still read here end)
        await anyio.to_thread.run_sync(runner.stop, loops.close_left_at_home)
        return False
    await anyio.to_thread.run_sync(runner.stop, functools.partial(guard.aclose, grace))
    return runner.loop is not None  # else it could not start (its first call is learning it): it closed nothing


def close_guard(guard: GuardHandle, grace: float = 0.0) -> None:
    """``Guard.close(grace)``: the same as ``await guard.aclose(grace)``, from sync code."""
    owner = None if _in_event_loop() else guard.transport.loops.sync_owner()
    if owner is not None:  # async code owns the Guard, on a loop still running: closed there
        wait_for(run_threadsafe(functools.partial(guard.aclose, grace), owner), owner)
        return
    runner = running_runner(guard)
    if runner is not None:
        closing = _Closed(CLOSED, threading.Event())
        with _lock:
            _runners[guard] = closing
        try:
            runner.stop(functools.partial(guard.aclose, grace))
        finally:
            with _lock:
                _runners[guard] = _CLOSED
            assert closing.done is not None
            closing.done.set()
        return
    if _in_event_loop():
        raise RuntimeError("Guard.close() was called from async code; use `await guard.aclose()` there")
    try:
        anyio.run(guard.aclose, grace)
    except RuntimeError as exc:
        if "closed" not in str(exc):
            raise
        raise RuntimeError(
            "this Guard's connections belong to an event loop that has already ended, so Guard.close() "
            "cannot close them; close the Guard in that loop (`await guard.aclose()`, or `async with Guard(...)`)"
        ) from exc


def _in_event_loop() -> bool:
    return running_loop() is not None


def _abandon(
    runner: SyncRunner,
    close_pools: Callable[[], Awaitable[None]],
    home_owns: Callable[[], bool],
    close_left: Callable[[], Awaitable[None]],
) -> None:
    if not runner.running or runner.left_to_exit():  # exiting: the thread stops with the process
        runner.orphan()
        return
    closing = close_pools if home_owns() else close_left  # else they are another loop's, closed as it ends
    if runner.in_own_thread():  # collected on its own loop: stop it from another thread
        threading.Thread(target=runner.stop, args=(closing,), daemon=True).start()
    else:
        runner.stop(closing)
