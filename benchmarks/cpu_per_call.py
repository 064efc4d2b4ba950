"""Client CPU per streamed call: the openai SDK through the guard vs the same SDK without it, interleaved.

A loopback server in a separate process streams 64-token chat completions as fast as it can, so the CPU this
process spends (time.process_time) is the client's alone. Each round runs a batch of calls through both
clients in random order; the ratio guarded/plain is over the sum of all rounds, with a 95 % bootstrap
interval over rounds. A second plain client ("plain-again") runs beside them: its ratio to plain shows how
far this machine's noise alone moves the figure in the same run. Both clients use the same
HTTP library (httpx): plain is ``AsyncOpenAI(http_client=httpx.AsyncClient())``, guarded is
``AsyncOpenAI(http_client=guard.http_client())`` with the default OpenTelemetry instrumentation (a no-op
without an SDK, as in most deployments) and hedging on (two replicas, as a real deployment would have).

``--baseline sdk`` compares instead the clients users have: plain is the SDK's own default client (httpx2 from
openai 3), guarded is ``AsyncOpenAI(http_client=guard.http_client_for(AsyncOpenAI))``. ``--no-stream`` makes each
call ask for no stream (its answer comes whole).

    python -m benchmarks.cpu_per_call [--calls 20] [--rounds 50] [--tokens 64] [--baseline httpx|sdk] [--no-stream]
        [--profile]
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import time
from typing import Any

import anyio
import httpx
import openai

from llmguard_client import Guard, Tier


def serve(port_queue: Any, tokens: int) -> None:
    from tests.loopback import LoopbackServer, Script

    server = LoopbackServer("cpu")
    server.script = Script(tokens=tokens)
    server.start()
    port_queue.put(server.url)
    while True:
        time.sleep(3600)


def start_server(tokens: int) -> tuple[multiprocessing.Process, str]:
    queue: Any = multiprocessing.Queue()
    process = multiprocessing.Process(target=serve, args=(queue, tokens), daemon=True)
    process.start()
    return process, queue.get(timeout=30)


async def one_call(client: openai.AsyncOpenAI, streamed: bool = True) -> int:
    messages: Any = [{"role": "user", "content": "x"}]
    if not streamed:
        answer = await client.chat.completions.create(model="m", messages=messages, max_tokens=64)
        return len(answer.choices)
    stream = await client.chat.completions.create(model="m", messages=messages, stream=True, max_tokens=64)
    chunks = 0
    async for _ in stream:
        chunks += 1
    return chunks


def plain_client(url: str, baseline: str) -> openai.AsyncOpenAI:
    if baseline == "sdk":  # the SDK's own default client
        return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x")
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", http_client=httpx.AsyncClient(timeout=None))


async def main(calls: int, rounds: int, tokens: int, profile: bool, baseline: str, streamed: bool) -> None:
    (p1, url1), (p2, url2) = start_server(tokens), start_server(tokens)
    guard = Guard([url1, url2], tiers={"i": Tier(ttft=10, total=60, stall=10)})
    guarded_http: Any = guard.http_client_for(openai.AsyncOpenAI) if baseline == "sdk" else guard.http_client()
    clients = {
        "plain": plain_client(url1, baseline),
        "plain-again": plain_client(url1, baseline),
        "guarded": openai.AsyncOpenAI(base_url=url1 + "/v1", api_key="x", http_client=guarded_http),
    }
    for client in clients.values():  # warm up pools and imports
        for _ in range(20):
            await one_call(client, streamed)
    per_round: dict[str, list[float]] = {name: [] for name in clients}
    rng = random.Random(1)
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
    for _ in range(rounds):
        order = list(clients)
        rng.shuffle(order)
        for name in order:
            if profiler is not None and name == "guarded":
                profiler.enable()
            start = time.process_time()
            for _ in range(calls):
                await one_call(clients[name], streamed)
            per_round[name].append(time.process_time() - start)
            if profiler is not None and name == "guarded":
                profiler.disable()
    for client in clients.values():
        await client.close()
    await guard.aclose()
    p1.terminate()
    p2.terminate()
    total = calls * rounds
    kind = "streamed calls" if streamed else "calls asking for no stream"
    print(f"{total} {kind} of {tokens} tokens per client, {rounds} interleaved rounds of {calls}, baseline {baseline}")
    print("| client | client CPU per call (µs) | / plain | 95 % interval (rounds resampled) |")
    print("|---|---|---|---|")
    for name, seconds in per_round.items():
        ratio, low, high = ratio_interval(seconds, per_round["plain"], rng)
        print(f"| {name} | {sum(seconds) / total * 1e6:.0f} | {ratio:.3f}x | {low:.3f}-{high:.3f} |")
    print("(plain-again is a second, identical plain client: its ratio is this run's noise floor)")
    if profiler is not None:
        import pstats

        pstats.Stats(profiler).sort_stats("cumtime").print_stats("llmguard", 30)


def ratio_interval(
    numerator: list[float], denominator: list[float], rng: random.Random, resamples: int = 2000
) -> tuple[float, float, float]:
    """The ratio of sums, and a 95 % bootstrap interval over rounds (paired: a round's two blocks ran together)."""
    pairs = list(zip(numerator, denominator, strict=True))
    ratios = []
    for _ in range(resamples):
        sample = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        ratios.append(sum(n for n, _ in sample) / sum(d for _, d in sample))
    ratios.sort()
    return sum(numerator) / sum(denominator), ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20, help="calls per client per round")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the guarded calls")
    parser.add_argument(
        "--baseline",
        choices=["httpx", "sdk"],
        default="httpx",
        help="httpx: both clients on httpx; sdk: the SDK's default client vs http_client_for (what users run)",
    )
    parser.add_argument("--no-stream", action="store_true", help="calls that ask for no stream")
    args = parser.parse_args()
    anyio.run(main, args.calls, args.rounds, args.tokens, args.profile, args.baseline, not args.no_stream)
