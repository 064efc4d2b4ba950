"""The request path in virtual time, on both backends: scripted in-memory replicas.

`FakeReplica` is an `httpx.AsyncBaseTransport` whose answers are scripted with anyio
sleeps (time to headers, to the first token, between tokens, stalls, resets, a slow close).
`run_virtual` runs a test body in virtual time on one backend: asyncio with ``looptime``
(the loop's clock jumps to the next timer whenever the loop is idle) or trio with
``MockClock(autojump_threshold=0)`` (the same, trio's way). A 2 s stall costs microseconds of
wall time and every deadline, hedge and backoff lands at its exact virtual instant.

Both backends matter: production runs the guard on asyncio, where the time source
(`llmguard_client._core.clock`) uses loop timers and loop tasks; on trio it uses cancel scopes and
a task group. Tests parametrized with `BACKENDS` run the same body through each.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import looptime
import pytest
import trio
import trio.testing

from llmguard_client import Guard, PhaseRecord
from llmguard_client._core.clock import loop_clock
from llmguard_tools.sim.wire_responses import ResponsesWire

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

BACKENDS = pytest.mark.parametrize("backend", ["asyncio", "trio"])
"""Run a test once per backend: it takes a ``backend`` argument and hands it to `run_virtual`."""


def run_virtual(main: Callable[[], Awaitable[None]], backend: str = "trio") -> None:
    """Run ``main`` in virtual time on ``backend`` ("asyncio" with looptime, or "trio" with MockClock)."""
    if backend == "trio":
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
        return
    if backend != "asyncio":
        raise ValueError(f"backend must be 'asyncio' or 'trio', got {backend!r}")
    loop = looptime.new_event_loop(start=1000.0)  # time compaction on; not 0, like a real monotonic clock
    try:
        loop.run_until_complete(_asyncio_main(main))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


async def _asyncio_main(main: Callable[[], Awaitable[None]]) -> None:
    await main()


def now() -> float:
    """The running loop's (virtual) time on the Guard's default clock's line, on either backend (trio's plus the
    run's offset, which a Guard's records and deadlines are on: `llmguard_client._core.clock.loop_clock`)."""
    return loop_clock()


def virtual_guard(fakes: dict[str, FakeReplica], records: list[PhaseRecord], **kwargs: Any) -> Guard:
    """A Guard over ``fakes`` (replica URL -> `FakeReplica`) that appends each call's record to ``records``."""
    return Guard(
        list(fakes), instrumentation=None, on_record=records.append, transport_factory=lambda r: fakes[r.url], **kwargs
    )


@dataclass
class Plan:
    """One scripted answer; times are (virtual) seconds."""

    status: int = 200
    headers_after: float = 0.0
    first_token_after: float = 0.0
    """From the headers to the first content token (a role-only chunk is sent at once)."""
    tokens: int = 5
    gap: float = 0.0
    keepalive_every: float = 0.0
    """Before the first token, an SSE comment (``: keep-alive``) this often (0: silence), as a gateway sends while a
    reasoning model thinks."""
    reset_after_tokens: int | None = None
    error_event: dict[str, Any] | None = None
    """Before the first token, an in-stream error event carrying this error object, then ``[DONE]`` (as vLLM sends
    for a full queue, or LiteLLM when its backend's stream breaks); chat streams only."""
    close_takes: float = 0.0
    """How long closing the response takes (a slow teardown while a deadline fires)."""
    retry_after: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    """More response headers (e.g. a provider's ``x-ratelimit-*``)."""
    stream: bool | None = None
    """None: follow the request's ``stream`` flag."""
    refused: bool = False
    """The connection is refused (an ``httpx.ConnectError`` after ``headers_after``)."""
    reset_before_headers: bool = False
    """The connection breaks before the answer's headers (an ``httpx.ReadError`` after ``headers_after``)."""
    before_done: float = 0.0
    """From the finish reason (and usage) to ``[DONE]``."""
    open_after_done: float = 0.0
    """From ``[DONE]`` to the body's end (a server or proxy that holds the body open)."""
    reset_after_done: bool = False
    """The connection breaks after ``[DONE]`` (an ``httpx.ReadError`` instead of the body's end)."""
    second_choice_after: float | None = None
    """A second choice (as asked with ``n=2``), whose tokens begin this long after the first choice's finish
    reason (None: one choice, whatever the request's ``n``)."""


