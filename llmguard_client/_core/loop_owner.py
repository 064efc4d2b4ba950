"""The one asyncio event loop a Guard's connections belong to at a time, and the Guard's move to the next.

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
connections unclosed; the next loop to call drops them, as an httpx client's would be dropped. Calls outside
asyncio (trio) are not checked.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import AsyncGenerator, Callable, Sequence

import httpx

logger = logging.getLogger("llmguard_client")

WRONG_LOOP = (
    "this Guard's connections belong to another event loop, which is still running (e.g. two threads each "
    "running asyncio.run); use one Guard per running event loop (build it inside that loop: `async with "
    "Guard(...)`), or the Guard's sync clients (guard.sync_http_client(), guard.sync_httpx2_client()), which "
    "serve every thread from one loop"
)

SwapPools = Callable[[], Sequence[httpx.AsyncBaseTransport]]
"""Give the Guard new connection pools and return the old ones (to close, or to drop)."""


class LoopOwner:
    """Which running asyncio loop may use the Guard's connections now."""

    __slots__ = ("_lock", "_loop", "_released", "_swap", "_watch")

    def __init__(self, swap_pools: SwapPools) -> None:
        self._swap = swap_pools
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._watch: AsyncGenerator[None] | None = None
        """Parked in the owner loop until it ends (see the module's docstring)."""
        self._released = True
        """Whether the owner's pools were swapped out as it ended (True before any loop owned them)."""
        self._lock = threading.Lock()

    def owns(self) -> bool:
        """Whether the running loop may make a call without claiming (it owns the Guard, or is not asyncio)."""
        loop = asyncio._get_running_loop()
        owner = self._loop
        return loop is None or (owner is not None and owner() is loop)

    async def claim(self) -> str | None:
        """Make the running loop the owner if no other loop runs with the Guard's connections; else why not."""
        loop = asyncio.get_running_loop()
        with self._lock:
            owner = self._loop() if self._loop is not None else None
            if owner is loop:
                return None
            if owner is not None and not owner.is_closed():
                return WRONG_LOOP
            self._loop = weakref.ref(loop)
            stale = not self._released
            self._released = False
            self._watch = watch = self._until_loop_ends()  # the old one, if any, is dropped with its loop
        if stale:  # the old loop ended without finalizing: its connections cannot be closed, only dropped
            self._swap()
        await watch.__anext__()  # parked: the loop closes it as it ends
        return None

    async def _until_loop_ends(self) -> AsyncGenerator[None]:
        try:
            yield
        finally:
            self._released = True
            for pool in self._swap():
                try:
                    await pool.aclose()
                except Exception:  # e.g. a connection the server reset: the others are still closed
                    logger.debug("closing a connection pool as its event loop ended", exc_info=True)
