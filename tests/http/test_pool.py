"""The replica pools' connection assignment (`llmguard_client._http.pool`), pass by pass, on stand-in connections.

httpcore 1.0's own pass hands one idle connection to every request queued in the same pass (all but one then
fail with ``ConnectionNotAvailable`` and queue again), and counts the keep-alive limit against all connections;
these tests pin down the single-pass assignment that replaces it. No sockets: `FakeConnection` stands in for
a connection, and only the assignment pass runs (in an event loop: handing out a connection sets an event).
Last, on loopback sockets: a request that met a kept-alive connection the server had closed is sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import httpcore
import httpx
import pytest
from httpcore._async.connection_pool import AsyncPoolRequest
from httpcore._async.http11 import HTTPConnectionState
from httpcore._backends.mock import AsyncMockStream

from llmguard_client import Guard, Replica, Tier
from llmguard_client._http.pool import FastLock, ReplicaPool, _BodyWatch, replica_transport
from llmguard_client._http.tls import default_tls_context
from llmguard_client.guard import default_transport
from tests.edges.conftest import aeventually
from tests.loopback import answering_stream, raw_server

URL = "http://replica.test:8000/v1/chat/completions"


class FakeConnection(httpcore.AsyncConnectionInterface):
    """A connection in a given state: ``idle`` (connected, no request), else busy; or closed or expired."""

    def __init__(self, origin: str = URL, *, idle: bool = True, closed: bool = False, expired: bool = False) -> None:
        self.origin = httpcore.URL(origin).origin
        self.idle, self.closed, self.expired = idle, closed, expired
        self.expiry_checks = 0

    def can_handle_request(self, origin: httpcore.Origin) -> bool:
        return origin == self.origin

    def is_available(self) -> bool:
        return self.idle and not self.closed

    def has_expired(self) -> bool:
        self.expiry_checks += 1
        return self.expired

    def is_idle(self) -> bool:
        return self.idle and not self.closed

    def is_closed(self) -> bool:
        return self.closed


def make_pool(*connections: FakeConnection, max_connections: int = 100, keepalive: int = 20) -> ReplicaPool:
    pool = ReplicaPool(max_connections=max_connections, max_keepalive_connections=keepalive)
    pool._connections = list(connections)
    return pool


def queue(pool: ReplicaPool, count: int, url: str = URL) -> list[AsyncPoolRequest]:
    requests = [AsyncPoolRequest(httpcore.Request("POST", url)) for _ in range(count)]
    pool._requests.extend(requests)
    return requests


async def test_requests_queued_together_get_distinct_idle_connections_then_new_ones() -> None:
    idle = [FakeConnection() for _ in range(3)]
    pool = make_pool(*idle)
    requests = queue(pool, 5)
    assert pool._assign_requests_to_connections() == []
    assigned = [r.connection for r in requests]
    assert assigned[:3] == idle
    assert all(isinstance(c, httpcore.AsyncHTTPConnection) for c in assigned[3:])  # opened for the other two
    assert len({id(c) for c in assigned}) == 5
    assert len(pool._connections) == 5


async def test_an_idle_connection_handed_to_a_waiting_request_is_not_handed_again() -> None:
    idle = FakeConnection()
    pool = make_pool(idle)
    (first,) = queue(pool, 1)
    pool._assign_requests_to_connections()
    (second,) = queue(pool, 1)  # arrives before the first request has started on its connection
    pool._assign_requests_to_connections()
    assert first.connection is idle
    assert second.connection is not None and second.connection is not idle


def test_the_keepalive_limit_counts_idle_connections_not_all_connections() -> None:
    busy = [FakeConnection(idle=False) for _ in range(5)]
    idle = [FakeConnection() for _ in range(2)]
    pool = make_pool(*busy, *idle, keepalive=2)
    assert pool._assign_requests_to_connections() == []
    assert pool._connections == [*busy, *idle]


def test_surplus_idle_connections_are_closed_oldest_first() -> None:
    idle = [FakeConnection() for _ in range(4)]
    pool = make_pool(*idle, keepalive=2)
    assert pool._assign_requests_to_connections() == idle[:2]
    assert pool._connections == idle[2:]


async def test_closed_connections_are_dropped_and_expired_ones_closed_but_a_held_one_is_not_probed() -> None:
    closed, expired, held = FakeConnection(closed=True), FakeConnection(expired=True), FakeConnection(expired=True)
    pool = make_pool(closed, expired, held)
    (request,) = queue(pool, 1)
    request.assign_to_connection(held)  # handed out, not yet sent on
    assert pool._assign_requests_to_connections() == [expired]
    assert pool._connections == [held]
    assert held.expiry_checks == 0


async def test_between_sweeps_only_the_idle_connection_handed_out_is_probed() -> None:
    idle = [FakeConnection() for _ in range(3)]
    pool = make_pool(*idle)
    pool._swept_at = time.monotonic()  # every idle connection was just probed
    (request,) = queue(pool, 1)
    assert pool._assign_requests_to_connections() == []
    assert request.connection is idle[0]
    assert [c.expiry_checks for c in idle] == [1, 0, 0]


async def test_an_expired_idle_connection_is_closed_instead_of_handed_out() -> None:
    expired, fresh = FakeConnection(expired=True), FakeConnection()
    pool = make_pool(expired, fresh)
    pool._swept_at = time.monotonic()
    (request,) = queue(pool, 1)
    assert pool._assign_requests_to_connections() == [expired]
    assert request.connection is fresh
    assert pool._connections == [fresh]


async def test_a_full_pool_closes_an_idle_connection_to_another_origin_to_make_room() -> None:
    other = FakeConnection("http://other.test:9000/")
    busy = FakeConnection(idle=False)
    pool = make_pool(busy, other, max_connections=2)
    (request,) = queue(pool, 1)
    assert pool._assign_requests_to_connections() == [other]
    assert request.connection is not None and request.connection not in (busy, other)
    assert pool._connections == [busy, request.connection]


async def test_a_full_pool_leaves_requests_queued() -> None:
    busy = [FakeConnection(idle=False) for _ in range(2)]
    pool = make_pool(*busy, max_connections=2)
    requests = queue(pool, 3)
    assert pool._assign_requests_to_connections() == []
    assert all(r.is_queued() for r in requests)


async def test_a_free_lock_is_taken_without_letting_other_tasks_run() -> None:
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)  # runs at the first yield of this task
        async with FastLock():
            assert ran == []
    assert ran == ["other"]


async def test_a_taken_lock_still_makes_the_next_one_wait() -> None:
    lock, order = FastLock(), []

    async def second() -> None:
        async with lock:
            order.append("second")

    async with anyio.create_task_group() as tg:
        async with lock:
            tg.start_soon(second)
            await anyio.sleep(0.01)
            order.append("first")
    assert order == ["first", "second"]


async def test_new_connections_and_idle_ones_handed_out_get_locks_that_do_not_yield() -> None:
    pool = ReplicaPool(max_connections=10, max_keepalive_connections=5)
    origin = httpcore.URL(URL).origin
    created = pool.create_connection(origin)
    assert isinstance(created, httpcore.AsyncHTTPConnection) and type(created._request_lock) is FastLock
    http11 = httpcore.AsyncHTTP11Connection(origin, AsyncMockStream([]))
    http11._state = HTTPConnectionState.IDLE
    created._connection = http11
    pool._connections = [created]
    (request,) = queue(pool, 1)
    pool._assign_requests_to_connections()
    assert request.connection is created and type(http11._state_lock) is FastLock


async def test_the_guards_default_pools_use_the_single_pass_assignment() -> None:
    guard = Guard(["http://127.0.0.1:1"], tiers={"t": Tier(ttft=1.0, total=2.0)}, instrumentation=None)
    try:
        (state,) = guard._replica_set.states
        assert isinstance(state.transport, httpx.AsyncHTTPTransport)
        assert type(state.transport._pool) is ReplicaPool
    finally:
        await guard.aclose()


def test_an_httpcore_the_pass_is_not_written_for_keeps_its_own_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpcore, "__version__", "1.1.0")
    limits = httpx.Limits(max_connections=10, max_keepalive_connections=5)
    transport = replica_transport(limits, default_tls_context())
    assert type(transport._pool) is httpcore.AsyncConnectionPool


async def read_request(reader: asyncio.StreamReader) -> None:
    """Read one HTTP/1.1 request, headers and ``content-length`` body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
    await reader.readexactly(int(length[0].split(b":")[1]) if length else 0)


