"""A loopback TCP proxy that can cut one streamed answer mid-way (for benchmarks/vllm_continuation.py).

Every connection is forwarded byte for byte to ``upstream``. While a shared `Cut` is armed, the first response
that carries ``events`` server-sent events (counted by their blank-line ends, ``\\n\\n``) is forwarded up to and
including the end of its ``events``-th event, and then both of that connection's sockets are reset (``SO_LINGER``
0): the client sees a transport error mid-stream, the server a disconnect. The cut disarms itself, so one cut
happens whichever of several proxies sharing the `Cut` carries the stream. Each proxy keeps, per connection, the
request heads and bodies it forwarded and the status lines it returned, to show what was sent where.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

import anyio
import anyio.abc

__all__ = ["Cut", "CuttingProxy"]


@dataclass
class Cut:
    """Cut the next stream after ``events`` events (0: never)."""

    events: int = 0
    done: int = 0
    """Streams cut so far."""

    def arm(self, events: int) -> None:
        self.events = events


@dataclass
class Exchange:
    """What went through one proxied connection."""

    sent: bytearray = field(default_factory=bytearray)
    """The client's bytes (request heads and bodies)."""
    statuses: list[str] = field(default_factory=list)
    """The server's status lines (``HTTP/1.1 200 OK``)."""
    cut: bool = False


def _reset(stream: anyio.abc.SocketStream) -> None:
    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class CuttingProxy:
    """One listening proxy on 127.0.0.1; ``url`` once `serve` has started (use ``await tg.start(proxy.serve)``)."""

    def __init__(self, name: str, upstream_port: int, cut: Cut) -> None:
        self.name = name
        self.upstream_port = upstream_port
        self.cut = cut
        self.exchanges: list[Exchange] = []
        self.url = ""

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        self.url = f"http://127.0.0.1:{port}"
        task_status.started()
        await listener.serve(self._connection)

    async def _connection(self, client: anyio.abc.SocketStream) -> None:
        exchange = Exchange()
        self.exchanges.append(exchange)
        upstream = await anyio.connect_tcp("127.0.0.1", self.upstream_port)
        async with client, upstream, anyio.create_task_group() as tg:
            tg.start_soon(self._requests, client, upstream, exchange, tg.cancel_scope)
            await self._responses(upstream, client, exchange)
            tg.cancel_scope.cancel()

    @staticmethod
    async def _requests(
        client: anyio.abc.SocketStream,
        upstream: anyio.abc.SocketStream,
        exchange: Exchange,
        scope: anyio.CancelScope,
    ) -> None:
        try:
            async for data in client:
                exchange.sent += data
                await upstream.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        scope.cancel()

    async def _responses(
        self, upstream: anyio.abc.SocketStream, client: anyio.abc.SocketStream, exchange: Exchange
    ) -> None:
        seen = 0
        tail = b""
        try:
            async for data in upstream:
                for line in data.split(b"\r\n"):
                    if line.startswith(b"HTTP/1."):
                        exchange.statuses.append(line.decode("latin-1"))
                        seen = 0  # a new response on this connection
                limit = self.cut.events
                if limit and not exchange.cut:
                    scan = tail + data
                    start = 0
                    while (at := scan.find(b"\n\n", start)) >= 0:
                        seen += 1
                        start = at + 2
                        if seen >= limit:
                            self.cut.events, self.cut.done = 0, self.cut.done + 1
                            exchange.cut = True
                            keep = start - len(tail)
                            if keep > 0:
                                await client.send(data[:keep])
                            _reset(client)
                            _reset(upstream)
                            return
                    tail = scan[-1:]
                await client.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
