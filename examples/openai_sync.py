"""A sync script: openai.OpenAI through a Guard (no event loop in your code).

    python3 -m venv .venv && .venv/bin/pip install -e . -e ./tools
    .venv/bin/python examples/openai_sync.py

The guard runs its async core on one background event-loop thread, started on the first call and
stopped by ``guard.close()`` (here: the ``with`` block). Several threads may share the client.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai

from llmguard_client import Guard, PhaseRecord, Tier, guard_failure
from llmguard_tools.sim.launch import spawn_cluster


def main(urls: list[str]) -> None:
    tiers = {"interactive": Tier(ttft=1.0, total=30.0, stall=2.0), "batch": Tier(ttft=30.0, total=600.0)}
    with Guard(replicas=urls, tiers=tiers) as guard:
        http_client = guard.http_client_for(openai.OpenAI)
        client = openai.OpenAI(base_url=urls[0] + "/v1", api_key="sim", http_client=http_client)

        def ask(i: int) -> tuple[str, PhaseRecord]:
            # A capture sees the calls of its own thread (threads do not inherit context variables).
            with guard.capture() as calls:
                try:
                    done = client.chat.completions.create(
                        model="sim-model", messages=[{"role": "user", "content": f"question {i}"}], max_tokens=10
                    )
                    answer = done.choices[0].message.content or ""
                except openai.APIError as exc:
                    answer = f"failed ({guard_failure(exc) or type(exc).__name__})"
            return answer, calls[-1]

        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(ask, range(12)))
        print(f"{len(results)} answers from 4 threads, e.g. {results[0][0][:40]!r}")
        ttfts = sorted((record.ttft or 0.0) * 1000 for _, record in results)
        print(f"TTFT min {ttfts[0]:.0f} ms, max {ttfts[-1]:.0f} ms; hedged: {sum(r.hedged for _, r in results)}")

        with guard.tier("batch"), guard.capture() as batch_calls:
            stream = client.chat.completions.create(
                model="sim-model", messages=[{"role": "user", "content": "a long one"}], max_tokens=40, stream=True
            )
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        print(f"streamed {len(text.split())} words in tier {batch_calls[0].tier!r}")


if __name__ == "__main__":
    with spawn_cluster("stragglers") as cluster_urls:
        main(cluster_urls)