class ClosesKeptAlive:
    """A loopback server that answers the first request on each connection, keeps the connection, and closes it
    without answering when the next request comes on it, once it has read it (a worker that crashed on it).
    With ``drop_fresh`` it also drops the first request of each new connection."""

    def __init__(self, drop_fresh: bool = False) -> None:
        self.drop_fresh = drop_fresh
        self.requests = self.dropped = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served = 0
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await read_request(reader)
                self.requests += 1
                if served or self.drop_fresh:
                    self.dropped += 1
                    break
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
                served += 1
        writer.close()


class ClosesIdle:
    """A loopback server that answers every request and keeps its connection, until `close_all` closes every
    connection it has, reading no more: an idle timeout (uvicorn's) that a request on a kept-alive connection
    races. A request it read whole is counted in ``requests``."""

    def __init__(self) -> None:
        self.requests = self.connections = 0
        self.writers: set[asyncio.StreamWriter] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.add(writer)
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await read_request(reader)
                self.requests += 1
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        writer.close()

    async def close_all(self) -> None:
        writers, self.writers = list(self.writers), set()
        for writer in writers:
            writer.close()
        for writer in writers:
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def serving(server: ClosesKeptAlive | ClosesIdle) -> AsyncIterator[str]:
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    finally:
        listener.close()
        await listener.wait_closed()


