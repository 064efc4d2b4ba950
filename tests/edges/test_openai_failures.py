"""What an openai caller sees for each guard failure (docs/usage.md's table is this test's cases).

openai >= 3 through ``guard.httpx2_client()``, default ``failure_mode="auto"`` (response mode for the
SDK) with its default ``max_retries=2``, and ``failure_mode="raise"`` with ``max_retries=0``. For each:
the exception class, its status code, ``guard_failure(exc)``, and how many requests the servers got.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from llmguard_client import Bulkhead, FailureMode, Guard, RetryPolicy, Tier, guard_failure
from tests.edges.conftest import pools
from tests.loopback import LoopbackServer, Script

openai = pytest.importorskip("openai")
pytest.importorskip("httpx2")
MESSAGES: Any = [{"role": "user", "content": "hi"}]


@dataclass(frozen=True)
class Case:
    name: str
    script: Script
    tier: Tier
    stream: bool = False
    dead_replicas: bool = False
    bulkhead_full: bool = False


# Each limit that must fire is an order of magnitude short of the server's pause (the client cuts the server off,
# so the pause costs no time), and each limit that must not fire is seconds long: a busy machine that delays the
# server's first bytes by a second must not turn one case's cause into another's (exact instants: virtual time,
# tests/layers/test_deadline.py).
CASES = [
    Case("no first token in time", Script(hang_before_headers=5.0), Tier(ttft=0.3, total=10.0)),
    Case("stream stalls after its first token", Script(tokens=5, stall_after_first=5.0), Tier(10, 20, stall=0.3), True),
    # ttft = total: a first token delayed by a busy machine still comes within ttft, and the cause stays "total".
    Case("stream outlives the total deadline", Script(tokens=300, gap=0.05), Tier(ttft=1.5, total=1.5), True),
    Case("every replica refuses the connection", Script(), Tier(ttft=10.0, total=20.0), dead_replicas=True),
    Case("the tier's bulkhead is full", Script(hang_before_headers=10.0), Tier(20, 30), bulkhead_full=True),
    Case("every replica answers 429 + Retry-After", Script(status=429, headers={"retry-after": "30"}), Tier(10, 20)),
    Case("every replica answers 500", Script(status=500), Tier(ttft=10.0, total=20.0)),
]

EXPECTED: dict[tuple[str, str], tuple[str, int | None, str | None, str]] = {
    # (case, mode): (exception, status, guard_failure, server requests)
    ("no first token in time", "auto"): ("APITimeoutError", None, "ttft_timeout", "1"),
    ("no first token in time", "raise"): ("APITimeoutError", None, "ttft_timeout", "1"),
    ("stream stalls after its first token", "auto"): ("APITimeoutError", None, "stall_timeout", "1"),
    ("stream stalls after its first token", "raise"): ("APITimeoutError", None, "stall_timeout", "1"),
    ("stream outlives the total deadline", "auto"): ("APITimeoutError", None, "total_timeout", "1"),
    ("stream outlives the total deadline", "raise"): ("APITimeoutError", None, "total_timeout", "1"),
    ("every replica refuses the connection", "auto"): ("APIConnectionError", None, "all_attempts_failed", "0"),
    ("every replica refuses the connection", "raise"): ("APIConnectionError", None, "all_attempts_failed", "0"),
    ("the tier's bulkhead is full", "auto"): ("InternalServerError", 503, "bulkhead_full", "1"),
    ("the tier's bulkhead is full", "raise"): ("APIConnectionError", None, "bulkhead_full", "1"),
    ("every replica answers 429 + Retry-After", "auto"): ("RateLimitError", 429, "upstream_status", "3"),
    ("every replica answers 429 + Retry-After", "raise"): ("RateLimitError", 429, "upstream_status", "3"),
    ("every replica answers 500", "auto"): ("InternalServerError", 500, "upstream_status", "3"),
    ("every replica answers 500", "raise"): ("InternalServerError", 500, "upstream_status", "3"),
}


async def occupy(client: Any) -> None:
    await client.with_options(max_retries=0).chat.completions.create(model="m", messages=MESSAGES)


@pytest.mark.parametrize("mode", ["auto", "raise"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_what_an_openai_caller_sees(
    servers: list[LoopbackServer], case: Case, mode: FailureMode, refused_url: Callable[[], str]
) -> None:
    for server in servers:
        server.script = case.script
    urls = [refused_url() for _ in range(3)] if case.dead_replicas else [s.url for s in servers]
    bulkheads = {"t": Bulkhead(max_in_flight=1, max_waiting=0)} if case.bulkhead_full else None
    retry = RetryPolicy(backoff_initial=0.01, backoff_max=0.02)
    async with Guard(
        urls,
        tiers={"t": case.tier},
        failure_mode=mode,
        bulkheads=bulkheads,
        retry=retry,
        instrumentation=None,
        transport_factory=pools,
    ) as guard:
        client = openai.AsyncOpenAI(
            base_url=urls[0] + "/v1",
            api_key="k",
            max_retries=2 if mode == "auto" else 0,
            http_client=guard.httpx2_client(),
        )
        caught: BaseException | None = None
        try:
            if case.bulkhead_full:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(occupy, client)  # holds the tier's only slot until cancelled
                    for _ in range(1000):  # up to 10 s, until its request is on a server: the slot is taken
                        if any(s.received for s in servers):
                            break
                        await anyio.sleep(0.01)
                    try:
                        await client.chat.completions.create(model="m", messages=MESSAGES)
                    except openai.APIError as exc:
                        caught = exc
                    tg.cancel_scope.cancel()
            elif case.stream:
                stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
                async for _ in stream:
                    pass
            else:
                await client.chat.completions.create(model="m", messages=MESSAGES)
        except openai.APIError as exc:
            caught = exc
    assert caught is not None
    expected = EXPECTED[(case.name, mode)]
    # A guard that gave up (ttft) may do so before a busy machine's server thread has recorded the request.
    servers[0].wait_for(lambda: case.dead_replicas or sum(len(s.received) for s in servers) >= int(expected[3]))
    seen = "0" if case.dead_replicas else str(sum(len(s.received) for s in servers))
    got = (type(caught).__name__, getattr(caught, "status_code", None), guard_failure(caught), seen)
    print(f"| {case.name} | {mode} | {got[0]} | {got[1]} | {got[2]} | {got[3]} |")
    assert got == expected
