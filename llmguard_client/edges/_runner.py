"""One background event loop per Guard, for sync callers.

The request path is one async core (``guard.transport.handle_async_request``). A sync
edge runs it on a daemon thread that runs an asyncio loop, started on the first sync call and
shared by every sync client of that Guard (so all sync callers, from any number of threads,
share one set of pools, budgets and TTFT statistics). Calls are started there as on a caller's
own loop (`run_threadsafe`), with nothing that captured the thread functions at import time
(anyio's `BlockingPortal` does): a process that gevent monkey-patches after importing the
package (gunicorn ``--preload`` with gevent workers) is served like one patched first.

Each sync call is driven by ONE task on that loop, from the request to the end of the
body, so cancel scopes opened by the core never cross tasks:

- the caller's thread waits for the response head (status, headers);
- the body is read by the task at most `READ_AHEAD` chunks ahead of the caller (bounded
  back-pressure): the caller's thread takes chunks from a thread-safe queue and wakes the loop
  only when the task waits for room, not once per chunk;
- closing the body early cancels the task; it closes the upstream response under a
  shielded scope, so the server sees the disconnect, before ``close()`` returns;
- a body the caller drops unclosed cancels the task when it is garbage-collected, from whatever
  thread collects it (the loop's own included), without waiting for the loop;
- the caller's context variables (``guard.tier()``, ``guard.capture()``, the current
  OpenTelemetry span) are copied into the task.

``stop()`` closes the Guard on that loop (its pools belong there), cancels what is left
and joins the thread.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import functools
import importlib
import logging
import os
import queue
import selectors
import sys
import threading
import traceback
import weakref
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol

import anyio
import httpx

from llmguard_client._core.clock import Unfrozen
from llmguard_client._core.event_loops import EventLoop, run_threadsafe, running_loop, started_soon_ended
from llmguard_client._core.forks import catch_up_with_fork, in_forked_child
from llmguard_client._core.loop_owner import LEFT_BEHIND, LOOP_BLOCKED, Handed, HomeCall, LoopEnded, LoopOwner
from llmguard_client._rollout.passthrough import MeasuredStream
from llmguard_client._stream.body import GuardBody
from llmguard_client.edges._client_calls import SyncClientCalls, client_closed
from llmguard_client.errors import GuardClosed, GuardUnavailable, like_last_error

logger = logging.getLogger("llmguard_client")

CLOSED = "this Guard is closed; build a new Guard to send more requests"
"""Why a sync call is refused once the Guard closed."""
NOT_STARTED = "the Guard's event-loop thread for sync calls could not start"
"""Why a sync call failed whose Guard could not start that thread or its loop (out of threads or file descriptors)."""
JOIN_TIMEOUT = 10.0
"""Seconds ``stop()`` waits for the loop's thread to end."""
SETTLE_TIMEOUT = 5.0
"""Seconds ``stop()`` lets the tasks started on the loop to close connection pools there finish."""
LOOP_CHECK = 0.5
"""Seconds between two checks, while a sync caller waits, that the loop running its call has not closed (a loop
of the caller's own may end with the call in it)."""
READ_AHEAD = 16
"""Chunks the task may read before the caller's thread has taken them. One chunk at a time cost a wake of
the loop per chunk (a pipe write, an epoll return, a task switch) on top of the wake of the caller: the sync
path spent ~1.7x the async path's CPU per streamed call (`benchmarks/sync_cpu.py`)."""


class _End:
    __slots__ = ()


_END = _End()


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


_Item = bytes | _End | _Failed


