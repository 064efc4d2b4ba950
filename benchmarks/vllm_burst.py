"""A burst of simultaneous streaming chat calls against a real vLLM and one loopback replica.

vLLM 0.32 rejects a queue overflow (``--max-num-queued-reqs``) with a plain 503 when its pre-flight check sees it,
and with HTTP 200 + ``data: {"error": {..., "code": 503}}`` + ``[DONE]`` for streams that race past that check.
This sends ``--calls`` simultaneous openai-SDK streams through: plain openai clients round-robin over the two
replicas (``max_retries=0`` and the defaults), then the guard (default budget, then a generous one), and prints
what the callers got and what the guard recorded. Needs a vLLM (0.32) server on loopback, serving any model,
started with ``--max-num-seqs 1 --max-num-queued-reqs 1``:

    python -m benchmarks.vllm_burst --vllm http://127.0.0.1:8031 [--calls 12]
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Callable

import anyio
import openai

from llmguard_client import BudgetPolicy, Guard, PhaseRecord, Tier
from tests.loopback import LoopbackServer, Script


async def burst(make_client: Callable[[int], openai.AsyncOpenAI], calls: int) -> dict[str, int]:
    outcomes: collections.Counter[str] = collections.Counter()

    async def one(i: int) -> None:
        try:
            stream = await make_client(i).chat.completions.create(
                model="tiny-llama", messages=[{"role": "user", "content": "hello"}], max_tokens=20, stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            outcomes["ok" if text else "ok-empty"] += 1
        except openai.APIError as exc:
            outcomes[type(exc).__name__] += 1

    async with anyio.create_task_group() as tg:
        for i in range(calls):
            tg.start_soon(one, i)
    return dict(outcomes)


async def main(vllm: str, calls: int) -> None:
    loopback = LoopbackServer("loopback")
    loopback.start()
    loopback.script = Script(tokens=5)
    urls = [vllm.rstrip("/"), loopback.url]
    for label, retries in (("openai max_retries=0", 0), ("openai defaults (max_retries=2)", 2)):
        clients = [openai.AsyncOpenAI(base_url=u + "/v1", api_key="sk", max_retries=retries) for u in urls]
        print(f"{label}, round-robin: {await burst(lambda i, cs=clients: cs[i % 2], calls)}")
    for label, budget in (("guard, default budget", None), ("guard, BudgetPolicy(ratio=1, floor=12)", 12)):
        records: list[PhaseRecord] = []
        extra = {} if budget is None else {"budget": BudgetPolicy(ratio=1.0, floor=budget)}
        tiers = {"t": Tier(ttft=20.0, total=60.0)}
        async with Guard(replicas=urls, tiers=tiers, instrumentation=None, on_record=records.append, **extra) as g:
            client = openai.AsyncOpenAI(base_url=urls[0] + "/v1", api_key="sk", http_client=g.http_client())
            outcome = await burst(lambda i, c=client: c, calls)
        statuses = collections.Counter(f"{r.status}/{r.cause}" for r in records)
        failed = collections.Counter(a.error for r in records for a in r.attempts if a.outcome == "failed")
        print(f"{label}: callers {outcome}; records {dict(statuses)}; failed attempts {dict(failed)}")
    loopback.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm", required=True, help="the vLLM server's base URL, e.g. http://127.0.0.1:8031")
    parser.add_argument("--calls", type=int, default=12)
    args = parser.parse_args()
    anyio.run(main, args.vllm, args.calls)