DROPPED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
"""What a connection closed without an answer raises, by when the close reached the client."""


def pool_transport() -> httpx.AsyncHTTPTransport:
    return replica_transport(httpx.Limits(max_connections=10, max_keepalive_connections=10), default_tls_context())


def readable(pool: httpcore.AsyncConnectionPool) -> bool:
    """Whether a connection of ``pool`` has its server's close waiting in its socket."""
    streams = [getattr(c, "_connection", None) for c in pool._connections]
    return any(s is not None and s._network_stream.get_extra_info("is_readable") for s in streams)


def closes_before(event: str, server: ClosesIdle, pool: httpcore.AsyncConnectionPool) -> Any:
    """A ``trace`` extension that, at ``event`` of a request on a kept-alive connection, has the server close its
    connections and waits until the close has come in: the race lost between handing the connection out and
    writing the request on it (its headers, or its body)."""

    raced: set[int] = set()

    async def trace(name: str, info: dict[str, Any]) -> None:
        if name == event and server.requests and server.requests not in raced:  # the first try of a request after
            raced.add(server.requests)  # one the server answered: on a kept-alive connection
            await server.close_all()
            assert await aeventually(lambda: readable(pool))

    return trace


WRITES = ["http11.send_request_headers.started", "http11.send_request_body.started"]


@pytest.mark.parametrize("event", WRITES, ids=["before_headers", "before_body"])
async def test_a_request_the_server_closed_its_kept_alive_connection_before_is_sent_again(event: str) -> None:
    server, transport = ClosesIdle(), pool_transport()
    trace = closes_before(event, server, transport._pool)
    async with serving(server) as url, httpx.AsyncClient(transport=transport) as client:
        answers = [
            await client.post(url + "/v1/embeddings", content=b"{}", extensions={"trace": trace}) for _ in range(4)
        ]
    assert [a.text for a in answers] == ["ok"] * 4
    assert (server.requests, server.connections) == (4, 4)  # each reuse raced the close, sent again on a new one


async def test_a_request_the_server_read_before_dropping_its_kept_alive_connection_is_not_sent_again() -> None:
    """The server may have acted on it (a worker that crashed on it): the failure is the attempt's (before: sent
    again at once, up to twice)."""
    server = ClosesKeptAlive()
    async with serving(server) as url, httpx.AsyncClient(transport=pool_transport()) as client:
        assert (await client.post(url + "/v1/embeddings", content=b"{}")).text == "ok"
        with pytest.raises(DROPPED):
            await client.post(url + "/v1/embeddings", content=b"{}")
    assert (server.requests, server.dropped) == (2, 1)


