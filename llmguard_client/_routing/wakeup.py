"""Wakes the calls waiting for a cool-down when it changes before they would look again.

A first attempt waiting for the one cooling replica left sleeps until that cool-down's probe or end
(`llmguard_client._routing.cooldown.first_wait`); a served probe ends the cool-down early and a refused one
renews it, and the waiting calls must learn of it then: the served probe lets them go at once, the renewed
cool-down may no longer fit their deadline. Each waiter waits on an event of its own, created in its own
task, so nothing here outlives the call that waits.
"""

from __future__ import annotations

import anyio

__all__ = ["Wakeup"]


class Wakeup:
    """The calls waiting for a change (`wait`), woken together by `notify`. Touched from one event loop."""

    def __init__(self) -> None:
        self._waiting: list[anyio.Event] = []

    async def wait(self, seconds: float) -> None:
        """Until the next `notify`, at most ``seconds``."""
        event = anyio.Event()
        self._waiting.append(event)
        try:
            with anyio.move_on_after(seconds):
                await event.wait()
        finally:
            if not event.is_set():
                self._waiting.remove(event)

    def notify(self) -> None:
        """Wake every call waiting now."""
        waiting, self._waiting = self._waiting, []
        for event in waiting:
            event.set()
