"""Streams read on uvloop's event loop (uvicorn's default when uvloop is installed). Its connections expose a socket
object whose ``shutdown()`` raises ``TypeError``, so the read watchdog, which shuts a stalled socket down, must not
watch them: each read gets a cancel scope instead, and a stall or ``Guard.aclose()`` still ends it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from llmguard_client import PhaseRecord, StallTimeout, Tier
from tests.core.test_transport import CHAT, STREAM_BODY, make_guard
from tests.loopback import LoopbackServer, Script
from tests.stream.test_watchdog import close_between_two_reads

uvloop = pytest.importorskip("uvloop")


def on_uvloop(main: Callable[[], Awaitable[None]]) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def test_closing_the_guard_ends_a_stream_read_on_uvloop(servers: list[LoopbackServer]) -> None:
    """Before: ``aclose()`` raised ``TypeError('transport sockets do not support shutdown() method')``."""
    records: list[PhaseRecord] = []
    on_uvloop(lambda: close_between_two_reads(servers[0], records))
    assert records[0].cause == "guard_closed"
    assert servers[0].wait_for(lambda: servers[0].disconnects == 1)


def test_a_stall_on_uvloop_ends_the_stream_with_a_stall_timeout(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=3, stall_after_first=30)
    records: list[PhaseRecord] = []

    async def main() -> None:
        async with make_guard(servers[:1], records, tiers={"t": Tier(ttft=2.0, total=30.0, stall=0.3)}) as guard:
            async with (
                guard.http_client() as client,
                client.stream("POST", servers[0].url + CHAT, json=STREAM_BODY) as response,
            ):
                with pytest.raises(StallTimeout):
                    async for _ in response.aiter_raw():
                        pass

    on_uvloop(main)
    assert records[0].cause == "stall_timeout"
    assert servers[0].wait_for(lambda: servers[0].disconnects == 1)