class SyncBody:
    """The body of one sync call: iterate it for raw chunks, ``close()`` it when done (idempotent).

    The call's task on the loop holds the upstream response, and with it the call's lease, until it is told to
    end: a body the caller drops unclosed tells it when it is garbage-collected (`weakref.finalize`), as neither
    httpx nor httpx2 closes a response it collects, and an SDK's stream closes its response only once iterated."""

    def __init__(self, runner: LoopAccess, exchange: _Exchange) -> None:
        self._runner = runner
        self._exchange = exchange
        self._closed = False
        self._gc = weakref.finalize(self, _collected, runner, exchange)
        self._gc.atexit = False  # as a lease's: not at the interpreter's exit

    def __iter__(self) -> Iterator[bytes]:
        while not self._closed:
            item = self._exchange.next_item()
            if isinstance(item, _End):
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item

    def close(self) -> None:
        """End the call: from a plain thread, once the upstream response is closed (the server has seen the
        disconnect); from a thread that runs an event loop (a stream the caller dropped, collected there: the
        Guard's own loop, or an app's loop its sync calls run on), at once, the call's task told to end, as
        waiting there would block the very loop that must run it."""
        if self._closed:
            return
        self._closed = True
        self._gc.detach()
        if self._exchange.ended or not self._runner.running:
            return  # the call already closed its response, or the Guard's stop cancels it
        if running_loop() is not None:
            self._exchange.end_soon()
            return
        with contextlib.suppress(GuardClosed):  # the Guard is stopping right now: its stop closes the call
            self._runner.call(self._exchange.close)


def _collected(runner: LoopAccess, exchange: _Exchange) -> None:
    """A `SyncBody` dropped unclosed was collected, on any thread (the loop's own included): tell its call to end,
    without waiting for the loop (the call closes its response there, recorded ``garbage_collected``)."""
    if not exchange.ended and runner.running:
        exchange.end_soon(collected=True)


