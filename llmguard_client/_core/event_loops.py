"""The event loop a call runs on, asyncio's or a trio run's, as the loop owner and the sync edges see it.

An asyncio loop is used as it is. A trio run is a `TrioRun`, one object per run (kept in a run variable, so it
lives exactly as long as the run, as an asyncio loop object does), with the four methods of an asyncio loop
the guard uses (`EventLoop`); `run_threadsafe` starts a task on either from another thread, as
``asyncio.run_coroutine_threadsafe`` does, and `start_soon` one that starts when the loop next runs (a stopped
asyncio loop's included), made only then.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from time import monotonic as _monotonic  # read through a default argument (TrioRun.offset): never frozen
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class EventLoop(Protocol):
    """What the guard asks of a running event loop: asyncio's `AbstractEventLoop` has it all."""

    def is_closed(self) -> bool: ...

    def is_running(self) -> bool: ...

    def call_soon_threadsafe(self, callback: Callable[[], object], /) -> object: ...

    def time(self) -> float:
        """The loop's clock (from inside the loop)."""
        ...


_run_var: Any = None
"""The `trio.lowlevel.RunVar` holding each run's `TrioRun`, made on first use (trio is imported only if used)."""


def running_loop() -> EventLoop | None:
    """The event loop running in this thread (asyncio's, or a trio run), or None."""
    loop = asyncio._get_running_loop()  # the C fast path, as asyncio's own code uses
    if loop is not None:
        return loop
    trio = sys.modules.get("trio")
    if trio is None:
        return None
    try:
        token = trio.lowlevel.current_trio_token()
    except RuntimeError:  # not in a trio run
        return None
    global _run_var
    if _run_var is None:
        _run_var = trio.lowlevel.RunVar("llmguard_client.run")
    try:
        run: TrioRun = _run_var.get()
    except LookupError:
        run = TrioRun(token)
        _run_var.set(run)
    return run


def running_task() -> object | None:
    """The task running now (asyncio's, or trio's), or None outside one."""
    if asyncio._get_running_loop() is not None:
        return asyncio.current_task()
    trio = sys.modules.get("trio")
    if trio is None:
        return None
    try:
        task: object = trio.lowlevel.current_task()
    except RuntimeError:  # not in a trio run
        return None
    return task


def run_threadsafe(func: Callable[[], Awaitable[T]], loop: EventLoop) -> Future[T]:
    """Start ``func()`` as a task on ``loop`` from another thread; its future. ``RuntimeError`` if the loop has
    ended; the future is cancelled if the loop ends before the task does. The task starts in an empty context,
    as a trio system task does: none of the calling thread's variables (such as the one naming its async library,
    which ``anyio.run`` sets) is taken along."""
    if isinstance(loop, TrioRun):
        return loop.start(func)
    assert isinstance(loop, asyncio.AbstractEventLoop)
    future: Future[T] = Future()

    async def call() -> T:
        return await func()

    def start() -> None:  # the coroutine is made here, so a loop that closes first leaves none never awaited
        if future.cancelled():
            return
        task = loop.create_task(call())
        task.add_done_callback(functools.partial(_settle, future))
        future.add_done_callback(functools.partial(_cancel_with, loop, task))  # and the future holds the task

    loop.call_soon_threadsafe(start, context=contextvars.Context())
    return future


def _cancel_with(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any], future: Future[Any]) -> None:
    """A future cancelled by its caller cancels its task, as ``asyncio.run_coroutine_threadsafe``'s does."""
    if future.cancelled():
        with contextlib.suppress(RuntimeError):  # the loop has closed: the task ended with it
            loop.call_soon_threadsafe(task.cancel)


def _settle(future: Future[T], task: asyncio.Task[T]) -> None:
    """``future`` takes the outcome of ``task``, which ran for it on an asyncio loop."""
    if task.cancelled():
        future.cancel()
    if not future.set_running_or_notify_cancel():
        return
    error = task.exception()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(task.result())


_started_soon: set[asyncio.Task[Any]] = set()
"""Tasks `start_soon` started, held until done (a loop holds its tasks only weakly)."""


def start_soon(func: Callable[[], Awaitable[object]], loop: EventLoop) -> None:
    """Start ``func()`` as a task on ``loop`` when it next runs (from any thread, the loop's own included, running
    or stopped); nothing is made if it never runs again. ``RuntimeError`` if it has closed."""
    if isinstance(loop, TrioRun):
        loop.start(func)
        return
    assert isinstance(loop, asyncio.AbstractEventLoop)

    def start() -> None:
        async def call() -> None:
            await func()

        task = loop.create_task(call())
        _started_soon.add(task)
        task.add_done_callback(_started_soon.discard)

    loop.call_soon_threadsafe(start, context=contextvars.Context())


async def started_soon_ended(timeout: float) -> None:
    """Wait (at most ``timeout`` seconds) for the tasks `start_soon` started, or is about to start, on the running
    asyncio loop: a loop about to end lets them finish (they close a Guard's connections there) rather than cancel
    or drop them."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(0)  # a start queued by another thread makes its task now
    tasks = [task for task in _started_soon if task.get_loop() is loop]
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)


def _nothing() -> None:
    pass


class TrioRun:
    """One trio run, seen as an `EventLoop`."""

    __slots__ = ("__weakref__", "_clock", "_offset", "_token")

    def __init__(self, token: Any) -> None:
        import trio

        self._token = token
        self._clock: Callable[[], float] = trio.current_time
        self._offset: float | None = None

    def is_closed(self) -> bool:
        import trio

        try:
            self._token.run_sync_soon(_nothing)
        except trio.RunFinishedError:
            return True
        return False

    def is_running(self) -> bool:
        return not self.is_closed()

    def call_soon_threadsafe(self, callback: Callable[[], object], /) -> None:
        import trio

        try:
            self._token.run_sync_soon(callback)
        except trio.RunFinishedError as exc:
            raise RuntimeError("the trio run has ended") from exc

    def time(self) -> float:
        return float(self._clock())

    def offset(self, monotonic: Callable[[], float] = _monotonic) -> float:
        """What puts this run's clock on the monotonic time line, fixed at its first reading: trio starts each
        run's clock at a random point, so that nothing compares instants of two runs; a Guard used by one run
        after another keeps its state on one line (and a virtual clock still advances at its own rate)."""
        if self._offset is None:
            self._offset = monotonic() - float(self._clock())
        return self._offset

    def now(self) -> float:
        """This run's time on the monotonic time line (see `offset`)."""
        offset = self._offset
        if offset is None:
            offset = self.offset()
        return float(self._clock()) + offset

    def start(self, func: Callable[[], Awaitable[T]]) -> Future[T]:
        """`run_threadsafe` on this run: a system task (so that it does not belong to any of the caller's
        nurseries), cancelled with the run's end."""
        import trio

        future: Future[T] = Future()

        async def run() -> None:
            try:
                result = await func()
            except trio.Cancelled:  # the run is ending
                future.cancel()
                raise
            except BaseException as exc:
                future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                future.set_result(result)

        def spawn() -> None:
            try:
                trio.lowlevel.spawn_system_task(run)
            except RuntimeError:  # the run is ending ("Nursery is closed to new arrivals"): raised here, in trio's
                future.cancel()  # own callback, it would crash the caller's run with a TrioInternalError

        self.call_soon_threadsafe(spawn)
        return future
