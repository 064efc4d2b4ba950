"""The time source: the one place that knows which event loop the guard runs on.

Every timer of a call goes through a `TimeSource`, in the spirit of Polly's ``TimeProvider``:
``now``, the loop's time line for cancel scopes (`TimeSource.loop_deadline`), ``sleep_until``,
cancellable timers and tasks started under the call's lease (`TimeSource.tasks`). The layers
talk only to this interface; none of them imports ``asyncio`` or ``sniffio``.

Two implementations, selected once per call by `current_time_source`:

- `AsyncioTime`, for production's loop. Timers are loop timers (``loop.call_at``: no task, no
  cancel scope) and hedges are loop tasks joined by hand (`LoopTasks`), so a hedged round that
  starts no hedge enters no task group (entering and leaving an empty one on every call is a
  visible share of the guard's own CPU: docs/benchmarks.md, "Instructions per call").
  `AsyncioTime.loop_timers` also lets a stream's read watchdog (`llmguard_client._stream.watchdog`)
  keep one timer per stream.
- `AnyioTime`, for any other backend (trio): a timer is a sleeping task in the round's task group,
  tasks run in that group, and a stream's reads each get a cancel scope (no task-free timers).

Both run the same exact-instant tests in virtual time (tests/virtual.py: looptime on asyncio,
trio's ``MockClock``), so the path production runs is the one those tests cover.

The Guard's clock (``Guard(clock=...)``) may be injected: it must advance at the loop clock's rate
(a fixed offset is fine), since waits are computed as ``deadline - now()`` seconds from now.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, NoReturn, Protocol

import anyio
import sniffio
from anyio.abc import TaskGroup

from llmguard_client._core.event_loops import TrioRun, running_loop

if sys.version_info < (3, 11):  # anyio brings the backport there
    from exceptiongroup import BaseExceptionGroup  # type: ignore[import-not-found, unused-ignore]


class Owner(Protocol):
    """What owns a call's tasks (its `llmguard_client._core.lease.Owner`): whether it was aborted, and the
    cancel scopes its abort cancels. A protocol, since the lease itself is built on this module's time."""

    aborted: bool
    cancellables: set[Any]


Clock = Callable[[], float]
"""Seconds on a monotonic time line."""
Close = Callable[[], Awaitable[None]]
_PENDING: set[asyncio.Task[None]] = set()  # strong references to closes started by `spawn_threadsafe`


class Unfrozen:
    """The process's monotonic clock as it was at import: a library that freezes time in tests (freezegun)
    replaces ``time.monotonic`` in the time module and in every module attribute holding it, never in a class.
    The Guard's own event loop (the sync edges') tells time with it, so its timers fire whatever a test froze."""

    monotonic: Clock = staticmethod(time.monotonic)


def loop_clock() -> float:
    """The default clock: one time line whatever loop reads it, advancing at the running loop's rate. On an
    asyncio loop it is the loop's time (``time.monotonic`` on asyncio's own loops); on a trio run, whose clock
    starts at a random point each run, trio's clock plus an offset fixed at the run's first reading that puts
    it on ``time.monotonic``'s line, so that a Guard used by one run after another (a ``trio.run`` per test,
    or trio then asyncio) keeps its state on one line. Outside a loop (`Guard.snapshot` from sync code) the
    monotonic clock."""
    loop = asyncio._get_running_loop()
    if loop is not None:
        return asyncio_clock(loop)()
    run = running_loop()
    if run is None:
        return Unfrozen.monotonic()
    return run.now() if isinstance(run, TrioRun) else run.time()


def asyncio_clock(loop: asyncio.AbstractEventLoop) -> Clock:
    """``loop``'s clock, as the cheapest callable that reads it: asyncio's own loops tell time with
    ``time.monotonic``, read directly (about 15x cheaper than ``anyio.current_time``, and read once per streamed
    chunk by the watchdog); the Guard's own loop with `Unfrozen`'s."""
    loop_time = loop.time
    if loop_time is not Unfrozen.monotonic and type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop_time