class _Exchange:
    """One sync call, driven by one task on the runner's loop.

    The task reads the body into a thread-safe queue, at most `READ_AHEAD` chunks ahead of the caller's
    thread, which takes them from the queue. Only when the window is full does the task wait, and only
    then does the caller's thread wake the loop (``call_soon_threadsafe``) after taking a chunk.
    """

    def __init__(
        self,
        core: CallCore,
        request: httpx.Request,
        head: Future[httpx.Response],
        loop: EventLoop,
        delivered: Callable[[], None] | None = None,
        guest: bool = False,
    ) -> None:
        self._core = core
        self._request = request
        self._head = head
        self._loop = loop
        self._delivered = delivered
        self._guest = guest
        """Run on an event loop of the caller's (`CallersLoop`), which may end before the call does."""
        """Told once the response is handed over (a call on the Guard's own loop: `HomeCall.delivered`)."""
        self._context = _portable(contextvars.copy_context())
        self._items: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._put_count = 0  # written by the task only
        self._taken = 0  # written by the caller's thread only
        self._pending: _End | _Failed | None = None  # the end, taken with the last chunks (the caller's thread)
        self._waiting_for_room = False
        self._room: anyio.Event | None = None
        self._ended = False
        self._scope: anyio.CancelScope | None = None
        self._done: anyio.Event | None = None
        self._cancelled = False
        self._collected = False
        """The caller's body was garbage-collected unclosed (set on the loop, before the task is cancelled)."""
        self._whole = False
        """The whole body was handed to the caller's thread with the response (`GuardBody.take_whole`)."""
        self._cut: Exception | None = None
        """What the caller gets now that its client was closed (`cut`), instead of its response or next chunk."""
        self._handed_end = False
        """The caller's thread has had the body's end (or its failure)."""

    def _left_unread(self) -> Exception:
        """What the caller gets after the chunks already read for it when the task ended before the body did: the
        Guard's close (the task waited for the caller to take them, so no read of the body raised it), or the end
        of the loop the call ran on."""
        if self._core.closed:
            return GuardClosed("the Guard was closed while this stream was being read; the connection was closed")
        if self._cancelled or not self._guest:
            return httpx.ReadError("the response was closed (the call ended)")
        return httpx.ReadError(
            "the event loop this sync call ran on (one of yours, which owned the Guard) ended while the body was read"
        )

    def unstarted(self, task: Future[Any]) -> None:
        """The call's task is over: if it ended without the call settling the response head, the call never ran
        (refused on a loop the Guard has left, `LoopEnded`: nothing was sent; or cancelled before it started), and
        the caller's thread, waiting for that head, is told so at once instead of waiting for ever."""
        if self._head.done():
            return
        error = None if task.cancelled() else task.exception()
        if self._cut is not None:  # its client was closed
            error = self._cut
        elif error is None and self._guest and not self._cancelled:  # the caller's loop is ending: sent again
            error = LoopEnded(LEFT_BEHIND)
        elif error is None:
            error = GuardClosed("the call was cancelled before it started")
        with contextlib.suppress(InvalidStateError):  # settled in between
            self._head.set_exception(error)

    async def drive(self) -> None:
        for var, value in self._context:
            var.set(value)
        self._done = anyio.Event()
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                if self._cancelled:
                    scope.cancel()
                await self._run()
        finally:
            if not self._ended:  # wake a reader still waiting: the call was closed or the loop stopped
                self._put(_END if self._whole else _Failed(self._left_unread()))
            self._done.set()

    async def _run(self) -> None:
        try:
            response = await self._core.handle_async_request(self._request)
        except anyio.get_cancelled_exc_class():
            if self._cut is not None:  # its client was closed
                self._head.set_exception(self._cut)
            elif self._guest and not self._cancelled:  # the caller's loop is ending: the call is sent again elsewhere
                self._head.set_exception(LoopEnded(LEFT_BEHIND))
            else:
                self._head.set_exception(GuardClosed("the call was cancelled before its response arrived"))
            raise
        except Exception as exc:  # the caller's thread raises it
            self._head.set_exception(exc)
            return
        try:
            stream = response.stream
            assert isinstance(stream, httpx.AsyncByteStream)
            whole = stream.take_whole() if isinstance(stream, GuardBody) else None
            self._head.set_result(response)
            if self._delivered is not None:
                self._delivered()
            if whole is not None:  # the caller has it all, whatever happens to the loop before the end is read
                self._whole = True
                if whole:
                    self._put(whole)
            chunks = stream.__aiter__()
            try:
                while True:
                    await self._wait_for_room()
                    item: _Item
                    try:
                        item = await chunks.__anext__()
                    except StopAsyncIteration:
                        item = _END
                    except Exception as exc:
                        item = _Failed(exc)
                    if not isinstance(item, bytes):
                        # Finish the call (its record is final) before the caller learns that it ended.
                        with anyio.CancelScope(shield=True):
                            await response.aclose()
                    self._put(item)
                    if not isinstance(item, bytes):
                        return
            finally:
                with anyio.CancelScope(shield=True):
                    if self._cancelled and isinstance(stream, GuardBody | MeasuredStream):
                        # Its read was cancelled here, for its caller's close (or drop): not a cancellation of theirs.
                        await stream.aclose(cause="garbage_collected" if self._collected else "closed_by_caller")
                    aclose = getattr(chunks, "aclose", None)
                    if aclose is not None:
                        await aclose()
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()

    async def _wait_for_room(self) -> None:
        """Wait while the caller's thread has `READ_AHEAD` chunks not yet taken."""
        while self._put_count - self._taken >= READ_AHEAD:
            self._room = anyio.Event()
            self._waiting_for_room = True
            if self._put_count - self._taken < READ_AHEAD:  # taken in between: the taker saw no waiter
                self._waiting_for_room = False
                return
            await self._room.wait()

    def _make_room(self) -> None:
        """On the loop: the caller's thread took a chunk while the task waited for room."""
        self._waiting_for_room = False
        if self._room is not None:
            self._room.set()

    @property
    def ended(self) -> bool:
        """The task handed over the body's end (or its failure), after closing the response."""
        return self._ended

    def _put(self, item: _Item) -> None:
        if not isinstance(item, bytes):
            self._ended = True
        self._put_count += 1
        self._items.put(item)

    def next_item(self) -> _Item:
        """From the caller's thread: every chunk queued, joined into one (waiting for the task to read one if
        none is), or the end. A caller behind the loop takes what piled up in one step: each chunk handed over
        alone cost the caller's thread a pass through the SDK's stream decoding and the GIL a switch."""
        if self._cut is not None:
            return self._end_with(_Failed(self._cut))
        if self._pending is not None:
            end, self._pending = self._pending, None
            return self._end_with(end)
        while True:
            try:
                item: _Item = self._items.get(timeout=LOOP_CHECK)
                break
            except queue.Empty:
                if self._cut is not None:
                    return self._end_with(_Failed(self._cut))
                if self._loop.is_closed():  # the loop ended without the task handing over the end
                    return self._end_with(
                        _Failed(GuardClosed("the event loop running this call ended while its body was read"))
                    )
        taken = 1
        if isinstance(item, bytes) and not self._items.empty():
            chunks: list[bytes] = [item]
            while not self._items.empty():
                following = self._items.get_nowait()
                taken += 1
                if not isinstance(following, bytes):
                    self._pending = following  # the end comes after the data before it
                    break
                chunks.append(following)
            item = b"".join(chunks)
        self._taken += taken
        if self._cut is not None:  # the client closed while this read waited: what came meanwhile is not handed over
            return self._end_with(_Failed(self._cut))
        if self._waiting_for_room:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing is left to wake
                self._loop.call_soon_threadsafe(self._make_room)
        return item if isinstance(item, bytes) else self._end_with(item)

    def _end_with(self, end: _End | _Failed) -> _End | _Failed:
        self._handed_end = True
        return end

    def cut(self, error: Exception) -> bool:
        """From any thread, as the call's client closes: ``error`` is what the caller gets now, instead of its
        response or at its next read (the closer then ends the call: `close`, `end_soon`); False if the caller has
        had its body's end already."""
        if self._handed_end:
            return False
        self._cut = error
        return True

    async def close(self) -> None:
        """Stop the call (closing the upstream response) and wait until it is done."""
        self._cancel()
        if self._done is not None:
            await self._done.wait()

    def end_soon(self, collected: bool = False) -> None:
        """From any thread, without waiting: tell the call's task to stop (it closes the upstream response).
        ``collected``: the caller's body was garbage-collected unclosed, and the call is recorded so."""
        cancel = self._cancel_collected if collected else self._cancel
        with contextlib.suppress(RuntimeError):  # the loop has closed: the task ended with it
            self._loop.call_soon_threadsafe(cancel)

    def _cancel_collected(self) -> None:
        self._collected = True
        self._cancel()

    def _cancel(self) -> None:
        self._cancelled = True
        if self._scope is not None:
            self._scope.cancel()


