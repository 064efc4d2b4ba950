"""The read watchdog: one lazily re-armed timer bounds a live stream's reads on asyncio over HTTP/1.1.

The socket-pair tests run in virtual time (`tests.virtual.run_virtual` on asyncio, with looptime: the loop's
clock jumps to its next timer while nothing is readable), so the stall and total instants are exact."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from llmguard_client import GuardClosed, PhaseRecord, Tier
from llmguard_client._core.clock import AsyncioTime, current_time_source
from llmguard_client._stream.watchdog import ReadWatchdog
from tests.clients import plain_httpx
from tests.core.test_transport import CHAT, STREAM_BODY, make_guard
from tests.loopback import LoopbackServer, Script
from tests.virtual import run_virtual


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """Two connected sockets: the watched one (non-blocking) and its peer."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    yield ours, theirs
    ours.close()
    theirs.close()


def test_a_stall_shuts_the_socket_down_and_the_pending_read_ends(pair: tuple[socket.socket, ...]) -> None:
    async def main() -> None:
        loop, (ours, _) = asyncio.get_running_loop(), pair
        watchdog = ReadWatchdog(AsyncioTime(loop), ours, stall=0.05, total_at=loop.time() + 10)
        watchdog.start_read()
        started = loop.time()
        data = await asyncio.wait_for(loop.sock_recv(ours, 10), 5)  # the peer sends nothing
        assert data == b""  # the shutdown ended the read
        assert watchdog.tripped == "stall"
        assert loop.time() - started == pytest.approx(0.05, abs=1e-9)

    run_virtual(main, "asyncio")


def test_the_total_deadline_wins_when_it_comes_first(pair: tuple[socket.socket, ...]) -> None:
    async def main() -> None:
        loop, (ours, _) = asyncio.get_running_loop(), pair
        watchdog = ReadWatchdog(AsyncioTime(loop), ours, stall=10, total_at=loop.time() + 0.05)
        watchdog.start_read()
        started = loop.time()
        assert await asyncio.wait_for(loop.sock_recv(ours, 10), 5) == b""
        assert watchdog.tripped == "total"
        assert loop.time() - started == pytest.approx(0.05, abs=1e-9)

    run_virtual(main, "asyncio")


def test_no_read_in_progress_is_never_interrupted(pair: tuple[socket.socket, ...]) -> None:
    async def main() -> None:
        loop, (ours, theirs) = asyncio.get_running_loop(), pair
        watchdog = ReadWatchdog(AsyncioTime(loop), ours, stall=0.05, total_at=loop.time() + 10)
        watchdog.start_read()
        watchdog.reading = False  # the read returned at once; the caller then works for a while
        await asyncio.sleep(0.2)
        assert watchdog.tripped is None
        theirs.sendall(b"x")
        assert await asyncio.wait_for(loop.sock_recv(ours, 1), 5) == b"x"  # the socket is intact

    run_virtual(main, "asyncio")


def test_cancel_interrupts_and_close_drops_the_timer(pair: tuple[socket.socket, ...]) -> None:
    async def main() -> None:
        loop, (ours, theirs) = asyncio.get_running_loop(), pair
        watchdog = ReadWatchdog(AsyncioTime(loop), ours, stall=0.05, total_at=loop.time() + 10)
        watchdog.start_read()
        watchdog.close()
        await asyncio.sleep(0.15)
        assert watchdog.tripped is None  # the timer was dropped
        watchdog.cancel()
        assert watchdog.tripped == "abort"
        assert theirs.recv(1) == b""  # the peer sees the shutdown

    run_virtual(main, "asyncio")


async def test_a_response_without_a_socket_gets_no_watchdog() -> None:
    response = httpx.Response(200, extensions={"http_version": b"HTTP/1.1"})
    time_source = current_time_source()
    assert ReadWatchdog.for_response(response, stall=1, total_at=1, time_source=time_source) is None
    http2 = httpx.Response(200, extensions={"http_version": b"HTTP/2"})
    assert ReadWatchdog.for_response(http2, 1, 1, time_source) is None


async def test_a_loopback_stream_is_watched_not_scoped(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=3)
    url = servers[0].url + CHAT
    async with plain_httpx() as client, client.stream("POST", url, json=STREAM_BODY) as response:
        assert ReadWatchdog.for_response(response, stall=1, total_at=1e9, time_source=current_time_source()) is not None
        await response.aread()


def test_gaps_shorter_than_the_stall_never_cut_a_long_stream(pair: tuple[socket.socket, ...]) -> None:
    # 320 reads 20 ms apart, 6.4 s over two stall periods: the one timer must follow each read's start.
    async def main() -> None:
        loop, (ours, theirs) = asyncio.get_running_loop(), pair
        watchdog = ReadWatchdog(AsyncioTime(loop), ours, stall=3.0, total_at=loop.time() + 30)
        started = loop.time()

        async def peer() -> None:
            for _ in range(320):
                await asyncio.sleep(0.02)
                theirs.sendall(b"x")

        sender = asyncio.create_task(peer())
        for _ in range(320):
            watchdog.start_read()
            assert await loop.sock_recv(ours, 1) == b"x"
            watchdog.reading = False
        await sender
        watchdog.close()
        assert watchdog.tripped is None
        assert loop.time() - started == pytest.approx(6.4, abs=1e-6)

    run_virtual(main, "asyncio")