class TimerHandle(Protocol):
    """A pending timer; `cancel` is idempotent and harmless after it fired."""

    def cancel(self) -> None: ...


class LoopTimers(Protocol):
    """Timers without a task (asyncio's loop timers); see `TimeSource.loop_timers`."""

    now: Clock

    def call_at(self, when: float, fn: Callable[[], None]) -> TimerHandle: ...

    def call_soon(self, fn: Callable[[], None]) -> TimerHandle: ...


class Tasks(Protocol):
    """Tasks and timers of one hedged round, all ended before ``async with`` exits (`TimeSource.tasks`)."""

    async def __aenter__(self) -> Tasks: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None: ...

    def start_soon(self, run: Callable[..., Awaitable[None]], *args: object) -> None:
        """Start ``run(*args)`` in a task of its own, cancelled by `cancel` and by the lease's abort."""

    def call_at(self, when: float, fn: Callable[[], None]) -> TimerHandle:
        """Call ``fn()`` at ``when`` (on `TimeSource.now`), unless cancelled first."""

    def cancel(self) -> None:
        """Cancel every task and timer started here (the ``async with`` exit still waits for them)."""


class TimeSource(ABC):
    """Now, the loop's time line, sleeps, timers and tasks for one call; see the module docstring."""

    __slots__ = ("_offset", "loop_time", "now")

    def __init__(self, now: Clock, loop_time: Clock, offset: float | None = None) -> None:
        self.now = now
        """The Guard's clock for this call: every deadline of the call is on it."""
        self.loop_time = loop_time
        """The loop's own time line (what cancel scope deadlines are on); ``now`` itself on asyncio's own loops."""
        self._offset = offset
        """``now() - loop_time()`` when it is fixed (the default clock), else None (read both)."""

    def loop_deadline(self, deadline: float) -> float:
        """``deadline`` (on `now`) as a cancel scope deadline, on the loop's time line."""
        if self._offset is not None:
            return deadline - self._offset
        return self.loop_time() + max(0.0, deadline - self.now())

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``deadline`` on `now`."""
        await anyio.sleep_until(self.loop_deadline(deadline))

    def loop_timers(self) -> LoopTimers | None:
        """Timers that need no task (asyncio), or None where a timer is a sleeping task (trio)."""
        return None

    @abstractmethod
    def tasks(self, lease: Owner, on_error: Callable[[], None]) -> Tasks:
        """Where a hedged round runs its hedges and its timer; ``on_error`` is called when a task ends
        with an error (the round then stops; the error is raised when the ``async with`` exits)."""

    @abstractmethod
    def spawn_threadsafe(self, close: Close) -> None:
        """Run ``close()`` soon on this call's loop, from any thread: a garbage collector's finalizer
        cannot await. A loop that has already stopped closed its sockets itself."""


def current_time_source(clock: Clock = loop_clock) -> TimeSource:
    """The time source of the running loop, with ``clock`` (the Guard's) as its `TimeSource.now`."""
    if sniffio.current_async_library() == "asyncio":
        return AsyncioTime(asyncio.get_running_loop(), clock)
    return AnyioTime(clock)


# --- what both implementations share -----------------------------------------------------


async def _run_leased(
    scope: anyio.CancelScope, lease: Owner, run: Callable[..., Awaitable[None]], args: tuple[object, ...]
) -> None:
    """Run ``run(*args)`` under ``scope``, registered with ``lease`` so that `Owner.abort`
    (``Guard.aclose``) cancels it at once, whatever task it runs in."""
    if lease.aborted:
        scope.cancel()
    lease.cancellables.add(scope)
    try:
        with scope:
            await run(*args)
    finally:
        lease.cancellables.discard(scope)


# --- asyncio: loop timers and loop tasks --------------------------------------------------


class AsyncioTime(TimeSource):
    """asyncio's loop directly: ``loop.call_at`` timers, hedges as loop tasks (`LoopTasks`)."""

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Clock = loop_clock) -> None:
        loop_time = asyncio_clock(loop)
        if clock is loop_clock:
            clock = loop_time
        super().__init__(clock, loop_time, 0.0 if clock is loop_time else None)
        self._loop = loop

    def loop_timers(self) -> LoopTimers:
        return self

    def call_at(self, when: float, fn: Callable[[], None]) -> TimerHandle:
        """Call ``fn()`` at ``when`` (on `now`) from the loop, outside any task."""
        return self._loop.call_at(self.loop_deadline(when), _as_asyncio, fn)

    def call_soon(self, fn: Callable[[], None]) -> TimerHandle:
        """Call ``fn()`` at the loop's next pass (after the callbacks already queued)."""
        return self._loop.call_soon(_as_asyncio, fn)

    def tasks(self, lease: Owner, on_error: Callable[[], None]) -> LoopTasks:
        return LoopTasks(self, lease, on_error)

    def spawn_threadsafe(self, close: Close) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: its sockets went with it
            self._loop.call_soon_threadsafe(self._start_close, close)

    def _start_close(self, close: Close) -> None:
        task = self._loop.create_task(_call(close))
        _PENDING.add(task)
        task.add_done_callback(_PENDING.discard)


