"""One client process of ``llmguard bench --processes N``: ``python -m llmguard_tools.bench.fleet_worker JSON``.

It waits until the common start instant, sends open-loop Poisson traffic (streamed chat calls of the simulated
cluster's sizes) for the run's duration through its own client (``plain`` httpx, or its own `Guard` with a
per-process or fleet-wide `RateLimit`), and prints one JSON line: calls, completed calls, TTFTs, 429s received,
calls refused by the guard's rate limit, and attempts sent.
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
import time
from typing import Any

import anyio
import httpx

from llmguard_client import Guard, PhaseRecord, RateLimit, Tier
from llmguard_client.causes import guard_failure
from llmguard_tools.bench.measure import Probe, StreamError, consume_sse
from llmguard_tools.sim.scenarios import SIM_MAX_TOKENS, SIM_PROMPT_WORDS


class _Tally:
    def __init__(self) -> None:
        self.calls = self.ok = self.received_429 = self.refused = 0
        self.ttfts: list[float] = []
        self.failed: dict[str, int] = {}
        """Calls that did not complete, by the guard's cause (``"ttft_timeout"``, ...) or the HTTP status."""

    def fail(self, cause: str) -> None:
        self.failed[cause] = self.failed.get(cause, 0) + 1


async def _one(client: httpx.AsyncClient, url: str, body: dict[str, Any], tally: _Tally) -> None:
    tally.calls += 1
    probe = Probe(t0=time.perf_counter())
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code == 429:
                tally.received_429 += 1
            if response.status_code != 200:
                await response.aread()
                cause = response.headers.get("x-llmguard-cause")
                if cause == "rate_limited":
                    tally.refused += 1
                tally.fail(cause or f"http_{response.status_code}")
                return
            await consume_sse(response, probe)  # to the body's end: the connection goes back to the pool
    except httpx.HTTPError as exc:
        cause = guard_failure(exc) or type(exc).__name__
        if cause == "rate_limited":
            tally.refused += 1
        tally.fail(cause)
        return
    except StreamError:
        tally.fail("stream_error")
        return
    if probe.first_token is not None:
        tally.ok += 1
        tally.ttfts.append(probe.first_token - probe.t0)
    else:
        tally.fail("no_content")


async def _main(spec: dict[str, Any]) -> dict[str, Any]:
    urls: list[str] = spec["urls"]
    mode: str = spec["mode"]
    rng = random.Random(spec["seed"])
    tally, records = _Tally(), list[PhaseRecord]()
    guard: Guard | None = None
    if mode == "plain":
        client = httpx.AsyncClient(timeout=httpx.Timeout(spec["total"], connect=5.0))
    else:
        limit = RateLimit(**spec["limit"])
        fleet = {"fleet": spec["fleet_url"], "name": spec["run_id"]} if mode == "fleet" else {}
        guard = Guard(
            urls,
            tiers={"bench": Tier(ttft=spec["ttft"], total=spec["total"])},
            rate_limit=limit,
            instrumentation=None,
            on_record=records.append,
            failure_mode="raise",
            **fleet,
        )
        client = guard.http_client()
    transitions = 0
    async with contextlib.AsyncExitStack() as stack:
        if guard is not None and spec.get("connect", "early") == "early":
            await stack.enter_async_context(guard)  # its store connects now, while the processes wait to start
        elif guard is not None:
            stack.push_async_callback(guard.aclose)  # its store connects on the first call
        await anyio.sleep(max(0.0, spec["start_at"] - time.time()))
        end = time.monotonic() + spec["duration"]
        async with client, anyio.create_task_group() as tg:
            n = 0
            while time.monotonic() < end:
                words, max_tokens = SIM_PROMPT_WORDS.sample(rng), SIM_MAX_TOKENS.sample(rng)
                body = {
                    "model": "sim-model",
                    "messages": [{"role": "user", "content": " ".join(["w"] * words)}],
                    "max_tokens": max_tokens,
                    "stream": True,
                    "ignore_eos": True,
                    "stream_options": {"include_usage": True},
                }
                tg.start_soon(_one, client, urls[n % len(urls)] + "/v1/chat/completions", body, tally)
                n += 1
                await anyio.sleep(rng.expovariate(spec["rate"]))
        store = guard.snapshot().fleet if guard is not None else None
        transitions = store.transitions if store is not None else 0
    attempts = sum(len(r.attempts) for r in records) if guard is not None else tally.calls
    return {
        "calls": tally.calls,
        "ok": tally.ok,
        "ttfts": tally.ttfts,
        "received_429": tally.received_429,
        "refused": tally.refused,
        "failed": tally.failed,
        "attempts": attempts,
        "fleet_transitions": transitions,
    }


if __name__ == "__main__":
    print(json.dumps(anyio.run(_main, json.loads(sys.argv[1]))))
