"""A loop kept for the process and run once per invocation (``loop.run_until_complete``, as Mangum runs an AWS
Lambda handler), whose clock a test moves on while it is stopped: what a long stop between two invocations does to
its timers, without waiting it out."""

from __future__ import annotations

import asyncio


class KeptLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose `time` runs as the monotonic clock does, plus the time `stopped_for` added."""

    def __init__(self) -> None:
        super().__init__()
        self._moved = 0.0

    def time(self) -> float:
        return super().time() + self._moved

    def stopped_for(self, seconds: float) -> None:
        """Between two runs: ``seconds`` pass for the loop's timers, as if it had been stopped that long."""
        assert not self.is_running()
        self._moved += seconds
