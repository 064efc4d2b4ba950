"""A loopback TCP proxy that can black-hole its traffic (a partition) and follow a restarted upstream.

Every connection is forwarded byte for byte to ``upstream_host``:``upstream_port`` (read anew for each
connection, so a restarted server on another port is followed). While `partitioned`, nothing moves: bytes
already read are held, new connections are accepted but not forwarded, and every connection stays open, as a
network partition looks to both ends (bytes vanish, no reset, no FIN). When healed, the held bytes go on, as
TCP's retransmissions would deliver them. If the upstream refuses a connection (the server is down), the
client's connection is closed.

The proxies run on one event loop in a background thread (`ProxyThread`), driven from plain synchronous code.
"""

from __future__ import annotations

import threading

import anyio
import anyio.abc

__all__ = ["PartitionProxy", "ProxyThread"]

_POLL = 0.01
"""Seconds between two looks at the partition flag while partitioned."""


class PartitionProxy:
    """One proxy on 127.0.0.1:``port`` in front of ``upstream_host``:``upstream_port``; ``port`` is the one
    its listener was given once started (asking for a free port first and binding it later raced with other
    processes on a busy machine)."""

    def __init__(self, name: str, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.name = name
        self.port = 0
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.partitioned = False
        self.connections = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _healed(self) -> None:
        while self.partitioned:  # noqa: ASYNC110 - set from another thread, where an anyio.Event cannot be set
            await anyio.sleep(_POLL)

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=self.port)
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener:
            task_status.started()
            await listener.serve(self._connection)

    async def _connection(self, client: anyio.abc.SocketStream) -> None:
        self.connections += 1
        async with client:
            await self._healed()
            try:
                upstream = await anyio.connect_tcp(self.upstream_host, self.upstream_port)
            except OSError:
                return  # the server is down: the client sees its connection closed
            async with upstream, anyio.create_task_group() as tg:
                tg.start_soon(self._pump, client, upstream, tg.cancel_scope)
                await self._pump(upstream, client, tg.cancel_scope)

    async def _pump(
        self, source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream, scope: anyio.CancelScope
    ) -> None:
        try:
            async for data in source:
                await self._healed()
                await sink.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError):
            pass
        scope.cancel()


class ProxyThread:
    """Runs proxies on an event loop of their own in a daemon thread."""

    def __init__(self, proxies: list[PartitionProxy]) -> None:
        self.proxies = proxies
        self._started = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=anyio.run, args=(self._main,), daemon=True, name="partition-proxies")

    def start(self) -> None:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the proxies did not start")

    def stop(self) -> None:
        """Close every listener and connection and end the thread."""
        self._stopping = True
        self._thread.join(10)

    async def _main(self) -> None:
        async with anyio.create_task_group() as tg:
            for proxy in self.proxies:
                await tg.start(proxy.serve)
            self._started.set()
            while not self._stopping:  # noqa: ASYNC110 - set from another thread
                await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
