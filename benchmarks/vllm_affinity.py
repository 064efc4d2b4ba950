"""Cache-aware routing against two real vLLM engines with prefix caching: token hit rate and TTFT per policy.

Needs two vLLM (0.32) OpenAI-compatible servers on loopback, started with ``--enable-prefix-caching``:

    python -m benchmarks.vllm_affinity [--vllm http://127.0.0.1:8011 http://127.0.0.1:8012] [--sessions 30]

For each policy — ``round-robin`` (a plain client alternating the engines), ``guarded`` (``Guard(affinity=None)``)
and ``guarded-affinity`` (``Guard(affinity="auto")``) — it runs ``--sessions`` conversations of ``--turns``
turns, one request at a time: a system prompt of about ``--system-tokens`` tokens (unique to the run, the policy
and the session: the engines' caches outlive a run) and a short user message; each later turn resends the
conversation with the previous answer. Around every request it reads both engines' ``/metrics``
(``vllm:prefix_cache_queries_total``, ``vllm:prefix_cache_hits_total``), so the tokens each request queried and
found cached are its own. Hedging is off in both guards, so every request is one attempt. It prints, per
policy: the token hit rate of the later turns and of all turns, each engine's share of the requests, and the
client-side TTFT p50 of first and later turns. It exits 0 with a message, measuring nothing, when an engine
does not answer.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import httpx

from llmguard_client import Guard, Tier

MODEL = "tiny-llama"
WORDS = ("river", "stone", "lamp", "cloud", "harbor", "maple", "signal", "orbit", "copper", "meadow", "window",
         "engine", "garden", "silver", "thunder", "pocket", "violet", "canyon", "ladder", "marble")  # fmt: skip


@dataclass
class Turn:
    session: int
    turn: int
    engine: str
    ttft: float
    queries: float
    hits: float


@dataclass
class Policy:
    name: str
    turns: list[Turn] = field(default_factory=list)


async def counters(http: httpx.AsyncClient, url: str) -> tuple[float, float]:
    """An engine's (prefix-cache queries, hits) in tokens, summed over label sets."""
    text = (await http.get(url + "/metrics")).raise_for_status().text
    queries = hits = 0.0
    for line in text.splitlines():
        if line.startswith("vllm:prefix_cache_queries_total"):
            queries += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prefix_cache_hits_total"):
            hits += float(line.rsplit(" ", 1)[1])
    return queries, hits


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def calibrate(http: httpx.AsyncClient, url: str, tokens: int) -> int:
    """Words of `text` that make about ``tokens`` tokens in the engine's tokenizer."""
    sample = text(random.Random(0), 400)
    answer = (await http.post(url + "/tokenize", json={"model": MODEL, "prompt": sample})).raise_for_status().json()
    return max(1, int(400 * tokens / max(1, int(answer["count"]))))


async def stream_ttft(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[float, str, str]:
    """(seconds to the first content token, the answer's text, the engine that answered)."""
    start = time.perf_counter()
    ttft: float | None = None
    parts: list[str] = []
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    parts.append(content)
        record = response.extensions.get("llmguard")
        engine = getattr(record, "replica", None) or url
    return (ttft if ttft is not None else time.perf_counter() - start), "".join(parts), str(engine)


async def run_policy(name: str, engines: Sequence[str], args: argparse.Namespace, words: int, run_id: str) -> Policy:
    policy = Policy(name)
    guard: Guard | None = None
    tiers = {"t": Tier(ttft=120.0, total=300.0, stall=60.0)}
    if name != "round-robin":
        affinity: Literal["auto"] | None = "auto" if name == "guarded-affinity" else None
        guard = Guard(list(engines), tiers, hedge=None, instrumentation=None, affinity=affinity)
    timeout = httpx.Timeout(300.0, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout) as metrics_http:
        client = guard.http_client(timeout=timeout) if guard is not None else httpx.AsyncClient(timeout=timeout)
        async with client:
            sent = 0
            for session in range(args.sessions):
                rng = random.Random(f"{run_id}/{name}/{session}")
                messages: list[dict[str, str]] = [
                    {"role": "system", "content": f"[{run_id} {name} {session}] " + text(rng, words)}
                ]
                for turn in range(args.turns):
                    messages.append({"role": "user", "content": text(rng, 12)})
                    body = {"model": MODEL, "messages": messages, "max_tokens": args.max_tokens, "stream": True,
                            "ignore_eos": True}  # fmt: skip
                    target = engines[sent % len(engines)]  # the guard re-aims it; round-robin sends it there
                    sent += 1
                    before = [await counters(metrics_http, u) for u in engines]
                    ttft, answer, engine = await stream_ttft(client, target, body)
                    after = [await counters(metrics_http, u) for u in engines]
                    queries = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
                    hits = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
                    policy.turns.append(Turn(session, turn, engine.rstrip("/"), ttft, queries, hits))
                    messages.append({"role": "assistant", "content": answer})
    if guard is not None:
        await guard.aclose()
    return policy


def report(policy: Policy, engines: Sequence[str]) -> None:
    def rate(turns: list[Turn]) -> str:
        queries = sum(t.queries for t in turns)
        return f"{sum(t.hits for t in turns) / queries:.2f}" if queries else "-"

    def p50(values: list[float]) -> str:
        return f"{1000 * statistics.median(values):.0f} ms" if values else "-"

    later = [t for t in policy.turns if t.turn > 0]
    first = [t for t in policy.turns if t.turn == 0]
    shares = " ".join(
        f"{sum(t.engine == e.rstrip('/') for t in policy.turns) / len(policy.turns):.2f}" for e in engines
    )
    print(
        f"{policy.name:<17} hit rate later turns {rate(later)}, all turns {rate(policy.turns)}; "
        f"engine shares {shares}; TTFT p50 first {p50([t.ttft for t in first])}, later {p50([t.ttft for t in later])}"
    )


async def main(args: argparse.Namespace) -> int:
    engines = [u.rstrip("/") for u in args.vllm]
    async with httpx.AsyncClient(timeout=30.0) as http:
        try:
            for url in engines:
                (await http.get(url + "/health")).raise_for_status()
            words = await calibrate(http, engines[0], args.system_tokens)
        except httpx.HTTPError as exc:
            print(f"no vLLM engine answering at {engines} ({exc}); nothing measured")
            return 0
        for url in engines:  # warm-up: the first request on a fresh engine is slow
            await stream_ttft(http, url, {"model": MODEL, "max_tokens": 4, "stream": True, "ignore_eos": True,
                                          "messages": [{"role": "user", "content": os.urandom(8).hex()}]})  # fmt: skip
    run_id = os.urandom(4).hex()
    print(
        f"engines {engines}; {args.sessions} sessions x {args.turns} turns per policy, system prompt ~"
        f"{args.system_tokens} tokens ({words} words), max_tokens {args.max_tokens}, one request at a time"
    )
    for name in ("round-robin", "guarded", "guarded-affinity"):
        report(await run_policy(name, engines, args, words, run_id), engines)
    return 0


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm", nargs=2, default=["http://127.0.0.1:8011", "http://127.0.0.1:8012"])
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--system-tokens", type=int, default=1200)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    if not 1 <= args.sessions <= 1000 or not 1 <= args.turns <= 10:
        parser.error("--sessions must be 1-1000 and --turns 1-10")
    return args


if __name__ == "__main__":
    sys.exit(anyio.run(main, parse()))
