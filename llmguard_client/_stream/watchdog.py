"""Stall and total limits of a live stream with one lazily re-armed timer instead of a cancel scope per read.

A streamed answer is read chunk by chunk, tens of times a second; bounding each read with its own cancel
scope costs a scope, a timer and their bookkeeping per chunk, the largest per-chunk cost the guard would
have (docs/benchmarks.md, "Per-chunk cost of a guarded stream"). Where the call's time
source has timers that need no task (`llmguard_client._core.clock.TimeSource.loop_timers`: asyncio's loop
timers), over a plain HTTP/1.1 socket, `ReadWatchdog` does the same job with one timer per stall period:
each read only stamps
the time it started; the timer, when it fires, re-arms itself for ``read start + stall`` (or the total
deadline) if the current read is younger than that, and otherwise shuts the socket down, which ends the
pending read at once with a transport error (the server sees the disconnect). The body then reports the
stall, total deadline or abort the watchdog recorded in ``tripped``.

Elsewhere (trio, HTTP/2, where one socket carries other streams, or a transport without a socket) the body
keeps one cancel scope per read: `for_response` returns None. So does uvloop, whose socket object cannot be
shut down.

All times here are on the call's clock (``TimeSource.now``); the time source puts its timers on the loop.
"""

from __future__ import annotations

import contextlib
import functools
import math
import socket
import weakref
from asyncio.trsock import TransportSocket
from typing import Literal

import httpx

from llmguard_client._core.clock import LoopTimers, TimerHandle, TimeSource

Trip = Literal["stall", "total", "abort"]


class ReadWatchdog:
    """Bounds each read of one stream by ``stall`` seconds and by an absolute ``total_at`` (on ``timers.now``)."""

    __slots__ = ("_now", "_socket", "_stall", "_timer", "_timers", "_total_at", "reading", "since", "tripped")

    def __init__(self, timers: LoopTimers, sock: Shuts, stall: float, total_at: float) -> None:
        self._timers = timers
        self._now = timers.now  # read once per chunk: time.monotonic itself on asyncio's own loops
        self._socket = sock
        self._stall = stall
        self._total_at = total_at
        self._timer: TimerHandle | None = None
        self.since = 0.0
        """When the current (or last) read started."""
        self.reading = False
        self.tripped: Trip | None = None
        """Why the stream was interrupted, once it was."""

    @classmethod
    def for_response(
        cls, response: httpx.Response, stall: float, total_at: float, time_source: TimeSource
    ) -> ReadWatchdog | None:
        """A watchdog over ``response``'s socket, or None where a cancel scope per read must do."""
        timers = time_source.loop_timers()
        if timers is None:
            return None
        sock = _http11_socket(response)
        if sock is None:
            return None
        return cls(timers, sock, stall, total_at)

    def rebind(self, response: httpx.Response) -> bool:
        """Watch ``response`` (a continuation's) instead; False if it has no socket to watch."""
        sock = _http11_socket(response)
        if sock is None or self.tripped == "abort":
            return False
        self._socket = sock
        self.tripped = None
        return True

    def start_read(self) -> None:
        """A read begins (only while nothing `tripped`): it may last ``stall`` seconds, and not past the
        total deadline."""
        self.since = self._now()
        self.reading = True
        if self._timer is None:
            self._rearm()

    def end_read(self) -> float:
        """The read ended: the seconds it waited."""
        self.reading = False
        return self._now() - self.since

    def _check(self) -> None:
        self._timer = None
        if not self.reading or self.tripped is not None:
            return  # the next read re-arms the timer
        if self._now() < self._due():
            self._rearm()
            return
        # Confirm one loop pass later: bytes that arrived while the loop was busy have woken the reading
        # task by then (its wake-up was queued before this), so the client's own lag is not a stall.
        self._timer = self._timers.call_soon(functools.partial(self._confirm, self.since))

    def _confirm(self, since: float) -> None:
        self._timer = None
        if not self.reading or self.tripped is not None or self.since != since:
            if self.reading and self.tripped is None:  # a new read began meanwhile: watch it
                self._rearm()
            return
        self._interrupt("stall" if since + self._stall <= self._total_at else "total")

    def _due(self) -> float:
        """When the current read overruns: ``stall`` after it began, or the total deadline if sooner."""
        return min(self.since + self._stall, self._total_at)

    def _rearm(self) -> None:
        due = self._due()
        if due != math.inf:
            self._timer = self._timers.call_at(due, self._check)

    def cancel(self) -> None:
        """End the stream from outside (``Guard.aclose``): the pending or next read fails at once."""
        if self.tripped is None:
            self._interrupt("abort")

    def close(self) -> None:
        """The stream ended: drop the timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _interrupt(self, why: Trip) -> None:
        self.tripped = why
        self.close()
        with contextlib.suppress(OSError):  # already closed by the peer or by us
            self._socket.shutdown(socket.SHUT_RDWR)


Shuts = socket.socket | TransportSocket
_SHUTS_DOWN = (socket.socket, TransportSocket)
"""Sockets whose ``shutdown`` interrupts a read: a plain one, and asyncio's wrapper of one. uvloop's
``PseudoSocket`` raises ``TypeError`` there, so a uvloop connection is read with a cancel scope per read."""

_sockets: weakref.WeakKeyDictionary[object, Shuts | None] = weakref.WeakKeyDictionary()
"""Each pooled connection's socket, looked up once (anyio builds every extra attribute, with a
``getpeername`` call, on each lookup) and forgotten with the connection."""


def _http11_socket(response: httpx.Response) -> Shuts | None:
    """The socket under an HTTP/1.1 response read on asyncio, if there is one to shut down."""
    extensions = response.extensions
    if extensions.get("http_version") != b"HTTP/1.1":
        return None
    stream = extensions.get("network_stream")
    try:
        return _sockets[stream]
    except (KeyError, TypeError):  # not seen yet, or a stream that takes no weak reference
        pass
    get_extra_info = getattr(stream, "get_extra_info", None)
    sock = get_extra_info("socket") if get_extra_info is not None else None
    found = sock if isinstance(sock, _SHUTS_DOWN) else None
    with contextlib.suppress(TypeError):
        _sockets[stream] = found
    return found
