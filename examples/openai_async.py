"""An async script: openai.AsyncOpenAI through a Guard, and the phase record of a streamed call.

    python3 -m venv .venv && .venv/bin/pip install -e . -e ./tools
    .venv/bin/python examples/openai_async.py

Starts the simulated cluster (``python -m llmguard_tools.sim --scenario stragglers``: 3 replicas, 5 %
of requests stall 2 s before their first token) and sends 20 streamed chat completions through the
guard. ``guard.http_client_for(openai.AsyncOpenAI)`` is the guarded client that the installed openai
takes (httpx for 1.x/2.x, httpx2 for >= 3), so this file passes ``mypy --strict`` with each.
"""

from __future__ import annotations

import anyio
import openai

from llmguard_client import Guard, Tier
from llmguard_tools.sim.launch import spawn_cluster


async def main(urls: list[str]) -> None:
    tiers = {"interactive": Tier(ttft=1.0, total=30.0, stall=2.0)}
    async with Guard(replicas=urls, tiers=tiers) as guard:
        client = openai.AsyncOpenAI(
            base_url=urls[0] + "/v1", api_key="sim", http_client=guard.http_client_for(openai.AsyncOpenAI)
        )
        with guard.capture() as calls:
            for _ in range(20):
                stream = await client.chat.completions.create(
                    model="sim-model",
                    messages=[{"role": "user", "content": "word " * 50}],
                    max_tokens=20,
                    stream=True,
                )
                async for _chunk in stream:
                    pass
        for record in calls:
            trail = " > ".join(f"{a.kind}@{a.replica.rsplit(':', 1)[-1]}:{a.outcome}" for a in record.attempts)
            ttft = f"{record.ttft * 1000:.0f} ms" if record.ttft is not None else "-"
            print(f"{record.request_id[:8]}  ttft {ttft:>7}  {record.status:<9}  {trail}")
        print(f"{len(calls)} calls, {sum(r.hedged for r in calls)} hedged")


if __name__ == "__main__":
    with spawn_cluster("stragglers") as cluster_urls:
        anyio.run(main, cluster_urls)