async def test_a_request_a_new_connection_drops_or_a_body_sent_once_is_not_sent_again() -> None:
    server = ClosesIdle()
    async with serving(server) as url:
        transport = pool_transport()
        trace = closes_before(WRITES[0], server, transport._pool)
        async with httpx.AsyncClient(transport=transport) as client:
            assert (await client.post(url + "/v1/embeddings", content=b"{}")).text == "ok"

            async def once() -> AsyncIterator[bytes]:
                yield b"{}"

            with pytest.raises(DROPPED):  # reused, but its body cannot be read again
                await client.post(url + "/v1/embeddings", content=once(), extensions={"trace": trace})
    assert (server.requests, server.connections) == (1, 1)
    server = ClosesKeptAlive(drop_fresh=True)
    async with serving(server) as url, httpx.AsyncClient(transport=pool_transport()) as client:
        with pytest.raises(DROPPED):
            await client.post(url + "/v1/embeddings", content=b"{}")
    assert server.requests == 1  # a new connection: the server saw the request


async def test_the_body_watch_counts_a_request_not_all_written_on_a_reused_connection_as_unread() -> None:
    """httpcore skips the body when writing the headers failed: such a request, on a kept-alive connection, is
    unread (sent again); one written whole on an open connection is not, nor one on a new connection."""
    pool = ReplicaPool()
    reused, fresh = httpcore.Request("POST", URL), httpcore.Request("POST", URL)
    pool._on_reused = weakref.WeakKeyDictionary({reused: FakeConnection()})

    async def body() -> AsyncIterator[bytes]:
        yield b"{}"

    skipped, written, elsewhere = (_BodyWatch(body(), pool, r) for r in (reused, reused, fresh))
    assert [chunk async for chunk in written] == [b"{}"]
    assert [chunk async for chunk in elsewhere] == [b"{}"]
    assert (skipped.unread(), written.unread(), elsewhere.unread()) == (True, False, False)


async def test_through_a_guard_a_resend_on_a_new_connection_is_not_a_retry() -> None:
    """Below the guard's retries: each call is one attempt, the budget pays for none, the replica stays healthy."""
    server = ClosesIdle()
    async with serving(server) as url, Guard([url], instrumentation=None) as guard:
        (state,) = guard._replica_set.states
        assert isinstance(state.transport, httpx.AsyncHTTPTransport)
        trace = closes_before(WRITES[0], server, state.transport._pool)
        async with guard.http_client() as client:
            with guard.capture() as calls:
                answers = [
                    await client.post(url + "/v1/chat/completions", content=b"{}", extensions={"trace": trace})
                    for _ in range(6)
                ]
        snapshot = guard.snapshot()
    assert [a.status_code for a in answers] == [200] * 6 and (server.requests, server.connections) == (6, 6)
    assert [len(call.attempts) for call in calls] == [1] * 6
    assert snapshot.budget is not None and (snapshot.budget.spent, snapshot.budget.refused) == (0, 0)
    assert snapshot.replicas[0].healthy


class Crashes:
    """A loopback server that answers ``serve`` requests, then reads each next one and closes its connection
    without answering (a worker that crashed on it)."""

    def __init__(self, serve: int) -> None:
        self.serve, self.requests = serve, 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await read_request(reader)
                self.requests += 1
                if self.requests > self.serve:
                    break
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
        writer.close()


async def test_a_request_that_crashes_the_server_on_a_warm_connection_is_sent_as_often_as_without_a_guard() -> None:
    """The SDK's three requests (max_retries=2), the guard's three attempts: not one more per attempt for the
    connection the SDK warmed (before: 4 with one idle connection, 5 with three)."""
    openai = pytest.importorskip("openai")
    sent = []
    for guarded in (False, True):
        server = Crashes(serve=1)
        async with serving(server) as url, Guard([url], instrumentation=None) as guard:
            http_client = guard.http_client_for(openai.AsyncOpenAI) if guarded else None
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", http_client=http_client) as client:
                await client.models.list()  # warms the pool: one idle connection
                with pytest.raises(openai.APIConnectionError):
                    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        sent.append(server.requests - 1)
    assert sent == [3, 3]


