"""Each replica's connection pool: httpx's, with httpcore 1.0's connection assignment done in one pass.

httpcore 1.0's ``AsyncConnectionPool`` hands a still-idle connection to *every* request queued in the
same pass: requests released together all get the first idle connection, one sends on it and the
others fail with ``ConnectionNotAvailable``, re-queue, and get the next idle connection together, and
so on. While any connection is idle it creates no new one, so a burst on a warm pool is served a few
requests at a time over the connections it kept (encode/httpcore#822), and each of those passes
rescans every connection and request. httpcore2, the pool under openai >= 3's own client, fixed this
(a connection handed to a waiting request is reserved; one scan per pass).

`replica_transport` is httpx's ``AsyncHTTPTransport`` whose pool runs `_assign_once` instead: the same
fix, on httpcore 1.0's own pool (so everything else, including mocking with respx, is unchanged). It
also probes an idle connection's socket (has the server closed it?) when it hands the connection out,
and all of them at most once per `SWEEP_INTERVAL`, not all of them on every pass: with 250 idle
connections those probes took a third of a burst's CPU. And on asyncio its connections take their
locks without yielding when no one holds them, as httpcore2's do: httpcore 1.0's yield at each of a
request's two lock acquisitions, and in a burst each yield puts the request behind every other call's
pending work (a warm burst of 250 wrote its first requests 0.9 s after release instead of 0.1 s).
HTTP/1.1 only, which is what these pools speak: an idle connection takes one request.

A request sent on a kept-alive connection that the server had closed meanwhile (its idle timeout, e.g.
uvicorn's 5 s under vLLM, racing the reuse) fails before any answer: "Server disconnected without sending a
response", or a reset. `ReplicaPool` sends it again at once on another connection, up to `STALE_RESENDS` times,
below the guard's retries, budget and circuit breaker, only when the server cannot have seen it whole: its close
or reset had come in when the connection was handed out or when the request's body was about to be written,
after its headers (the socket is probed then), or the request was not all written; and when its body can be read
again. The same error after the request was written is no proof:
the server may have read the request and dropped the connection (a worker that crashed on it), so that failure
is the attempt's, for the guard's retries to judge, as an SDK's own retries would (urllib3 and Go's net/http
resend a POST only when nothing of it was written, or the connection was seen closed before it).
"""

from __future__ import annotations

import inspect
import logging
import math
import socket
import ssl
import time
import weakref
from collections.abc import AsyncIterable, AsyncIterator

import anyio
import httpcore
import httpx
from httpcore._synchronization import AsyncLock

from llmguard_client._http.upload import rereadable

logger = logging.getLogger("llmguard_client")

_FIXED_VERSIONS = ("1.0.",)
"""httpcore releases whose pool `ReplicaPool` is written against (their private assignment pass)."""


SWEEP_INTERVAL = 1.0
"""Seconds between two passes that probe every idle connection for expiry (a socket probe each); between
them an idle connection is probed only when it is handed to a request."""

Connection = httpcore.AsyncConnectionInterface


_FAST_LOCKS = "fast_acquire" in inspect.signature(anyio.Lock).parameters
"""anyio >= 4.5: a lock that does not yield when it is free."""


class FastLock(AsyncLock):
    """httpcore's lock that, on asyncio, takes a free lock without yielding to the event loop (anyio's
    ``fast_acquire``, as in httpcore2); on trio, trio's lock as before."""

    def setup(self) -> None:
        super().setup()
        if self._backend == "asyncio" and _FAST_LOCKS:
            self._anyio_lock = anyio.Lock(fast_acquire=True)


STALE_RESENDS = 2
"""Times a request that met a reused connection the server had closed is sent again (module docstring)."""
_STALE = (httpcore.RemoteProtocolError, httpcore.ReadError, httpcore.WriteError)
"""What a connection the server closed while it was idle raises when a request is sent on it."""


class _BodyWatch:
    """A request's body as its connection writes it, after the headers: when the connection was a kept-alive one,
    probes its socket as the body is about to be written (has the server's close or reset come in?), and notes
    whether the body was all written. A failure before any answer is the keep-alive race only if the close came
    first or the request was not all written (httpcore skips the body when writing the headers failed): then the
    server cannot have read the request whole."""

    __slots__ = ("_body", "_pool", "_request", "closed_first", "written")

    def __init__(self, body: AsyncIterable[bytes], pool: ReplicaPool, request: httpcore.Request) -> None:
        self._body = body
        self._pool = pool
        self._request = request
        self.closed_first = False
        self.written = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._reused()
        self.closed_first = connection is not None and _peer_closed(connection)
        async for chunk in self._body:
            yield chunk
        self.written = True

    def unread(self) -> bool:
        """Whether the request met a kept-alive connection whose server cannot have read it whole."""
        return self._reused() is not None and (self.closed_first or not self.written)

    def _reused(self) -> Connection | None:
        reused = self._pool._on_reused
        return None if reused is None else reused.get(self._request)