def _as_asyncio(fn: Callable[[], None]) -> None:
    # A loop callback runs outside any task, where sniffio cannot tell the library; anyio asks it.
    token = sniffio.current_async_library_cvar.set("asyncio")
    try:
        fn()
    finally:
        sniffio.current_async_library_cvar.reset(token)


async def _call(close: Close) -> None:
    await close()


class LoopTasks:
    """A round's tasks on one asyncio loop, each under its own cancel scope, joined on exit.

    Kept structured by hand, as a task group would: `cancel` cancels them all, and the exit
    waits (shielded) until every one has finished, then re-raises the first error one of them
    ended with. Nothing is entered when the round starts no task."""

    __slots__ = ("_done", "_error", "_lease", "_on_error", "_scopes", "_tasks", "_time", "_timers")

    def __init__(self, time_source: AsyncioTime, lease: Owner, on_error: Callable[[], None]) -> None:
        self._time = time_source
        self._lease = lease
        self._on_error = on_error
        self._scopes: set[anyio.CancelScope] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # strong references: the loop keeps only weak ones
        self._timers: list[TimerHandle] = []
        self._done: anyio.Event | None = None
        self._error: BaseException | None = None

    async def __aenter__(self) -> LoopTasks:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cancel_timers()
        if self._scopes or self._error is not None:  # the usual round started no task: nothing to await
            await self.join()

    def start_soon(self, run: Callable[..., Awaitable[None]], *args: object) -> None:
        """Start ``run(*args)`` in a new task now (also from a loop timer, outside any task)."""
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        task = self._time._loop.create_task(self._run(scope, run, args))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def call_at(self, when: float, fn: Callable[[], None]) -> TimerHandle:
        handle = self._time.call_at(when, fn)
        self._timers.append(handle)
        return handle

    def cancel(self) -> None:
        self.cancel_timers()
        for scope in self._scopes:
            scope.cancel()

    def cancel_timers(self) -> None:
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()

    async def join(self) -> None:
        """Wait until every task has finished (shielded from cancellation: nothing outlives the round),
        then re-raise the first error a task ended with."""
        if self._scopes:
            self._done = anyio.Event()
            with anyio.CancelScope(shield=True):
                await self._done.wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    async def _run(
        self, scope: anyio.CancelScope, run: Callable[..., Awaitable[None]], args: tuple[object, ...]
    ) -> None:
        try:
            await _run_leased(scope, self._lease, run, args)
        except BaseException as exc:  # kept for join(), which re-raises it in the round's own task
            if self._error is None:
                self._error = exc
                self._on_error()
        finally:
            self._scopes.discard(scope)
            if not self._scopes and self._done is not None:
                self._done.set()


# --- any other backend: a task group, timers as sleeping tasks ------------------------------


