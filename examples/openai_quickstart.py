"""The README's quickstart, as a file: a Guard under openai.AsyncOpenAI, and a streamed call's phase record.

python3 -m venv .venv && .venv/bin/pip install -e . -e ./tools
.venv/bin/python examples/openai_quickstart.py
"""

import anyio
import openai

from llmguard_client import Guard, Tier
from llmguard_tools.sim.launch import spawn_cluster  # runs `python -m llmguard_tools.sim` for the demo


async def main(replicas: list[str]) -> None:
    async with Guard(
        replicas=replicas,  # one model's replicas (base URLs)
        tiers={"interactive": Tier(ttft=1.0, total=30.0, stall=2.0), "batch": Tier(ttft=30, total=600)},
    ) as guard:
        client = openai.AsyncOpenAI(
            base_url=replicas[0] + "/v1",
            api_key="sim",
            http_client=guard.http_client_for(openai.AsyncOpenAI),  # httpx for openai 1.x/2.x, httpx2 for >= 3
        )
        with guard.capture() as calls:  # the phase record of each call made (and finished) inside
            stream = await client.chat.completions.create(
                model="sim-model", messages=[{"role": "user", "content": "Hello!"}], max_tokens=20, stream=True
            )
            async for chunk in stream:
                print(chunk.choices[0].delta.content or "" if chunk.choices else "", end="")
        record = calls[0]  # a PhaseRecord: timestamps, status, cause, attempts (kind, replica, outcome)
        print(f"\nTTFT {(record.ttft or 0.0) * 1000:.0f} ms, {record.status}, {len(record.attempts)} attempt(s)")
        with guard.tier("batch"):  # or per call: extra_headers={"x-llmguard-tier": "batch"}
            done = await client.chat.completions.create(
                model="sim-model", messages=[{"role": "user", "content": "Summarise."}], max_tokens=20
            )
        print(done.choices[0].message.content)


with spawn_cluster("stragglers") as urls:  # a simulated 3-replica cluster on 127.0.0.1
    anyio.run(main, urls)
