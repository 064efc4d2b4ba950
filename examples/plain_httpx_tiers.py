"""Plain httpx through a Guard: tiers per call, typed exceptions, and one JSON log line per call.

pip install -e . -e ./tools
python examples/plain_httpx_tiers.py
"""

from __future__ import annotations

import logging

import anyio
import httpx

from llmguard_client import Guard, GuardTimeout, RecordLogger, Tier
from llmguard_tools.sim.launch import spawn_cluster


async def main(urls: list[str]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    tiers = {"interactive": Tier(ttft=0.02, total=5.0, stall=1.0), "batch": Tier(ttft=10.0, total=60.0)}
    async with Guard(replicas=urls, tiers=tiers, on_record=RecordLogger()) as guard, guard.http_client() as client:
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi " * 400}], "stream": True}
        try:
            # A 400-word prompt cannot make a 20 ms first-token deadline (4 prefill steps):
            # the guard raises an httpx timeout.
            await client.post(urls[0] + "/v1/chat/completions", json=body)
        except GuardTimeout as exc:  # also an httpx.TimeoutException
            print(f"interactive: {type(exc).__name__}: {exc}")
        with guard.tier("batch"):
            response = await client.post(urls[0] + "/v1/chat/completions", json=body)
            print(f"batch: HTTP {response.status_code}, record tier {response.extensions['llmguard'].tier}")
        assert isinstance(client, httpx.AsyncClient)


if __name__ == "__main__":
    with spawn_cluster("healthy") as cluster_urls:
        anyio.run(main, cluster_urls)
