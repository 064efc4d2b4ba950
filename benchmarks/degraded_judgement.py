"""The degraded judgement in virtual time: does a straggler drain a healthy replica, and how fast is a slow one drained?

    python -m benchmarks.degraded_judgement [--trials 50] [--calls 30] [--straggle 0.02] [--min-samples 1]

Two experiments through a whole `Guard` (hedging on, its defaults) against in-memory replicas, on asyncio with
looptime (the loop's clock jumps to its next timer when idle), so the machine's load does not move the figures:

- ``stragglers``: three healthy replicas (first token after 20 ms) where each answer is a 516 ms straggler with
  probability ``--straggle``; ``--trials`` fresh Guards make ``--calls`` calls each, one at a time. It counts the
  trials in which a healthy replica was drained as degraded (a log line "is degraded").
- ``degraded``: three replicas, one 10x slower to its first token (200 ms) and 5x per token; 500 calls at 40 rps
  (Poisson). It prints the calls the slow replica answered, the drained replicas, and TTFT p50 / p99.

``--min-samples 1`` judges a replica on its first sample, as the router did before it waited for
``Router.MIN_SAMPLES``: the same estimator, cost and judgement as that rule.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import looptime

from llmguard_client import Guard, PhaseRecord, Tier
from llmguard_client._routing.router import Router

CHAT = "/v1/chat/completions"
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}


class Replica(httpx.AsyncBaseTransport):
    """Streams 5 tokens; the first after ``ttft()`` seconds, the rest ``gap`` apart."""

    def __init__(self, name: str, ttft: Callable[[], float], gap: float) -> None:
        self.name, self.ttft, self.gap = name, ttft, gap

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.003)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Events(self))


class _Events(httpx.AsyncByteStream):
    def __init__(self, replica: Replica) -> None:
        self.replica = replica

    async def __aiter__(self) -> AsyncIterator[bytes]:
        def event(delta: dict[str, Any], **extra: Any) -> bytes:
            chunk = {"id": "c", "model": "m", "choices": [{"index": 0, "delta": delta, **extra}]}
            return b"data: " + json.dumps(chunk).encode() + b"\n\n"

        yield event({"role": "assistant", "content": ""})
        await asyncio.sleep(self.replica.ttft())
        for i in range(5):
            if i:
                await asyncio.sleep(self.replica.gap)
            yield event({"content": f"t{i} "})
        yield event({}, finish_reason="stop")
        yield b"data: [DONE]\n\n"


class Drains(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.drained: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "is degraded" in record.getMessage():
            self.drained.append(str(record.args[0]) if record.args else "?")  # type: ignore[index]


def run(main: Callable[[], Any]) -> Any:
    loop = looptime.new_event_loop(start=1000.0)
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def guard_over(replicas: list[Replica], records: list[PhaseRecord]) -> Guard:
    by_url = {f"http://{r.name}.test": r for r in replicas}
    return Guard(
        list(by_url),
        tiers={"t": Tier(ttft=5.0, total=30.0)},
        instrumentation=None,
        on_record=records.append,
        transport_factory=lambda r: by_url[r.url],
    )


async def one_call(client: httpx.AsyncClient) -> None:
    async with client.stream("POST", "http://r0.test" + CHAT, json=BODY) as response:
        await response.aread()


def stragglers(trials: int, calls: int, straggle: float, seed: int) -> None:
    rng = random.Random(seed)
    drains = Drains()
    logging.getLogger("llmguard_client").addHandler(drains)
    bad_trials = 0
    for _ in range(trials):
        drains.drained.clear()

        def ttft() -> float:
            return 0.516 if rng.random() < straggle else 0.020

        replicas = [Replica(f"r{i}", ttft, 0.01) for i in range(3)]
        records: list[PhaseRecord] = []

        async def main(replicas: list[Replica] = replicas, records: list[PhaseRecord] = records) -> None:
            async with guard_over(replicas, records) as guard, guard.http_client() as client:
                for _ in range(calls):
                    await one_call(client)

        run(main)
        bad_trials += bool(drains.drained)
    print(
        f"stragglers: a healthy replica drained in {bad_trials} of {trials} trials of {calls} calls "
        f"(straggler probability {straggle:.0%}, 516 ms vs 20 ms)"
    )


def degraded(calls: int, rate: float, seed: int) -> None:
    rng = random.Random(seed)
    drains = Drains()
    logging.getLogger("llmguard_client").addHandler(drains)
    replicas = [
        Replica("r0", lambda: 0.020, 0.01),
        Replica("r1", lambda: 0.200, 0.05),
        Replica("r2", lambda: 0.020, 0.01),
    ]
    records: list[PhaseRecord] = []

    async def main() -> None:
        async with guard_over(replicas, records) as guard, guard.http_client() as client:
            tasks = []
            for _ in range(calls):
                tasks.append(asyncio.ensure_future(one_call(client)))
                await asyncio.sleep(rng.expovariate(rate))
            await asyncio.gather(*tasks)

    run(main)
    winners = Counter(a.replica for r in records for a in r.attempts if a.outcome == "won")
    ttfts = sorted(r.ttft for r in records if r.ttft is not None)
    p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]
    print(
        f"degraded: slow replica answered {winners['http://r1.test']} of {calls} calls; drained {drains.drained}; "
        f"TTFT p50 {statistics.median(ttfts) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--straggle", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-samples", type=int, default=Router.MIN_SAMPLES, help="samples before judging")
    args = parser.parse_args()
    Router.MIN_SAMPLES = args.min_samples
    print(f"Router.MIN_SAMPLES = {Router.MIN_SAMPLES}")
    stragglers(args.trials, args.calls, args.straggle, args.seed)
    degraded(500, 40.0, args.seed)


if __name__ == "__main__":
    main()