async def test_a_caller_pausing_between_reads_is_not_a_stall(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=5)
    records: list[PhaseRecord] = []
    # A stall limit far above the server's pace (it sends every chunk at once), one pause well past it.
    tiers = {"t": Tier(ttft=10.0, total=30.0, stall=0.5)}
    async with make_guard(servers[:1], records, tiers=tiers) as guard, guard.http_client() as client:
        async with client.stream("POST", servers[0].url + CHAT, json=STREAM_BODY) as response:
            chunks: list[bytes] = []
            async for chunk in response.aiter_raw():
                chunks.append(chunk)
                if len(chunks) == 1:
                    await asyncio.sleep(1.5)  # 3x the stall limit, but no read is waiting
    assert b"".join(chunks).endswith(b"data: [DONE]\n\n")
    assert records[0].status == "ok"


async def test_a_body_held_open_after_its_end_marker_is_no_stall(servers: list[LoopbackServer]) -> None:
    """The watched read after ``[DONE]`` waits for the body's end as without a guard (the virtual-time tests of
    tests/stream/test_body.py time it; before: `StallTimeout` once the stall passed)."""
    servers[0].script = Script(tokens=5, open_after_end=1.5)
    records: list[PhaseRecord] = []
    tiers = {"t": Tier(ttft=10.0, total=30.0, stall=0.3)}  # the body is held 5x the stall limit
    async with make_guard(servers[:1], records, tiers=tiers) as guard, guard.http_client() as client:
        async with client.stream("POST", servers[0].url + CHAT, json=STREAM_BODY) as response:
            body = await response.aread()
    assert body.endswith(b"data: [DONE]\n\n")
    assert records[0].status == "ok"


async def test_a_callers_pauses_between_watched_reads_are_not_the_replicas_time_per_token(
    servers: list[LoopbackServer],
) -> None:
    """The watched reads time the replica as the scoped ones do (tests/stream/test_body.py, in virtual time): by what
    they waited. Each pause of the caller here moves the Guard's clock 100 s on, between two reads: none of it is the
    replica's, which sent its answer at once (it was learned as more than 5 s per token)."""
    servers[0].script = Script(tokens=20)
    paused = 0.0

    def clock() -> float:
        return time.monotonic() + paused

    tiers = {"t": Tier(ttft=10.0, total=100_000.0, stall=10.0)}
    async with make_guard(servers[:1], [], tiers=tiers, clock=clock) as guard, guard.http_client() as client:
        async with client.stream("POST", servers[0].url + CHAT, json=STREAM_BODY) as response:
            async for _ in response.aiter_raw():
                paused += 100.0
        (state,) = guard._replica_set.router.states
        assert state.health.tpot is not None and state.health.tpot < 1.0


async def close_between_two_reads(server: LoopbackServer, records: list[PhaseRecord]) -> None:
    """Read a long stream's first chunk, close its Guard, and see the next read end with `GuardClosed` (also the
    trio and uvloop tests': each reads with a cancel scope where asyncio's watchdog is not used)."""
    server.script = Script(tokens=500, gap=0.01)
    guard = make_guard([server], records, tiers={"t": Tier(ttft=2.0, total=30.0, stall=5.0)})
    async with guard.http_client() as client:
        async with client.stream("POST", server.url + CHAT, json=STREAM_BODY) as response:
            iterator = response.aiter_raw()
            await iterator.__anext__()
            await guard.aclose()
            with pytest.raises(GuardClosed):
                async for _ in iterator:
                    pass


async def test_guard_close_between_reads_ends_the_next_read(servers: list[LoopbackServer]) -> None:
    records: list[PhaseRecord] = []
    await close_between_two_reads(servers[0], records)
    assert records[0].cause == "guard_closed"
    assert servers[0].wait_for(lambda: servers[0].disconnects == 1)


async def test_bytes_that_arrived_while_the_loop_was_blocked_are_not_a_stall(pair: tuple[socket.socket, ...]) -> None:
    """The server answered in time; the client's own loop was busy past the stall limit before it could
    resume the read. The watchdog confirms a stall one loop pass later, after the read's wake-up."""
    loop, (ours, theirs) = asyncio.get_running_loop(), pair
    watchdog = ReadWatchdog(AsyncioTime(loop), ours, stall=0.05, total_at=loop.time() + 10)

    async def read() -> bytes:
        watchdog.start_read()
        try:
            return await loop.sock_recv(ours, 10)
        finally:
            watchdog.reading = False

    task = asyncio.ensure_future(read())
    await asyncio.sleep(0)  # the read is waiting
    theirs.sendall(b"token")
    time.sleep(0.15)  # noqa: ASYNC251 - on purpose: the loop is blocked, the data is there, the stall timer overdue
    assert await asyncio.wait_for(task, 5) == b"token"
    assert watchdog.tripped is None
    watchdog.close()
