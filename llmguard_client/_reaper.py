"""Closing a connection from a garbage collector's finalizer, where nothing can be awaited.

When a caller drops a guarded response without closing it, its lease is released
synchronously by a `weakref.finalize` callback (counts, slots, tickets, the record), but
the upstream connection needs an ``await`` to close. `current_spawner` captures, while a
call runs, a thread-safe way to start that close later on the same event loop: a task on
asyncio, a system task on trio. A loop that has already stopped closed its sockets itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import sniffio

Spawner = Callable[[Callable[[], Awaitable[None]]], None]
_PENDING: set[asyncio.Task[None]] = set()  # strong references until the closes finish


def current_spawner() -> Spawner:
    """A spawner bound to the running event loop (asyncio or trio)."""
    if sniffio.current_async_library() == "trio":
        import trio

        token = trio.lowlevel.current_trio_token()

        def spawn_trio(close: Callable[[], Awaitable[None]]) -> None:
            async def run() -> None:
                await close()

            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(lambda: trio.lowlevel.spawn_system_task(run))

        return spawn_trio

    loop = asyncio.get_running_loop()

    def spawn_asyncio(close: Callable[[], Awaitable[None]]) -> None:
        async def run() -> None:
            await close()

        def start() -> None:
            task = loop.create_task(run())
            _PENDING.add(task)
            task.add_done_callback(_PENDING.discard)

        with contextlib.suppress(RuntimeError):  # a closed loop: its sockets went with it
            loop.call_soon_threadsafe(start)

    return spawn_asyncio
