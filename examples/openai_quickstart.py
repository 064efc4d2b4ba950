"""Wrap an unmodified openai.AsyncOpenAI with a Guard, against the simulated cluster.

    pip install -e '.[sim]'
    python examples/openai_quickstart.py

Starts a 3-replica simulated cluster (5 % of requests stall 2 s before their first token),
sends 40 streamed chat completions through the guard, and prints what the phase records say.
"""

from __future__ import annotations

import anyio
import openai

from llmguard_client import Guard, PhaseRecord, Tier
from llmguard_client.sim.launch import spawn_cluster


async def main(urls: list[str]) -> None:
    records: list[PhaseRecord] = []
    async with Guard(
        replicas=urls,
        tiers={"interactive": Tier(ttft=1.0, total=30.0, stall=2.0), "batch": Tier(ttft=30, total=600)},
        on_record=records.append,
    ) as guard:
        client = openai.AsyncOpenAI(base_url=urls[0] + "/v1", api_key="sim", http_client=guard.http_client())
        model = (await client.models.list()).data[0].id
        for _ in range(40):
            stream = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "word " * 50}],
                max_tokens=20,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for _chunk in stream:
                pass
    calls = [r for r in records if r.path.endswith("/chat/completions")]
    hedged = [r for r in calls if r.hedged]
    worst = max(r.ttft or 0.0 for r in calls)
    print(f"{len(calls)} calls, {len(hedged)} hedged, worst TTFT {worst * 1000:.0f} ms")
    for r in hedged:
        trail = " > ".join(f"{a.kind}:{a.outcome}" for a in r.attempts)
        print(f"  {r.request_id[:8]} ttft {r.ttft * 1000 if r.ttft else float('nan'):.0f} ms  {trail}")


if __name__ == "__main__":
    with spawn_cluster("stragglers") as cluster_urls:
        anyio.run(main, cluster_urls)