def _peer_closed(connection: Connection) -> bool:
    """Whether an HTTP/1.1 connection's socket is readable, between a request's writes (its server's close or
    reset has come in: nothing is due from it before the request is whole)."""
    stream = getattr(getattr(connection, "_connection", None), "_network_stream", None)
    return isinstance(stream, httpcore.AsyncNetworkStream) and bool(stream.get_extra_info("is_readable"))


class ReplicaPool(httpcore.AsyncConnectionPool):
    """httpcore's HTTP/1.1 connection pool whose assignment never hands one connection to two requests,
    over connections whose locks do not yield when free, and which resends a request that met a connection the
    server had closed before it could read the request."""

    _swept_at = -math.inf
    """When a pass last probed every idle connection (`time.monotonic`)."""
    _on_reused: weakref.WeakKeyDictionary[httpcore.Request, Connection] | None = None
    """The requests the last pass handed a kept-alive connection, and that connection (built on first use: httpx
    builds the pool)."""
    _made: weakref.WeakSet[Connection] | None = None
    """Every connection this pool made and has not dropped (built on first use)."""
    _closed = False
    """Set by `aclose`. httpcore's close closes the connections in the pool's list; one still connecting for a
    request then joins no list: it is closed here when a request ends (its own, once its response is closed). A
    closed pool opens no connection: a new request fails at once, and so does one still waiting for a connection
    (httpcore's pool would open one for each, and keep it)."""

    async def aclose(self) -> None:
        self._closed = True
        await super().aclose()

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        if self._closed:
            raise httpcore.ConnectError(POOL_CLOSED)
        body = request.stream
        assert isinstance(body, AsyncIterable), "an async pool's requests carry async bodies"
        resends = 0
        try:
            while True:
                watch = _BodyWatch(body, self, request)
                request.stream = watch
                try:
                    return await super().handle_async_request(request)
                except _STALE:
                    if resends == STALE_RESENDS or not watch.unread() or not rereadable(body):
                        raise
                    resends += 1
                    logger.debug("llmguard: resending a request the server closed its kept-alive connection before")
        finally:
            request.stream = body

    def _assign_requests_to_connections(self) -> list[Connection]:
        now = time.monotonic()
        sweep = now - self._swept_at >= SWEEP_INTERVAL
        if sweep:
            self._swept_at = now
        if self._on_reused is None:
            self._on_reused = weakref.WeakKeyDictionary()
        if not self._closed:
            return _assign_once(self, sweep, self._on_reused)
        for waiting in self._requests:  # after the close: no new connection; a request still waiting fails
            if waiting.is_queued():
                waiting.assign_to_connection(_REFUSED)
        return [c for c in self._made or () if c.is_idle() and not c.is_closed()]  # each one left idle, in no list

    def create_connection(self, origin: httpcore.Origin) -> Connection:
        connection = super().create_connection(origin)
        if self._made is None:
            self._made = weakref.WeakSet()
        self._made.add(connection)
        if isinstance(connection, httpcore.AsyncHTTPConnection):
            connection._request_lock = FastLock()  # taken at each request, around the connect if any
        return connection


POOL_CLOSED = "the connection pool is closed (its Guard was closed): it opens no new connection"


class _Refused(httpcore.AsyncConnectionInterface):
    """The connection a closed pool hands a request still waiting for one: sending on it fails at once."""

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        raise httpcore.ConnectError(POOL_CLOSED)

    async def aclose(self) -> None:
        pass

    def info(self) -> str:
        return "refused: the pool is closed"

    def can_handle_request(self, origin: httpcore.Origin) -> bool:
        return False

    def is_available(self) -> bool:
        return False

    def has_expired(self) -> bool:
        return False

    def is_idle(self) -> bool:
        return False

    def is_closed(self) -> bool:
        return True


_REFUSED = _Refused()


