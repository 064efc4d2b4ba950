"""The clock every layer reads: by default the event loop's own.

Deadlines, hedge delays, backoff and budgets all read one `Clock`, and every wait is an
anyio sleep or cancel scope, which run on the event loop's clock too. So a test can run
the whole request path in virtual time (trio's ``MockClock(autojump_threshold=0)``): a
hedge at exactly 0.200 s, a ttft deadline at exactly 1.000 s, in a few ms of wall time.

An injected clock must advance at the loop clock's rate (a fixed offset is fine): waits
are always computed as ``deadline - clock()`` seconds from now.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import anyio
import sniffio

Clock = Callable[[], float]
"""Seconds on a monotonic time line."""


def loop_clock() -> float:
    """The default clock: the running event loop's time; ``time.monotonic`` outside a loop
    (where asyncio's loop time is the same, e.g. for `Guard.snapshot` from sync code)."""
    try:
        return anyio.current_time()
    except RuntimeError:  # no running loop (sniffio's or anyio's NoEventLoopError, by version)
        return time.monotonic()


def loop_time_function() -> Clock:
    """The running loop's own time function, the time line of its cancel scopes and sleeps
    (about 15x cheaper per read than ``anyio.current_time``)."""
    if sniffio.current_async_library() == "asyncio":
        return asyncio.get_running_loop().time
    return anyio.current_time


def bind_clock(clock: Clock, loop_time: Clock) -> Clock:
    """``clock`` for use within one call: the default resolves to ``loop_time``."""
    return loop_time if clock is loop_clock else clock


def loop_deadline(call_clock: Clock, loop_time: Clock, deadline: float) -> float:
    """``deadline`` (on ``call_clock``) as a cancel scope deadline, on the loop's time line."""
    if call_clock is loop_time:
        return deadline
    return loop_time() + max(0.0, deadline - call_clock())