def _portable(context: contextvars.Context) -> list[tuple[contextvars.ContextVar[Any], Any]]:
    """The caller's context variables, minus those that name the caller's async library."""
    sniffio = sys.modules.get("sniffio")
    skip = getattr(sniffio, "current_async_library_cvar", None)
    return [(var, value) for var, value in context.items() if var is not skip]


class CallCore(Protocol):
    """The Guard's transport, as a sync call's task runs through it."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response: ...

    @property
    def closed(self) -> bool:
        """The Guard was closed (or is closing)."""
        ...


class LoopAccess(Protocol):
    """An event loop that sync callers run calls on from their own threads."""

    @property
    def loop(self) -> EventLoop | None: ...

    @property
    def running(self) -> bool: ...

    def call(self, func: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``func`` on the loop and wait for its result (from any thread but the loop's)."""

    def start(self, func: Callable[[], Awaitable[Any]], handed: Handed | None = None) -> Future[Any]:
        """Start ``func`` as a task on the loop (from any thread but the loop's); its future. ``handed``: a sync
        call handed to a loop of the caller's (`CallersLoop.hand`), which it refuses once given up on."""


def send(
    access: LoopAccess,
    core: CallCore,
    request: httpx.Request,
    home: HomeCall | None = None,
    calls: SyncClientCalls | None = None,
) -> tuple[httpx.Response, SyncBody]:
    """Run one call through the core on ``access``'s loop: the response head and its body to pull. ``home`` (a
    call on the Guard's own loop) is told when the response is handed over, and when the call's task is over (at
    once if it could not start). ``calls``: those of the client making it, whose close ends it."""
    loop = access.loop
    if loop is None:
        if home is not None:
            home.ended()
        raise GuardClosed(CLOSED)
    head: Future[httpx.Response] = Future()
    delivered = None if home is None else home.delivered
    handed = access.hand() if isinstance(access, CallersLoop) else None
    exchange = _Exchange(core, request, head, loop, delivered, guest=handed is not None)
    if calls is not None and not calls.add(exchange, access):  # its client closed as it started: nothing sent
        if home is not None:
            home.ended()
        raise client_closed(request)
    task = start_counted(access, exchange.drive, None if home is None else home.ended, handed)
    task.add_done_callback(exchange.unstarted)
    try:
        response = wait_for(head, loop, handed)
    except LoopEnded:
        raise  # nothing runs the call any more, or will
    except BaseException:
        if not head.done():  # the caller was interrupted (e.g. KeyboardInterrupt): stop the call
            access.call(exchange.close)
        raise
    return response, SyncBody(access, exchange)


