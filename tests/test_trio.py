"""The guard runs under trio as well as asyncio (anyio everywhere, no asyncio-only calls)."""

from __future__ import annotations

import anyio
import pytest

from llmguard_client import Guard, HedgePolicy, PhaseRecord, Tier, TTFTTimeout
from tests.loopback import LoopbackServer, Script

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