class ConnectsOnCue(httpcore.AsyncNetworkBackend):
    """The real network backend, each connect held until ``go`` is set; keeps the streams it made."""

    def __init__(self) -> None:
        self.connecting, self.go = anyio.Event(), anyio.Event()
        self.streams: list[httpcore.AsyncNetworkStream] = []
        self._backend = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's signature
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        self.connecting.set()
        await self.go.wait()
        stream = await self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        self.streams.append(stream)
        return stream

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


async def test_a_connection_made_while_the_pool_closed_is_closed_when_its_request_ends() -> None:
    """The Guard closes a pool it leaves for another event loop while a server-hints poll still connects on it:
    httpcore's close closes the connections it lists, not that one, which joins no list. Its request is served,
    and the connection closed as the response is (before: left open, a ResourceWarning when collected)."""
    server = ClosesKeptAlive()
    async with serving(server) as url:
        transport = pool_transport()
        backend = ConnectsOnCue()
        transport._pool._network_backend = backend
        answers: list[bytes] = []

        async def send() -> None:
            response = await transport.handle_async_request(
                httpx.Request("POST", url + "/v1/embeddings", content=b"{}")
            )
            answers.append(await response.aread())
            await response.aclose()

        async with anyio.create_task_group() as group:
            group.start_soon(send)
            await backend.connecting.wait()
            await transport.aclose()
            backend.go.set()
        (stream,) = backend.streams
        socket = stream.get_extra_info("socket")
        for _ in range(100):  # the socket is closed once the loop has run the transport's close
            if socket.fileno() == -1:
                break
            await anyio.lowlevel.checkpoint()
    assert answers == [b"ok"] and socket.fileno() == -1


async def test_a_closed_pool_opens_no_connection_for_a_new_request_or_one_still_waiting() -> None:
    """A closed Guard's pools open no new connection for anyone: a request sent after the close fails at once, and
    one that was waiting for a connection (the pool full) fails when the connection it waited for is freed (before:
    httpcore's pool opened a connection for each, after its close)."""
    server = ClosesKeptAlive()
    async with serving(server) as url:
        transport = replica_transport(httpx.Limits(max_connections=1), default_tls_context())
        first = await transport.handle_async_request(httpx.Request("POST", url + "/v1/embeddings", content=b"{}"))
        outcomes: list[BaseException | None] = []

        async def waits_for_a_connection() -> None:
            try:
                response = await transport.handle_async_request(
                    httpx.Request("POST", url + "/v1/embeddings", content=b"{}")
                )
            except httpx.ConnectError as exc:
                outcomes.append(exc)
            else:
                outcomes.append(None)
                await response.aclose()

        async with anyio.create_task_group() as group:
            group.start_soon(waits_for_a_connection)
            assert await aeventually(lambda: len(transport._pool._requests) == 2)  # queued behind the first
            await transport.aclose()
            await first.aclose()  # frees the one connection
        with pytest.raises(httpx.ConnectError, match="pool is closed"):
            await transport.handle_async_request(httpx.Request("POST", url + "/v1/embeddings", content=b"{}"))
    assert len(outcomes) == 1 and isinstance(outcomes[0], httpx.ConnectError), outcomes
    assert "pool is closed" in str(outcomes[0])
    assert server.requests == 1  # only the first request reached the server
    assert transport._pool._requests == [] and transport._pool._connections == []


@pytest.mark.skipif(not hasattr(socket, "TCP_KEEPIDLE"), reason="the keep-alive options Linux and Windows name")
async def test_a_replicas_connections_send_tcp_keepalive_probes_as_the_anthropic_sdks_do() -> None:
    """A NAT or load balancer forgets a connection silent for minutes (AWS NAT Gateway: 350 s) and drops its later
    packets: a long non-streamed answer is lost unless the client's kernel probes the connection meanwhile."""
    async with raw_server(answering_stream(b"data: [DONE]\n\n")) as url:
        async with httpx.AsyncClient(transport=default_transport(Replica(url))) as client:
            async with client.stream("POST", f"{url}/v1/chat/completions", json={"stream": True}) as response:
                sock = response.extensions["network_stream"].get_extra_info("socket")
                options = {
                    "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                    "idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                    "interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                    "probes": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                }
                await response.aread()
    assert options == {"keepalive": 1, "idle": 60, "interval": 60, "probes": 5}