def start_counted(
    access: LoopAccess,
    func: Callable[[], Awaitable[Any]],
    ended: Callable[[], None] | None,
    handed: Handed | None = None,
) -> Future[Any]:
    """Start ``func`` as a task on ``access``'s loop (as ``handed``, if given); ``ended`` (if given) is called once
    that task is over, or at once if it could not start."""
    try:
        task = access.start(func, handed)
    except BaseException:
        if ended is not None:
            ended()
        raise
    if ended is not None:
        task.add_done_callback(lambda _: ended())
    return task


def wait_for(future: Future[Any], loop: EventLoop, handed: Handed | None = None) -> Any:
    """``future``'s result, from a sync caller's thread; `GuardClosed` if ``loop``, which was to settle it, closes
    first (then nothing ever will). ``handed``: the call settling it, handed to a loop of the caller's, which may
    block before starting it (its thread waiting for this very call, say): `LoopEnded` once it is given up on
    there (`Handed.given_up`), to be sent where the Guard runs."""
    while True:
        try:
            return future.result(timeout=LOOP_CHECK)
        except FutureCancelled:
            raise GuardClosed("this Guard was closed while the call was running") from None
        except FutureTimeout:
            if future.done():  # the call's own TimeoutError (the same class as the wait's since Python 3.11)
                raise
            if loop.is_closed():
                raise LoopEnded("the event loop running this call ended before the call did") from None
            if handed is not None and handed.given_up():
                raise LoopEnded(LOOP_BLOCKED) from None


class CallersLoop:
    """A running event loop of the caller's that owns the Guard: sync calls from other threads run there, as its
    guests (`LoopOwner.as_guest`)."""

    def __init__(self, loop: EventLoop, owner: LoopOwner) -> None:
        self._loop = loop
        self._owner = owner

    @property
    def loop(self) -> EventLoop:
        return self._loop

    @property
    def running(self) -> bool:
        return not self._loop.is_closed()

    def call(self, func: Callable[[], Awaitable[Any]]) -> Any:
        return wait_for(self.start(func), self._loop)

    def hand(self) -> Handed:
        """A sync call about to be handed to this loop (`start`), which the loop may block before starting."""
        return self._owner.hand(self._loop)

    def start(self, func: Callable[[], Awaitable[Any]], handed: Handed | None = None) -> Future[Any]:
        try:
            return run_threadsafe(functools.partial(self._owner.as_guest, func, handed), self._loop)
        except RuntimeError as exc:  # the loop closed in between
            raise LoopEnded("the event loop this Guard's calls run on has ended") from exc


