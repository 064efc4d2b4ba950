"""The one asyncio event loop a Guard's connections belong to at a time.

A connection pool opened on one event loop cannot be used from another: two threads each running
``asyncio.run`` with one Guard failed as "Connection error." over ``RuntimeError: ... bound to a different
event loop``, and a second ``asyncio.run`` after the first returned failed with ``RuntimeError: Event loop
is closed`` (the pool's kept connections belong to the ended loop). The first loop that makes a call owns
the Guard; a call from any other loop, while the owner runs or after it ended, is refused before anything
is sent, with the fix in the message. Calls outside asyncio (trio) are not checked.
"""

from __future__ import annotations

import asyncio
import weakref

WRONG_LOOP = (
    "this Guard's connections belong to another event loop ({state}, e.g. another asyncio.run); use one Guard "
    "per event loop (build it inside that loop: `async with Guard(...)`), or the Guard's sync clients "
    "(guard.sync_http_client(), guard.sync_httpx2_client()), which serve every thread from one loop"
)


class LoopOwner:
    """Which running asyncio loop may use the Guard's connections now."""

    __slots__ = ("_loop",)

    def __init__(self) -> None:
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None

    def claim(self) -> str | None:
        """None when the running loop may make a call (it owns the Guard, or is the first to call), else why not."""
        loop = asyncio._get_running_loop()
        if loop is None:  # not asyncio
            return None
        if self._loop is None:
            self._loop = weakref.ref(loop)
            return None
        owner = self._loop()
        if owner is loop:
            return None
        state = "still running" if owner is not None and not owner.is_closed() else "which has ended"
        return WRONG_LOOP.format(state=state)
