"""The calls in flight of one client the Guard handed out, which closing that client ends.

Closing a plain httpx client closes its connection pool: a call still waiting for its answer, and a body not yet
read to its end, fail with a `ReadError` (the SDKs' ``APIConnectionError``), and the server sees the disconnect. A
client the Guard hands out shares the Guard's pools, which are not its to close; so it ends its own calls instead: a
call waiting for its response is cancelled (the Guard releases what the call held and closes its attempts'
connections) and raises `httpx.ReadError`; a body not yet read to its end is closed (its upstream connection with
it) and raises the same error at its next read. The Guard and other clients' calls go on. A body the caller has
read to its end is left as it is.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import AsyncIterator
from typing import Any, Protocol

import anyio
import httpx

from llmguard_client._core.event_loops import running_loop
from llmguard_client._core.forks import in_forked_child
from llmguard_client.errors import GuardClosed

CLIENT_CLOSED = (
    "the client this call was made with was closed, which ends its calls in flight (as closing a client without a "
    "guard closes their connections); the Guard and its other clients go on"
)


def client_closed(request: httpx.Request) -> httpx.ReadError:
    """What a call of a closed client raises: httpx's error for a connection closed under it."""
    return httpx.ReadError(CLIENT_CLOSED, request=request)


class Cuttable(Protocol):
    """A body of an async client's call that its close can end (`AsyncClientCalls.cut`)."""

    async def cut(self) -> None:
        """Close the body now (its upstream connection with it); its next read raises `client_closed`."""


class AsyncClientCalls:
    """The calls in flight of one async client (on the event loop the Guard's calls run on): `aclose` ends them."""

    __slots__ = ("_bodies", "_waiting", "closed")

    def __init__(self) -> None:
        self.closed = False
        self._waiting: set[anyio.CancelScope] = set()
        """The calls waiting for their response."""
        self._bodies: weakref.WeakSet[Cuttable] = weakref.WeakSet()
        """The bodies handed out and not yet read to their end or closed (weakly: one dropped is collected as
        before, which ends its call)."""

    async def send(self, core: httpx.AsyncBaseTransport, request: httpx.Request) -> httpx.Response:
        """``core``'s response to ``request``, its body one the client's close can cut (`ClientBody`; a body in
        memory holds nothing to end); `client_closed` if the client closes first (the call cancelled)."""
        scope = anyio.CancelScope()
        if self.closed:
            scope.cancel()
        self._waiting.add(scope)
        response: httpx.Response | None = None
        try:
            with scope:
                response = await core.handle_async_request(request)
        except Exception as exc:
            if scope.cancel_called:
                raise client_closed(request) from exc
            raise
        finally:
            self._waiting.discard(scope)
        if scope.cancel_called:  # closed while the call ran: cancelled, or its response came just as it closed
            if response is not None:
                with anyio.CancelScope(shield=True):
                    await response.aclose()
            raise client_closed(request)
        assert response is not None
        stream = response.stream
        if type(stream) is not httpx.ByteStream:
            assert isinstance(stream, httpx.AsyncByteStream)
            response.stream = ClientBody(stream, self, request)
        return response

    def track(self, body: Cuttable) -> None:
        self._bodies.add(body)

    def untrack(self, body: Cuttable) -> None:
        self._bodies.discard(body)

    async def aclose(self) -> None:
        """End every call in flight (once): cancel those waiting, then close each body not read to its end."""
        self.closed = True
        for scope in list(self._waiting):
            scope.cancel()
        for body in list(self._bodies):
            self._bodies.discard(body)
            await body.cut()


class ClientBody(httpx.AsyncByteStream):
    """A response body of an httpx client's call, passed through as it is: `AsyncClientCalls` can cut it."""

    __slots__ = ("_calls", "_chunks", "_cut", "_request", "_stream")

    def __init__(self, stream: httpx.AsyncByteStream, calls: AsyncClientCalls, request: httpx.Request) -> None:
        self._stream = stream
        self._calls = calls
        self._request = request
        self._chunks: AsyncIterator[bytes] | None = None
        self._cut = False
        calls.track(self)

    def __aiter__(self) -> ClientBody:
        if self._chunks is None:  # iterated again (an SDK draining the rest after its end marker): read on
            self._chunks = self._stream.__aiter__()
        return self

    async def __anext__(self) -> bytes:
        if self._cut:
            raise client_closed(self._request)
        chunks = self._chunks
        assert chunks is not None, "iterated after __aiter__"
        try:
            return await chunks.__anext__()
        except StopAsyncIteration:
            self._calls.untrack(self)  # read to its end: a close of the client leaves it as it is
            raise
        except Exception as exc:
            if self._cut:  # the client closed while this read waited
                raise client_closed(self._request) from exc
            raise

    async def aclose(self) -> None:
        self._calls.untrack(self)
        await self._stream.aclose()

    async def cut(self) -> None:
        self._cut = True
        with anyio.CancelScope(shield=True), contextlib.suppress(httpx.HTTPError, OSError):
            await self._stream.aclose()


class SyncCall(Protocol):
    """A sync call as its client's close ends it (the sync edges' `_Exchange`)."""

    def cut(self, error: Exception) -> bool:
        """From any thread: ``error`` is what the caller gets now, instead of its response or at its next read;
        False if it has had its body's end already (nothing to end)."""

    async def close(self) -> None:
        """On the call's loop: stop it (closing its upstream response) and wait until it has."""

    def end_soon(self) -> None:
        """From any thread: tell the call's task to stop, without waiting."""


class Runs(Protocol):
    """The loop a sync call runs on, as its client's close reaches it (the sync edges' `LoopAccess`)."""

    def call(self, func: Any) -> Any: ...


class SyncClientCalls:
    """The calls in flight of one sync client, from any thread: `close` ends them."""

    __slots__ = ("__weakref__", "_calls", "_lock", "closed")

    def __init__(self) -> None:
        self.closed = False
        self._lock = threading.Lock()
        in_forked_child(self._new_lock)
        self._calls: weakref.WeakKeyDictionary[SyncCall, Runs] = weakref.WeakKeyDictionary()
        """Each call and the loop it runs on (weakly: a call is dropped once its task has ended and its body is
        gone)."""

    def _new_lock(self) -> None:
        """In a forked child: another thread of the parent may have held the lock at the fork."""
        self._lock = threading.Lock()

    def add(self, call: SyncCall, where: Runs) -> bool:
        """Count ``call`` among the client's before it starts; False if the client is closed (not to start)."""
        with self._lock:
            if self.closed:
                return False
            self._calls[call] = where
            return True

    def close(self) -> None:
        """End every call in flight: from a plain thread, once each has closed its upstream response; from an event
        loop's thread (which waiting would block), each told to end."""
        with self._lock:
            self.closed = True
            calls = list(self._calls.items())
            self._calls.clear()
        for call, where in calls:
            if not call.cut(httpx.ReadError(CLIENT_CLOSED)):  # httpx names the request as the caller gets it
                continue
            if running_loop() is not None:
                call.end_soon()
                continue
            with contextlib.suppress(GuardClosed):  # the Guard closed meanwhile: its close ended the call
                where.call(call.close)