def _start_failure(why: BaseException | None) -> GuardUnavailable:
    """What a sync call gets when the Guard's event-loop thread or its loop could not start, for ``why`` (its
    ``__cause__``): `GuardUnavailable`, also an ``httpx.ConnectError``, the error a plain client that cannot open
    its socket (out of file descriptors) raises, which an SDK maps to its connection error (openai's
    ``APIConnectionError``). Nothing was sent; the next call starts the thread again."""
    message = f"{NOT_STARTED} ({type(why).__name__}: {why}); nothing was sent, and the next call starts it again"
    kind = like_last_error(GuardUnavailable, httpx.ConnectError(message))  # also an httpx.ConnectError
    error = kind(message)
    error.__cause__ = why
    return error


def _own_loop() -> asyncio.AbstractEventLoop:
    """A new loop of the kind asyncio makes here, telling time with the monotonic clock no test can freeze: a test
    that freezes ``time.monotonic`` (freezegun) would stop every timer of the Guard's own loop, and a sync call
    waiting on one (a retry's backoff) would never end."""
    try:
        loop = asyncio.new_event_loop()
    except BaseException as exc:
        _discard_half_made(exc)
        raise
    if type(loop).time is asyncio.BaseEventLoop.time:  # a loop of another kind keeps its own clock
        loop.time = Unfrozen.monotonic  # type: ignore[method-assign]
    if _green_threads():
        _unseen_while_waiting(loop)
    return loop


def _green_threads() -> bool:
    """Whether gevent or eventlet made threads greenlets here: the loop's thread then shares its starter's OS thread."""
    gevent_monkey = sys.modules.get("gevent.monkey")
    if gevent_monkey is not None and gevent_monkey.is_module_patched("threading"):
        return True
    eventlet_patcher = sys.modules.get("eventlet.patcher")
    return eventlet_patcher is not None and bool(eventlet_patcher.is_monkey_patched("thread"))


_UNSEEN: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[int, int]] = weakref.WeakKeyDictionary()
"""The loops `_unseen_while_waiting` hides (the greenlets of their OS thread see none of them run), each with the
process and the OS thread it runs in (a forked child's copy of its parent's, or another OS thread's, is not this
thread's)."""


def _unseen_while_waiting(loop: asyncio.AbstractEventLoop) -> None:
    """Hand the OS thread to the other greenlets as they had it whenever the loop's greenlet (the current one) is
    switched out (waiting for I/O, starting a thread, on a contended lock), and take it again as it is switched
    back in: asyncio keeps one running loop and one set of async generator hooks per OS thread. Seeing the Guard's
    loop as their own, code asking whether it runs in async code (Django's ORM in a sync view, asgiref's
    ``async_to_sync``) refused to run in every greenlet of the process, the plain client's views too; and a loop of
    theirs (``async_to_sync``'s) took the Guard's async generators as its own, and ended them with it."""
    greenlet = importlib.import_module("greenlet")  # gevent's and eventlet's own dependency
    own = greenlet.getcurrent()
    chained = greenlet.gettrace()
    theirs: list[Any] = [None, sys.get_asyncgen_hooks()]  # the others' state, while the loop's greenlet runs
    mine: list[Any] = [None, sys.get_asyncgen_hooks()]  # the loop's, while it is switched out

    def follow(event: str, args: Any) -> Any:
        if event in ("switch", "throw"):
            origin, target = args
            if origin is own and target is not own:
                mine[:] = [asyncio.events._get_running_loop(), sys.get_asyncgen_hooks()]
                asyncio.events._set_running_loop(theirs[0])
                sys.set_asyncgen_hooks(*theirs[1])
            elif target is own and origin is not own:
                theirs[:] = [asyncio.events._get_running_loop(), sys.get_asyncgen_hooks()]
                asyncio.events._set_running_loop(mine[0])
                sys.set_asyncgen_hooks(*mine[1])
        return None if chained is None else chained(event, args)

    follow.own, follow.chained = own, chained  # type: ignore[attr-defined]
    greenlet.settrace(follow)
    _UNSEEN[loop] = _this_thread()


