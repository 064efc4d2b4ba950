"""One lease per call: the single owner of everything the call acquired.

A call acquires a bulkhead slot, an in-flight count on each replica it tries, budget
tickets for its retries and hedges, and open upstream responses. Each acquisition is
registered on the call's `CallLease` the moment it is made, as a `Hold` (released
synchronously) or an owned response (closed asynchronously). Whoever finishes with a
piece early (a failed attempt, a lost hedge) releases it through the lease; whatever is
left is released by `CallLease.aclose`, exactly once, on every path:

- the transport, when the call ends before a response is handed over (error, deadline,
  caller cancel);
- the caller's body stream, when it completes, fails, times out or is closed;
- a `weakref.finalize` on that body stream, if the caller drops it unclosed;
- `Guard.aclose()`, which aborts every live lease (`abort`) and then closes it.

`abort` cancels every wait the call registered (`cancellables`): its phases, its body reads, and
the tasks its hedges run in (`llmguard_client._core.clock`: on every backend), so nothing of the call
goes on after ``Guard.aclose()``. A response that still arrives after the end is refused by `own`.

Lifetime::

    transport: lease = CallLease(...)          registry.add
      layers:  hold(slot) hold(in_flight) hold(ticket) own(response) ...
      win  ->  body stream holds the lease ... body done -> aclose(status)   -> finish(record)
      fail ->  transport aclose(status)                                       -> finish(record)
      GC   ->  close_from_gc(): holds released now, responses closed on the loop soon after
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType
from typing import Protocol

import anyio
import httpx

from llmguard_client._core.clock import TimeSource, current_time_source
from llmguard_client._core.event_loops import EventLoop, running_loop
from llmguard_client._http.http2_reset import reset_unfinished
from llmguard_client.errors import GuardClosed
from llmguard_client.telemetry.record import CallStatus

CLOSE_GRACE = 2.0
"""Seconds a shielded close of one response may take before it is abandoned."""

Finish = Callable[[CallStatus, "str | None"], None]


class Occupant(Protocol):
    """A replica as the lease counts it: its attempts in flight, and how one leaves."""

    in_flight: int

    def leave(self) -> None: ...


class Cancellable(Protocol):
    """A wait of the call that `CallLease.abort` ends: a cancel scope or a stream's read watchdog."""

    def cancel(self) -> None: ...


