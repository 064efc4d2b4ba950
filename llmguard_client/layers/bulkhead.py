"""Per-tier bulkhead: bounded calls in flight, a bounded waiting line, fast failure past both."""

from __future__ import annotations

import anyio

from llmguard_client._config import Bulkhead


class TierBulkhead:
    """Slots for one tier's calls. A slot is held from admission until the call's body is done."""

    def __init__(self, config: Bulkhead) -> None:
        self.config = config
        self._slots = anyio.Semaphore(config.max_in_flight)
        self.waiting = 0
        self.rejected = 0

    @property
    def in_flight(self) -> int:
        return self.config.max_in_flight - self._slots.value

    async def acquire(self) -> bool:
        """Take a slot, waiting in line if the line has room; False (at once) if it has none."""
        if self._slots.value == 0 and self.waiting >= self.config.max_waiting:
            self.rejected += 1
            return False
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        return True

    def release(self) -> None:
        self._slots.release()