def _this_thread() -> tuple[int, int]:
    """The process and the OS thread (not the greenlet) the caller runs in."""
    return os.getpid(), threading.get_native_id()


def _hidden_here() -> bool:
    """Whether a loop `_unseen_while_waiting` hides runs in this OS thread of this process."""
    here = _this_thread()
    return any(where == here and loop.is_running() for loop, where in list(_UNSEEN.items()))


def _unfollow() -> None:
    """From the loop's greenlet as its loop has ended: remove what `_unseen_while_waiting` put in, unless another
    switch trace has been set over it since."""
    greenlet = sys.modules.get("greenlet")
    if greenlet is not None:
        trace = greenlet.gettrace()
        if getattr(trace, "own", None) is greenlet.getcurrent():
            greenlet.settrace(trace.chained)


def _discard_half_made(failure: BaseException) -> None:
    """Close what asyncio's loop constructor made before it failed (its self-pipe, out of file descriptors), which
    only the failure's traceback reaches: the selector, whose fd the garbage collector alone would free (it and its
    map refer to each other), and the loop, marked closed, which collected unclosed warns and prints a traceback (its
    own ``close`` needs the self-pipe it lacks)."""
    for frame, _ in traceback.walk_tb(failure.__traceback__):
        for value in frame.f_locals.values():
            # One whose own constructor failed opened nothing, and lacks what closing it reads.
            with contextlib.suppress(AttributeError):
                if isinstance(value, selectors.BaseSelector):
                    value.close()
                elif isinstance(value, asyncio.BaseEventLoop) and not value.is_closed():
                    asyncio.BaseEventLoop.close(value)  # the base's: the loop's own needs the self-pipe


_exit_began = False


def _note_exit() -> None:
    global _exit_began
    _exit_began = True


atexit.register(_note_exit)


