"""One hosted endpoint behind a provider's rate limit: the plain openai SDK, the guard, the guard with `RateLimit`.

    python -m benchmarks.rate_limited_endpoint [--rps 5] [--callers 1,2] [--calls 60] [--repeats 2]
        [--retry-after seconds|ms|none]

The endpoint (a loopback server) admits requests through a token bucket, as a provider's per-key limit does:
``--rps`` tokens a second, as many held when full; a request that finds no token gets a 429 whose
``Retry-After`` is the whole seconds until the next one (``--retry-after ms``: a ``retry-after-ms`` to the
millisecond instead; ``none``: no header, as some gateways answer). ``--callers`` concurrent callers make
``--calls`` streamed chat calls in all, each as fast as the last one ends (more than the limit admits), through
``openai.AsyncOpenAI`` with its default ``max_retries=2``:

- ``plain``: the SDK's own client; it retries each 429 after its Retry-After, twice at most;
- ``guarded``: through a default Guard (tier ttft 10 s, total 60 s), which cools the endpoint for each
  Retry-After and retries the call when it ends, even past its retry budget (the server paced that retry);
- ``guarded-ratelimit``: the same with ``RateLimit(requests_per_minute=60 x rps)``, the provider's limit.

Reported per run: calls served and failed (by ``guard_failure``), the wall time, calls served per second, and
the requests the endpoint received per call. The clients alternate within each round, a fresh bucket each.
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, get_args

import anyio
import httpx
import openai

from llmguard_client import Guard, RateLimit, Tier, guard_failure
from llmguard_tools.sim.provider_limit import ProviderLimit
from tests.loopback import LoopbackServer, Script

TIER = {"interactive": Tier(ttft=10.0, total=60.0, stall=5.0)}
CLIENTS = ("plain", "guarded", "guarded-ratelimit")
RetryAfter = Literal["seconds", "ms", "none"]
"""A 429's wait until the next token: ``Retry-After`` in whole seconds, ``retry-after-ms``, or no header."""
LIMITED = {"message": "Rate limit reached for requests", "type": "requests", "code": "rate_limit_exceeded"}


class TokenBucket:
    """The endpoint's limit, as a `LoopbackServer.scripter`: the simulator's provider limit on requests only
    (``rps`` a second, ``rps`` held when full). None (answer) while it admits, else a 429 with the one header of
    ``retry_after`` and none of the ``x-ratelimit-*`` (with them, a `RateLimit` would take the 429s itself)."""

    def __init__(self, rps: float, retry_after: RetryAfter, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = ProviderLimit(RateLimit(requests_per_minute=rps * 60.0), clock)
        self.header = {"seconds": "retry-after", "ms": "retry-after-ms", "none": None}[retry_after]

    def __call__(self, index: int, attempt: int) -> Script | None:
        admitted, headers = self.limit.admit(0)
        if admitted:
            return None
        return Script(status=429, headers={k: v for k, v in headers if k == self.header}, body={"error": LIMITED})


@dataclass
class Run:
    client: str
    callers: int
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    seconds: float = 0.0
    requests: int = 0


async def one_run(client_name: str, server: LoopbackServer, callers: int, calls: int, args: argparse.Namespace) -> Run:
    server.scripter = TokenBucket(args.rps, args.retry_after)
    result = Run(client_name, callers)
    before = len(server.received)
    rate_limit = RateLimit(requests_per_minute=round(args.rps * 60)) if client_name == "guarded-ratelimit" else None
    guard = Guard([server.url], tiers=TIER, rate_limit=rate_limit)
    async with guard, httpx.AsyncClient() as plain_http:
        http = plain_http if client_name == "plain" else guard.http_client_for(openai.AsyncOpenAI)
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="bench", http_client=http)
        left = calls

        async def caller() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                try:
                    stream = await client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=5, stream=True
                    )
                    async for _ in stream:
                        pass
                    result.outcomes["served"] += 1
                except openai.APIError as exc:
                    result.outcomes[f"{type(exc).__name__} ({guard_failure(exc) or 'the server'})"] += 1

        started = time.monotonic()
        async with anyio.create_task_group() as group:
            for _ in range(callers):
                group.start_soon(caller)
        result.seconds = time.monotonic() - started
    result.requests = len(server.received) - before
    return result


def row(run: Run, calls: int, repeat: int) -> str:
    served = run.outcomes["served"]
    failed = ", ".join(f"{n} {what}" for what, n in sorted(run.outcomes.items()) if what != "served") or "-"
    return (
        f"| {run.callers} | {repeat} | {run.client} | {served} | {failed} | {run.seconds:.1f} s "
        f"| {served / run.seconds:.2f} | {run.requests / calls:.2f} |"
    )


async def main_async(args: argparse.Namespace) -> None:
    server = LoopbackServer("provider")
    server.start()
    try:
        print("| callers | round | client | served | failed | wall | served / s | requests / call |")
        print("| ---: | ---: | --- | ---: | --- | ---: | ---: | ---: |")
        for callers in args.callers:
            for repeat in range(1, args.repeats + 1):
                order = CLIENTS if repeat % 2 else tuple(reversed(CLIENTS))
                for name in order:
                    await anyio.sleep(1.0)  # the bucket of the run before refills: each run starts full
                    print(row(await one_run(name, server, callers, args.calls, args), args.calls, repeat), flush=True)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rps", type=float, default=5.0, help="the endpoint's limit, requests per second")
    parser.add_argument("--callers", type=lambda s: [int(c) for c in s.split(",")], default=[1, 2])
    parser.add_argument("--calls", type=int, default=60, help="calls per run, all callers together")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--retry-after", choices=get_args(RetryAfter), default="seconds", help="what a 429 says of when to come back"
    )
    anyio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
