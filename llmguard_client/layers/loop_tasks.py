"""Hedge tasks on asyncio without a task group.

Most hedged rounds never start a hedge (the first token comes before the delay), yet entering and leaving an
anyio task group costs two cancel scopes and a loop pass on exit, even when the group stayed empty (about a
tenth of the guard's own CPU per call, measured in instructions). On asyncio a round therefore starts its
hedges as loop tasks, which `LoopTasks` keeps structured by hand: each runs under its own cancel scope,
`cancel` cancels them all, and `join` waits (shielded) until every one has finished and re-raises the first
error one of them ended with, as a task group would. Off asyncio the round uses a task group.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import anyio


class LoopTasks:
    """Tasks started on one asyncio loop, each under its own cancel scope, joined before the round returns."""

    __slots__ = ("_done", "_error", "_loop", "_on_error", "_scopes", "_tasks")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_error: Callable[[], None]) -> None:
        self._loop = loop
        self._on_error = on_error
        """Called when a task ends with an error (the round then stops, as a task group's host would be cancelled)."""
        self._scopes: set[anyio.CancelScope] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # strong references: the loop keeps only weak ones
        self._done: anyio.Event | None = None
        self._error: BaseException | None = None

    def start_soon(self, run: Callable[..., Awaitable[None]], *args: object) -> None:
        """Start ``run(*args)`` in a new task now (also from a loop callback, outside any task)."""
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        task = self._loop.create_task(self._run(scope, run, args))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel(self) -> None:
        for scope in self._scopes:
            scope.cancel()

    async def join(self) -> None:
        """Wait until every task has finished (shielded from cancellation: nothing outlives the round), then
        re-raise the first error a task ended with."""
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
            with scope:
                await run(*args)
        except BaseException as exc:  # kept for join(), which re-raises it in the round's own task
            if self._error is None:
                self._error = exc
                self._on_error()
        finally:
            self._scopes.discard(scope)
            if not self._scopes and self._done is not None:
                self._done.set()