def _assign_once(
    pool: httpcore.AsyncConnectionPool, sweep: bool, on_reused: weakref.WeakKeyDictionary[httpcore.Request, Connection]
) -> list[Connection]:
    """Drop closed connections, close surplus idle ones (and, if ``sweep``, expired ones), then give each
    queued request an idle connection no other request holds (probed first: not expired, not closed by the
    server; the request is then in ``on_reused``) or a new one: one scan of connections and requests. Returns
    the connections to close (the pool closes them outside its lock)."""
    closing: list[Connection] = []
    reserved = {r.connection for r in pool._requests if r.connection is not None}
    kept: list[Connection] = []
    idle: list[Connection] = []
    for connection in pool._connections:
        if connection.is_closed():
            continue
        if connection in reserved or not connection.is_idle():
            kept.append(connection)  # in use or handed out: it has no keep-alive to expire
        elif sweep and connection.has_expired():
            closing.append(connection)
        else:
            kept.append(connection)
            idle.append(connection)
    surplus = len(idle) - pool._max_keepalive_connections
    if surplus > 0:  # keep-alive limits idle connections, oldest closed first
        evicted = set(idle[:surplus])
        closing.extend(idle[:surplus])
        kept = [c for c in kept if c not in evicted]
        idle = idle[surplus:]
    pool._connections = kept
    limit = pool._max_connections
    for request in pool._requests:
        if not idle and len(kept) >= limit:
            break  # nothing left to hand out
        if not request.is_queued():
            continue
        origin = request.request.url.origin
        chosen = _take_idle(idle, origin, kept, closing, probe=not sweep)
        if chosen is not None:
            on_reused[request.request] = chosen
        else:
            on_reused.pop(request.request, None)
            if len(kept) >= limit:
                if not idle:
                    continue
                victim = idle.pop(0)  # full: an idle connection to another origin makes room
                kept.remove(victim)
                closing.append(victim)
            chosen = pool.create_connection(origin)
            kept.append(chosen)
        request.assign_to_connection(chosen)
    return closing


def _take_idle(
    idle: list[Connection], origin: httpcore.Origin, kept: list[Connection], closing: list[Connection], probe: bool
) -> Connection | None:
    """The first idle connection to ``origin``, taken out of ``idle``, or None; with ``probe``, expired ones
    found on the way are moved from ``kept`` to ``closing``."""
    i = 0
    while i < len(idle):
        connection = idle[i]
        if not connection.can_handle_request(origin):
            i += 1
            continue
        del idle[i]
        if probe and connection.has_expired():
            kept.remove(connection)
            closing.append(connection)
            continue
        _fast_state_lock(connection)
        return connection
    return None


def _fast_state_lock(connection: Connection) -> None:
    """Give an idle HTTP/1.1 connection's state lock (taken at each request) a `FastLock`. Safe while it is
    idle and handed to one request only: no one holds it (it is held only around state changes, with no
    wait inside, and was released when the connection became idle)."""
    http11 = getattr(connection, "_connection", None)
    if isinstance(http11, httpcore.AsyncHTTP11Connection) and type(http11._state_lock) is not FastLock:
        http11._state_lock = FastLock()


def _tcp_keepalive() -> list[tuple[int, int, int]]:
    """TCP keep-alive probes after 60 s of silence, every 60 s, 5 at most: the anthropic SDK's own pool's. A NAT or
    load balancer that forgets a silent connection (AWS NAT Gateway after 350 s, Azure's after 4 min) keeps one
    that a long call holds (a non-streamed answer, a model thinking before its first token)."""
    idle = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)  # macOS's name for it
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for option, value in (
        (idle, 60),
        (getattr(socket, "TCP_KEEPINTVL", None), 60),
        (getattr(socket, "TCP_KEEPCNT", None), 5),
    ):
        if option is not None:
            options.append((socket.IPPROTO_TCP, option, value))
    return options


TCP_KEEPALIVE = _tcp_keepalive()


def replica_transport(
    limits: httpx.Limits, verify: ssl.SSLContext, proxy: httpx.Proxy | None = None
) -> httpx.AsyncHTTPTransport:
    """httpx's transport (no transport-level retries: the guard decides; TCP keep-alive probes on,
    `TCP_KEEPALIVE`), through ``proxy`` if one is given, its pool a `ReplicaPool` when the installed httpcore is
    one `ReplicaPool` is written for (else httpcore's own pool, unchanged; a proxy's pool is httpcore's own too)."""
    transport = httpx.AsyncHTTPTransport(
        limits=limits, retries=0, verify=verify, proxy=proxy, socket_options=TCP_KEEPALIVE
    )
    pool = transport._pool
    if type(pool) is httpcore.AsyncConnectionPool and httpcore.__version__.startswith(_FIXED_VERSIONS):
        pool.__class__ = ReplicaPool  # the same pool, built by httpx with its settings; only the pass differs
    return transport


DROPPABLE = "llmguard_droppable"
"""A request extension marking a request the Guard may drop when its connections move to another event loop (a
server-hints poll): `pool_idle` does not count it."""


def pool_idle(transport: httpx.AsyncBaseTransport) -> bool:
    """Whether ``transport`` has no request in flight but droppable ones: True for an httpx transport whose pool
    holds none (a request stays in the pool until its response is closed), False for one that cannot be told (a
    transport of the user's)."""
    pool = getattr(transport, "_pool", None) if isinstance(transport, httpx.AsyncHTTPTransport) else None
    requests = getattr(pool, "_requests", None)
    if not isinstance(requests, list):
        return False
    return all(r.request.extensions.get(DROPPABLE) for r in requests)
