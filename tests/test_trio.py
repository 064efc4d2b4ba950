"""The guard runs under trio as well as asyncio (anyio everywhere, no asyncio-only calls)."""

from __future__ import annotations

import anyio
import pytest

from llmguard_client import Guard, HedgePolicy, PhaseRecord, Tier, TTFTTimeout
from tests.loopback import LoopbackServer, Script
from tests.stream.test_watchdog import close_between_two_reads

pytest.importorskip("trio")


def test_hedged_stream_and_deadline_under_trio(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(stall_before_first=3.0)
    records: list[PhaseRecord] = []

    async def main() -> None:
        guard = Guard(
            replicas=[s.url for s in servers[:2]],
            tiers={"t": Tier(ttft=0.5, total=5.0, stall=1.0)},
            hedge=HedgePolicy(delay=0.1),
            instrumentation=None,
            on_record=records.append,
        )
        async with guard, guard.http_client() as client:
            body = {"model": "m", "messages": [], "stream": True}
            async with client.stream("POST", servers[0].url + "/v1/chat/completions", json=body) as response:
                assert b"[DONE]" in await response.aread()
            servers[1].script = Script(stall_before_first=3.0)
            with pytest.raises(TTFTTimeout):
                await client.post(servers[0].url + "/v1/chat/completions", json=body)

    anyio.run(main, backend="trio")
    assert [a.outcome for a in records[0].attempts] == ["lost", "won"]
    assert records[1].status == "timeout"


# httpcore's own body generators, cut by the close, are collected unexhausted, and trio warns of that (asyncio
# does not): a known gap, not this test's subject.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_closing_the_guard_between_two_reads_ends_the_next_one_with_guard_closed(servers: list[LoopbackServer]) -> None:
    """On trio each read has a cancel scope (no watchdog): a close that comes between two reads found the
    connection already closed at the next one and raised ``StreamTruncated``; it is ``GuardClosed``, as on asyncio."""
    records: list[PhaseRecord] = []
    anyio.run(close_between_two_reads, servers[0], records, backend="trio")
    assert records[0].cause == "guard_closed"
    assert servers[0].wait_for(lambda: servers[0].disconnects == 1)