class AnyioTime(TimeSource):
    """Any anyio backend (trio): a round's tasks and timers run in a task group."""

    __slots__ = ("_trio_token",)

    def __init__(self, clock: Clock = loop_clock) -> None:
        run = running_loop()
        if clock is not loop_clock:
            super().__init__(clock, anyio.current_time, 0.0 if clock is anyio.current_time else None)
        elif isinstance(run, TrioRun):
            super().__init__(run.now, anyio.current_time, run.offset())
        else:  # pragma: no cover - no other backend than trio
            super().__init__(anyio.current_time, anyio.current_time, 0.0)
        self._trio_token: Any = None
        if sniffio.current_async_library() == "trio":  # captured now: a finalizer may run in any thread
            import trio

            self._trio_token = trio.lowlevel.current_trio_token()

    def tasks(self, lease: Owner, on_error: Callable[[], None]) -> GroupTasks:
        return GroupTasks(self, lease)

    def spawn_threadsafe(self, close: Close) -> None:
        if self._trio_token is None:  # no other backend has a way in from another thread
            return
        import trio

        with contextlib.suppress(trio.RunFinishedError):
            self._trio_token.run_sync_soon(trio.lowlevel.spawn_system_task, _call, close)


class GroupTasks:
    """A round's tasks in an anyio task group (entered with the round); a timer is a sleeping task.
    A task's error cancels the group and is raised on exit, bare as `LoopTasks` raises it: the
    group is the guard's own, so it never changes the shape of what reaches the caller
    (`raise_bare`)."""

    __slots__ = ("_group", "_lease", "_started", "_time")

    def __init__(self, time_source: AnyioTime, lease: Owner) -> None:
        self._time = time_source
        self._lease = lease
        self._group: TaskGroup = anyio.create_task_group()
        self._started = False

    async def __aenter__(self) -> GroupTasks:
        await self._group.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        try:
            return await self._group.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            raise_bare(group)

    def start_soon(self, run: Callable[..., Awaitable[None]], *args: object) -> None:
        self._started = True
        self._group.start_soon(_run_leased, anyio.CancelScope(), self._lease, run, args)

    def call_at(self, when: float, fn: Callable[[], None]) -> TimerHandle:
        self._started = True
        scope = anyio.CancelScope()
        self._group.start_soon(self._sleep_then, scope, when, fn)
        return scope

    def cancel(self) -> None:
        if self._started:  # cancelling an empty task group still costs a loop pass
            self._group.cancel_scope.cancel()

    async def _sleep_then(self, scope: anyio.CancelScope, when: float, fn: Callable[[], None]) -> None:
        with scope:
            await self._time.sleep_until(when)
            fn()


def is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` is the running backend's cancellation, or an exception group holding nothing else: trio
    raises a cancellation from inside a nursery of a transport's own (its happy-eyeballs connect) wrapped in one,
    which no ``except Cancelled`` matches."""
    cancelled = anyio.get_cancelled_exc_class()
    if isinstance(exc, BaseExceptionGroup):
        return all(is_cancellation(e) for e in exc.exceptions)
    return isinstance(exc, cancelled)


def raise_bare(group: BaseExceptionGroup[BaseException]) -> NoReturn:
    """Raise the one error of a task group's ``group`` that would have reached the caller without it.

    Trio delivers a Ctrl-C (``KeyboardInterrupt``) to whichever task it finds, and a task group
    wraps whatever ends its tasks or its body in a group, which ``except KeyboardInterrupt`` no
    longer matches. Picked, as `LoopTasks` does on asyncio: a ``KeyboardInterrupt`` or
    ``SystemExit`` first (it must not be lost), then the first other error, then the first
    cancellation; each is raised as it was, with its own cause and context. A group raised by
    a task itself (one of ``group.exceptions``) is raised as it is, not unwrapped."""
    cancelled = anyio.get_cancelled_exc_class()
    errors = group.exceptions
    chosen = (
        next((e for e in errors if isinstance(e, (KeyboardInterrupt, SystemExit))), None)
        or next((e for e in errors if not isinstance(e, cancelled)), None)
        or errors[0]
    )
    context = chosen.__context__
    try:
        raise chosen
    finally:  # raised while handling the group, whose context Python would give it
        chosen.__context__ = context
        del chosen