async def close_quietly(response: httpx.Response, reading: AsyncIterator[bytes] | None = None) -> None:
    """Close a response (and the iterator ``reading`` its body) under a shield, within `CLOSE_GRACE`,
    swallowing transport errors. A body read to its end (``reading`` an async generator that finished)
    is closed without the grace timer: that close waits on nothing (the connection goes back to its pool). An
    HTTP/2 stream the server may still be sending is reset first (over HTTP/1.1 the close itself tells the server)."""
    if reading is not None and getattr(reading, "ag_frame", reading) is None:  # finished: nothing to close
        reading = None
        deadline = math.inf
    else:
        deadline = anyio.current_time() + CLOSE_GRACE
    try:
        with (
            anyio.CancelScope(shield=True, deadline=deadline),
            contextlib.suppress(httpx.HTTPError, OSError, anyio.BrokenResourceError),
        ):
            await reset_unfinished(response)
            aclose = getattr(reading, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(RuntimeError):  # still running in a read that is being interrupted
                    await aclose()
            await response.aclose()
    except anyio.get_cancelled_exc_class():  # asyncio's Task.cancel() passes an anyio shield
        await _close_socket(response)  # the close it interrupted may not have reached the socket
        raise


async def _close_socket(response: httpx.Response) -> None:
    """Close ``response``'s connection itself (httpcore's network stream, where it has one): the server sees the
    disconnect, whatever the pool's own close got to. No wait: the socket's close comes before any await."""
    stream = response.extensions.get("network_stream")
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


def _no_finish(status: CallStatus, cause: str | None) -> None:
    return None


class Hold:
    """One acquisition that must be released once: by its user, or else by the lease."""

    __slots__ = ("_lease", "_release")

    def __init__(self, lease: CallLease, release: Callable[[], None]) -> None:
        self._lease: CallLease | None = lease
        self._release = release

    @property
    def released(self) -> bool:
        return self._lease is None

    def release(self) -> None:
        """Release it now (idempotent)."""
        lease, self._lease = self._lease, None
        if lease is not None:
            lease._holds.pop(self, None)
            self._release()

    def discharge(self) -> None:
        """Nothing is owed any more (e.g. a budget ticket was used): forget it without releasing."""
        lease, self._lease = self._lease, None
        if lease is not None:
            lease._holds.pop(self, None)


class Phase:
    """`CallLease.phase`: a cancel scope registered with the lease while it is entered."""

    __slots__ = ("_lease", "_scope")

    def __init__(self, lease: CallLease, scope: anyio.CancelScope) -> None:
        self._lease = lease
        self._scope = scope

    def __enter__(self) -> anyio.CancelScope:
        scope = self._scope.__enter__()
        if self._lease.aborted:
            scope.cancel()
        self._lease.cancellables.add(scope)
        return scope

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        self._lease.cancellables.discard(self._scope)
        return bool(self._scope.__exit__(exc_type, exc, tb))


class LeaseRegistry:
    """The live leases of one `Guard`: what ``aclose()`` aborts, what ``snapshot()`` counts; and the Guard's work
    beside its calls (`beside`), which ``aclose()`` ends as it begins."""

    def __init__(self) -> None:
        self.live: set[CallLease] = set()
        self.closed = False
        self._empty: anyio.Event | None = None
        self._beside: set[Beside] = set()

    def add(self, lease: CallLease) -> None:
        self.live.add(lease)

    def discard(self, lease: CallLease) -> None:
        self.live.discard(lease)
        if not self.live and self._empty is not None:
            self._empty.set()

    async def wait_empty(self, grace: float) -> None:
        """Wait until no call is live, at most ``grace`` seconds."""
        if not self.live or grace <= 0:
            return
        self._empty = anyio.Event()
        try:
            with anyio.move_on_after(grace):
                await self._empty.wait()
        finally:  # also when the close is cancelled meanwhile
            self._empty = None

    @contextlib.contextmanager
    def beside(self) -> Iterator[anyio.CancelScope]:
        """Run work of the Guard's own beside its calls inside (a server-hints poller): no call, counted nowhere,
        but sent through the Guard's pools. ``Guard.aclose`` cancels it as it begins (at once if it has: the
        scope, which ends quietly, is cancelled on entry) and waits for it to end before it closes the pools."""
        with anyio.CancelScope() as scope:
            work = Beside(scope, running_loop())
            if self.closed:
                scope.cancel()
            self._beside.add(work)
            try:
                yield scope
            finally:
                self._beside.discard(work)
                work.done.set()

    def end_beside(self) -> None:
        """Cancel the work beside the calls: on the running loop at once, on another loop through that loop (a
        scope is cancelled from its own thread only)."""
        here = running_loop()
        for work in list(self._beside):
            if work.loop is here or work.loop is None:
                work.scope.cancel()
            else:
                with contextlib.suppress(RuntimeError):  # that loop has closed: its work ended with it
                    work.loop.call_soon_threadsafe(work.scope.cancel)

    async def beside_ended(self, within: float) -> None:
        """Wait, at most ``within`` seconds, for the work beside the calls that runs on this loop to end (its
        requests closed); work on another loop ends there."""
        here = running_loop()
        with anyio.move_on_after(within):
            for work in [w for w in list(self._beside) if w.loop is here]:
                await work.done.wait()


class Beside:
    """One piece of work beside the calls (`LeaseRegistry.beside`): its scope, its loop, whether it has ended."""

    __slots__ = ("done", "loop", "scope")

    def __init__(self, scope: anyio.CancelScope, loop: EventLoop | None) -> None:
        self.scope = scope
        self.loop = loop
        self.done = anyio.Event()


class CallLease:
    """Owns a call's acquisitions; see the module docstring."""

    __slots__ = (
        "__weakref__",
        "_closed_event",
        "_closing",
        "_holds",
        "_registry",
        "_responses",
        "_time",
        "aborted",
        "cancellables",
        "closed",
        "finish",
    )

    def __init__(self, registry: LeaseRegistry, finish: Finish | None = None, time: TimeSource | None = None) -> None:
        self._registry = registry
        self.finish: Finish = finish or _no_finish
        """Called exactly once, last, with the call's final (status, cause)."""
        self._holds: dict[Hold, None] = {}
        self._responses: dict[httpx.Response, AsyncIterator[bytes] | None] = {}
        self.cancellables: set[Cancellable] = set()
        """The call's current waits, ended by `abort`."""
        self._time = time if time is not None else current_time_source()
        """The call's loop: where `close_from_gc` closes connections."""
        self._closing = False
        """`aclose` is closing the responses now."""
        self._closed_event: anyio.Event | None = None
        """Set when that close is done; made only if a second closer has to wait for it."""
        self.aborted = False
        """`Guard.aclose()` ended this call."""
        self.closed = False
        registry.add(self)

    # --- acquiring ------------------------------------------------------------------------

    def hold(self, release: Callable[[], None]) -> Hold:
        """Register an acquisition whose ``release`` the lease calls if nobody else does."""
        hold = Hold(self, release)
        if self.closed:  # acquired after the end (a late task): give it straight back
            hold.release()
        else:
            self._holds[hold] = None
        return hold

    def occupy(self, replica: Occupant) -> Hold:
        """Count one attempt in flight on ``replica`` (the one acquire site of in-flight counts): released by
        `end_attempt` when the attempt fails, loses or breaks, else at the end of the call."""
        replica.in_flight += 1
        return self.hold(replica.leave)

    async def end_attempt(self, in_flight: Hold, response: httpx.Response | None = None) -> None:
        """An attempt is done before the call is (it failed, lost a race, or broke mid-stream and was
        replaced): its response closed (shielded) and its in-flight count released, the one release site
        of in-flight counts besides the call's end."""
        try:
            if response is not None:
                await self.close_response(response)
        finally:
            in_flight.release()

    def own(self, response: httpx.Response, reading: AsyncIterator[bytes] | None = None) -> None:
        """The lease closes ``response`` (and ``reading``, the iterator over its body, once there is
        one) at the end unless `close_response` does it first.

        After the end (an answer that came in after ``Guard.aclose()`` closed the call) nobody would:
        raises `GuardClosed`, so the attempt fails and never wins, and closes it with `close_response`,
        as it closes any failed attempt's response."""
        self._responses[response] = reading
        if self.closed:
            raise GuardClosed("the call ended (the Guard was closed) before this answer arrived; it is closed")

    @property
    def guard_closed(self) -> bool:
        """The Guard this call runs in was closed (or is closing)."""
        return self._registry.closed

    def disown(self, response: httpx.Response) -> None:
        """``response`` is handed on (an error answer the caller reads to its end): the lease no longer closes it."""
        self._responses.pop(response, None)

    async def close_response(self, response: httpx.Response) -> None:
        """Close one owned response now (shielded)."""
        reading = self._responses.pop(response, None)
        await close_quietly(response, reading)

    def phase(self, deadline: float) -> Phase:
        """A cancel scope `abort` cancels, expiring at ``deadline`` (loop time, as anyio's): wraps
        every wait of the call (a bulkhead queue, attempts, backoff, body reads)."""
        return Phase(self, anyio.CancelScope(deadline=deadline))

    # --- ending ---------------------------------------------------------------------------

    def abort(self) -> None:
        """End the call from outside (``Guard.aclose``): every wait of it is cancelled."""
        self.aborted = True
        for scope in list(self.cancellables):
            scope.cancel()

    async def aclose(self, status: CallStatus, cause: str | None) -> None:
        """Close owned responses, release every hold, finish the record: once (later calls wait)."""
        if self.closed:
            if self._closing:  # another closer is still at it: wait for it to finish
                if self._closed_event is None:
                    self._closed_event = anyio.Event()
                with anyio.CancelScope(shield=True):
                    await self._closed_event.wait()
            return
        self.closed = self._closing = True
        try:
            while self._responses:  # each close is shielded: nothing here can be cancelled half-way
                response = next(iter(self._responses))
                await self.close_response(response)
        finally:
            try:
                self._release_all(status, cause)
            finally:  # even when the call's last act raised: a closer waiting for this one must not wait forever
                self._closing = False
                if self._closed_event is not None:
                    self._closed_event.set()

    def close_from_gc(self) -> None:
        """The caller dropped the body unclosed: release now, close connections on the loop soon."""
        if self.closed:
            return
        self.closed = True
        responses = list(self._responses.items())
        self._responses.clear()
        self._release_all("abandoned", "garbage_collected")
        if responses:

            async def close_all() -> None:
                for response, reading in responses:
                    await close_quietly(response, reading)

            self._time.spawn_threadsafe(close_all)

    def _release_all(self, status: CallStatus, cause: str | None) -> None:
        try:
            for hold in reversed(list(self._holds)):
                hold.release()
        finally:
            self._registry.discard(self)
            finish, self.finish = self.finish, _no_finish  # drop it: it refers back to the call
            finish(status, cause)