@dataclass
class FakeReplica(httpx.AsyncBaseTransport):
    """A replica answering each request with the next `Plan` (the last one repeats)."""

    name: str
    plans: list[Plan] = field(default_factory=lambda: [Plan()])
    requests: int = 0
    open_streams: int = 0
    closed_streams: int = 0
    completed: int = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        plan = self.plans[min(self.requests, len(self.plans) - 1)]
        self.requests += 1
        body = json.loads(await request.aread() or b"{}")  # as a server reads it: a pass-through sends it as a stream
        await anyio.sleep(plan.headers_after)
        if plan.refused:
            raise httpx.ConnectError("scripted: connection refused", request=request)
        if plan.reset_before_headers:
            raise httpx.ReadError("scripted: reset before the headers", request=request)
        headers = {**plan.headers, **({"retry-after": plan.retry_after} if plan.retry_after else {})}
        if plan.status >= 400:
            return httpx.Response(plan.status, headers=headers, json={"error": {"message": "scripted"}})
        stream = body.get("stream") if plan.stream is None else plan.stream
        if not stream:
            await anyio.sleep(plan.first_token_after)
            return httpx.Response(200, json=_completion(self.name))
        self.open_streams += 1
        events = _ResponsesEvents(self, plan) if request.url.path.endswith("/responses") else _Events(self, plan)
        return httpx.Response(200, headers={"content-type": "text/event-stream", **headers}, stream=events)


class ConnectsInANursery(FakeReplica):
    """A replica whose connect never completes and, when cancelled, raises its cancellation inside an exception
    group, as trio's ``open_tcp_stream`` (its happy-eyeballs nursery) does when a cancellation meets its connect."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class() as cancelled:
            raise BaseExceptionGroup("connecting", [cancelled]) from None
        raise AssertionError("unreachable")


class _Events(httpx.AsyncByteStream):
    def __init__(self, replica: FakeReplica, plan: Plan) -> None:
        self._replica = replica
        self._plan = plan
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        plan, base = self._plan, {"id": f"chatcmpl-{self._replica.name}", "model": "m"}
        yield _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        thinking = plan.first_token_after
        while plan.keepalive_every and thinking > plan.keepalive_every:
            await anyio.sleep(plan.keepalive_every)
            thinking -= plan.keepalive_every
            yield b": keep-alive\n\n"
        await anyio.sleep(thinking)
        if plan.error_event is not None:
            yield _sse({"error": plan.error_event})
            yield b"data: [DONE]\n\n"
            return
        for i in range(plan.tokens):
            if i and plan.gap:
                await anyio.sleep(plan.gap)
            if plan.reset_after_tokens is not None and i == plan.reset_after_tokens:
                raise httpx.ReadError("scripted reset")
            yield _sse({**base, "choices": [{"index": 0, "delta": {"content": f"{self._replica.name}{i} "}}]})
        usage = {"prompt_tokens": 3, "completion_tokens": plan.tokens, "total_tokens": 3 + plan.tokens}
        if plan.second_choice_after is not None:
            yield _sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            await anyio.sleep(plan.second_choice_after)
            for i in range(plan.tokens):
                if i and plan.gap:
                    await anyio.sleep(plan.gap)
                yield _sse({**base, "choices": [{"index": 1, "delta": {"content": f"{self._replica.name}{i}' "}}]})
            usage = {**usage, "completion_tokens": 2 * plan.tokens, "total_tokens": 3 + 2 * plan.tokens}
        last = 0 if plan.second_choice_after is None else 1
        yield _sse({**base, "choices": [{"index": last, "delta": {}, "finish_reason": "stop"}], "usage": usage})
        await anyio.sleep(plan.before_done)
        yield b"data: [DONE]\n\n"
        self._replica.completed += 1
        await anyio.sleep(plan.open_after_done)
        if plan.reset_after_done:
            raise httpx.ReadError("scripted reset after [DONE]")

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._plan.close_takes:
            await anyio.sleep(self._plan.close_takes)
        self._replica.open_streams -= 1
        self._replica.closed_streams += 1


class _ResponsesEvents(_Events):
    """A Responses API stream (``/responses``): its opening (``response.created`` ... ``content_part.added``) at
    once, its first ``output_text.delta`` after ``first_token_after``, ``reset_after_tokens`` as in a chat stream."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        plan = self._plan
        wire = ResponsesWire(self._replica.name, 0, "m")
        yield wire.opening()
        await anyio.sleep(plan.first_token_after)
        for i in range(plan.tokens):
            if i and plan.gap:
                await anyio.sleep(plan.gap)
            if plan.reset_after_tokens is not None and i == plan.reset_after_tokens:
                raise httpx.ReadError("scripted reset")
            yield wire.token_of(f"{self._replica.name}{i} ")
        yield wire.closing("stop", 3, plan.tokens)
        self._replica.completed += 1


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _completion(name: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{name}",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": name}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
