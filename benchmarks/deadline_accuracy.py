"""How far past each tier limit a call really ends: ttft, stall and total, on a real loopback server.

    python -m benchmarks.deadline_accuracy [--runs 20]

Each run trips one deadline (a server that stalls) and measures the wall time from the limit's reference
point (call start for ttft/total, last chunk for stall) to the moment the caller sees the exception.
"""

from __future__ import annotations

import argparse
import time

import anyio

from llmguard_client import Guard, GuardTimeout, Tier
from llmguard_client._routing.quantile import percentile
from tests.loopback import LoopbackServer, Script

BODY = {"model": "m", "messages": [], "stream": True}
TIER = Tier(ttft=0.3, total=0.6, stall=0.2)


async def overshoot(server: LoopbackServer, guard: Guard, kind: str) -> float:
    server.script = {
        "ttft": Script(keepalives_before=2, stall_before_first=5.0),
        "stall": Script(tokens=5, stall_after_first=5.0),
        "total": Script(tokens=1000, gap=0.01),
    }[kind]
    async with guard.http_client() as client:
        start = last = time.monotonic()
        try:
            async with client.stream("POST", server.url + "/v1/chat/completions", json=BODY) as response:
                async for _ in response.aiter_raw():
                    last = time.monotonic()
        except GuardTimeout:
            end = time.monotonic()
        else:
            raise AssertionError(f"{kind}: no deadline tripped")
    limit = {"ttft": TIER.ttft, "stall": TIER.stall, "total": TIER.total}[kind]
    reference = last if kind == "stall" else start
    return end - reference - limit  # type: ignore[operator]


async def main(runs: int) -> None:
    server = LoopbackServer("deadline")
    server.start()
    guard = Guard(replicas=[server.url], tiers={"t": TIER}, hedge=None, instrumentation=None)
    print(f"tier {TIER}; {runs} runs each; overshoot = wall time past the limit, ms")
    print("| deadline | p50 | p95 | max |")
    print("|---|---|---|---|")
    for kind in ("ttft", "stall", "total"):
        values = [1000 * await overshoot(server, guard, kind) for _ in range(runs)]
        p50, p95, top = (percentile(values, p) for p in (50, 95, 100))
        print(f"| {kind} | {p50:.1f} | {p95:.1f} | {top:.1f} |")
    await guard.aclose()
    server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    anyio.run(main, parser.parse_args().runs)