class SyncRunner:
    """A daemon thread running an asyncio event loop, for one Guard's sync calls (its home)."""

    def __init__(self, core: httpx.AsyncBaseTransport, name: str) -> None:
        """Start the thread (`ready` waits until its loop runs, or tells why it could not start)."""
        self._core = core
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._failed: BaseException | None = None
        self._started = threading.Event()
        self._stopped = False
        self._born_in_exit = _exit_began or sys.is_finalizing()
        """Started by an exit handler that ran after this module's (`left_to_exit`)."""
        in_forked_child(self.orphan)  # its thread stayed in the parent
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        try:
            self._thread.start()
        except RuntimeError as exc:  # "can't start new thread": the process is at its thread limit
            self._could_not_start(exc)

    def ready(self) -> asyncio.AbstractEventLoop:
        """Wait until the loop runs (a greenlet waiting here lets the thread's own greenlet start it, under gevent);
        that loop. If the thread or its loop could not start (the process out of threads or file descriptors), its
        thread has ended and the call gets a connection error, as a plain client that cannot open its socket does
        (`_start_failure`)."""
        loop = self._wait_started()
        if loop is None:
            raise _start_failure(self._failed)
        return loop

    def _wait_started(self) -> asyncio.AbstractEventLoop | None:
        """Wait until the loop runs: that loop, or None once the thread that could not start it has ended."""
        self._started.wait()
        if self._loop is None and self._thread.ident is not None:  # it ran, and is returning
            self._thread.join()
        return self._loop

    def _could_not_start(self, why: BaseException) -> None:
        self._failed = why
        self._started.set()

    @property
    def running(self) -> bool:
        """Whether the loop runs, for this process: a child forked without Python's at-fork hooks (uWSGI's workers)
        first catches up with its fork (`catch_up_with_fork`), which orphans the loop left in the parent."""
        catch_up_with_fork()
        return self._loop is not None and not self._stopped

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def in_own_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def left_to_exit(self) -> bool:
        """Whether nothing may wait for the loop's thread any more, as the interpreter exits: the thread is a
        daemon, which stops with the process (and the calls in flight in daemon threads with them, as a plain
        client's do; closing the pools under them printed a traceback for each). So once the exit handlers run
        (those of the application's registered before this module was imported run after this one's), unless
        the runner was started by one of those (its Guard is closed as any other), and once the interpreter
        finalizes (its threads frozen: no call may start either)."""
        return sys.is_finalizing() or (_exit_began and not self._born_in_exit)

    def orphan(self) -> None:
        """In a forked child, where the loop's thread stayed in the parent: calls are refused, and closes return,
        at once."""
        self._stopped = True

    def _serve(self) -> None:
        async def main() -> None:
            # The loop is asyncio's (anyio.run's default); the sync edges wake it with call_soon_threadsafe. As it
            # returns, the run cancels the tasks still running and waits for them.
            self._stop = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            self._started.set()
            await self._stop.wait()

        if asyncio._get_running_loop() is not None or _hidden_here():
            # gevent: a greenlet's thread shares its OS thread with another runner's loop (a caller's came first:
            # this one is stopped unused), which asyncio's running loop and async generator hooks are one of
            self._could_not_start(RuntimeError("an event loop already runs in this thread"))
            return
        try:
            anyio.run(main, backend_options={"loop_factory": _own_loop})
        except BaseException as exc:
            if self._loop is None:  # it could not be made (out of file descriptors, say)
                self._could_not_start(exc)
        finally:
            _unfollow()
            self._started.set()

    def call(self, func: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``func`` on the loop and wait for its result (from any thread but the loop's)."""
        loop = self._loop
        if loop is None or self._stopped:
            raise GuardClosed(CLOSED)
        return wait_for(self.start(func), loop)

    def start(self, func: Callable[[], Awaitable[Any]], handed: Handed | None = None) -> Future[Any]:
        """Start ``func`` as a task on the loop (from any thread but the loop's); its future. Its own loop: no
        call is ``handed`` to it."""
        loop = self._loop
        if loop is None or self._stopped or sys.is_finalizing():  # finalizing: the loop's thread is frozen
            raise GuardClosed(CLOSED)
        try:
            return run_threadsafe(func, loop)
        except RuntimeError as exc:  # the loop stopped in between
            raise GuardClosed(CLOSED) from exc

    def stop(self, close_guard: Callable[[], Awaitable[None]] | None = None) -> None:
        """Close the Guard on this loop (if given), cancel what is left, end the thread. At the interpreter's exit
        it only refuses further calls: the thread stops with the process (`left_to_exit`)."""
        if self.in_own_thread():
            raise RuntimeError("a Guard cannot be closed from its own event-loop thread")
        if self.left_to_exit():
            self._stopped = True
            return
        loop, stop = self._wait_started(), self._stop
        if loop is None or stop is None or self._stopped:
            return
        try:
            if close_guard is not None:
                self.call(close_guard)
        finally:
            self._stopped = True
            with contextlib.suppress(RuntimeError, GuardClosed):  # already stopping
                settled = functools.partial(started_soon_ended, SETTLE_TIMEOUT)  # e.g. pools left here being closed
                wait_for(run_threadsafe(settled, loop), loop)
                loop.call_soon_threadsafe(stop.set)
            self._thread.join(JOIN_TIMEOUT)
            if self._thread.is_alive():  # pragma: no cover - a close that hangs
                logger.warning("llmguard: the Guard's event-loop thread did not end within %ss", JOIN_TIMEOUT)
