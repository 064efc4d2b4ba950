"""The fleet store's own timeouts, counted in the time its event loop ran: `RunningDeadline`.

A Redis answer cannot be late while nobody was waiting for it. A loop kept for the process and run once per
invocation (``loop.run_until_complete``: Mangum on AWS Lambda, a job runner) is stopped between its runs, and a
frozen process's loop stands still; a timeout on the monotonic clock (``anyio.fail_after``, redis-py's socket
timeouts) runs out meanwhile, and the next run failed the operation then in flight though its answer had come: the
store degraded, and in short invocations it never reconnected (each new connection in flight as a run ended
timed out on the next), so such a worker did not follow the fleet's kill switch.

A `RunningDeadline` counts its time in steps of at most `STEP`: a step whose timer ran more than a step late (the
loop did not run when it was due: stopped, frozen, or held that long by a callback) is not counted. On a running
loop every step comes in time and it expires after its ``seconds``, as ``anyio.fail_after`` does, so an outage
is found as fast. Only the store's waits for Redis use it: its intervals (the heartbeat's, the rollout flag's
poll, the reconnection backoff) count the real time, so that the first run after a long stop pings Redis and
reads what is due at once.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

import anyio

__all__ = ["STEP", "RunningDeadline"]

STEP = 0.1
"""Seconds between two checks of a deadline (a shorter deadline is one step): a check more than a step late
means the loop was not running."""


class RunningDeadline:
    """``with RunningDeadline(seconds):`` raises `TimeoutError` once the block has waited ``seconds`` s of the
    loop's running time (see the module docstring). Asyncio only, as the fleet store is."""

    __slots__ = ("_counted", "_due", "_expired", "_loop", "_mark", "_scope", "_step", "_timer", "elapsed", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.elapsed = 0.0
        """The running time the block took (set as it ends)."""
        self._step = min(seconds, STEP)
        self._counted = 0.0
        self._expired = False
        self._scope = anyio.CancelScope()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._mark = self._due = 0.0

    def __enter__(self) -> RunningDeadline:
        self._loop = asyncio.get_running_loop()
        self._scope.__enter__()
        self._mark = self._loop.time()
        self._arm()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        assert self._loop is not None and self._timer is not None
        self._timer.cancel()
        self.elapsed = self._counted + self._since_mark(self._loop.time())
        caught = self._scope.__exit__(exc_type, exc, tb)
        if self._expired and self._scope.cancelled_caught:
            raise TimeoutError
        return bool(caught)

    def _arm(self) -> None:
        assert self._loop is not None
        self._due = self._mark + min(self._step, self.seconds - self._counted)
        self._timer = self._loop.call_at(self._due, self._check)

    def _check(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        self._counted += self._since_mark(now)
        self._mark = now
        if self._counted >= self.seconds:
            self._expired = True
            self._scope.cancel()
        else:
            self._arm()

    def _since_mark(self, now: float) -> float:
        """The time since the last check, if the loop ran through it (its timer, due at ``_due``, not more than a
        step late at ``now``); else none of it."""
        return now - self._mark if now - self._due <= self._step else 0.0
