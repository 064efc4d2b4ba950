"""Injects the `Chaos` policy's faults into attempts, by wrapping each replica's transport.

A `ChaosTransport` sits between the attempt and the replica's connection pool, so whatever it injects reaches
the guard exactly where a real fault would: an error status or a reset as the pool's answer, a stall or a cut
in the body the attempt and the stream stages read. Only requests that carry their attempt's record builder
(``ATTEMPT_EXTENSION``: every attempt, guarded or control) are drawn for; the guard's other requests (server
hints) pass untouched. Each injected fault is marked on the attempt's record (``AttemptRecord.chaos``).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import Any

import anyio
import httpx

from llmguard_client._chaos.policy import CHAOS_ENV, EXCLUSIVE, Chaos, Fault, chaos_enabled
from llmguard_client.config import Replica
from llmguard_client.errors import GuardConfigError
from llmguard_client.protocols import protocol_for
from llmguard_client.telemetry._record_builder import ATTEMPT_EXTENSION, AttemptRecordBuilder

_STATUS: dict[Fault, tuple[int, str, str]] = {
    "status_429": (429, "rate_limit_exceeded", "rate_limit_error"),
    "status_503": (503, "service_unavailable", "overloaded_error"),
    "status_500": (500, "internal_server_error", "api_error"),
}
"""A fault's status and its error type: OpenAI's, Anthropic's (``/messages``)."""
CHAOS_HEADER = "x-llmguard-chaos"
"""Set on an injected error answer: the fault's name, so that nobody mistakes it for the replica's own."""

Draw = tuple[Chaos, "Fault | None", float]
"""(the policy in force, the attempt's fault or None, the latency to add in seconds)."""


class ChaosSwitch:
    """The `Chaos` policy in force (None: nothing injected), switchable at run time from any thread, and the
    seeded random source its draws come from (a new one, from the policy's seed, on every switch)."""

    def __init__(self, policy: Chaos | None, replicas: Collection[Replica]) -> None:
        self._state: tuple[Chaos, random.Random] | None = None
        self._names = sorted({r.name for r in replicas})
        self._known = {r.name for r in replicas} | {r.url.rstrip("/") for r in replicas}
        self.set(policy)

    @property
    def policy(self) -> Chaos | None:
        state = self._state
        return None if state is None else state[0]

    def set(self, policy: Chaos | None) -> None:
        """Inject ``policy``'s faults from the next attempt on (None: stop). ``LLMGUARD_CHAOS`` is not read again:
        it allowed chaos when this switch was built (`chaos_switch`), for the Guard's life."""
        if policy is None:
            self._state = None
            return
        if not isinstance(policy, Chaos):
            raise GuardConfigError(f"chaos must be a Chaos(...) or None, got {policy!r}")
        unknown = sorted(set(policy.replicas or ()) - self._known)
        if unknown:  # a fault test that injects nothing would pass without testing anything
            raise GuardConfigError(
                f"Chaos.replicas names {', '.join(map(repr, unknown))}, not a replica of this Guard; "
                f"accepted: its replicas' base URLs, as given to Guard(replicas=...): {self._names}"
            )
        self._state = (policy, random.Random(policy.seed))  # one assignment: a draw sees the old or the new

    def draw(self, replica: Replica) -> Draw | None:
        """The fault (and added latency) of one attempt to ``replica``; None when nothing is injected."""
        state = self._state
        if state is None:
            return None
        policy, rng = state
        targets = policy.replicas
        if targets is not None and replica.name not in targets and replica.url.rstrip("/") not in targets:
            return None
        latency = policy.latency_for if policy.latency and rng.random() < policy.latency else 0.0
        roll = rng.random()
        fault: Fault | None = None
        for field, name in EXCLUSIVE:
            rate: float = getattr(policy, field)
            if roll < rate:
                fault = name
                break
            roll -= rate
        return (policy, fault, latency) if fault is not None or latency else None

    def wrapping(
        self, factory: Callable[[Replica], httpx.AsyncBaseTransport]
    ) -> Callable[[Replica], httpx.AsyncBaseTransport]:
        """``factory`` with each transport it builds wrapped in a `ChaosTransport` drawing from this switch."""

        def build(replica: Replica) -> httpx.AsyncBaseTransport:
            return ChaosTransport(factory(replica), replica, self)

        return build


def refuse_unless_enabled() -> None:
    """Raise `GuardConfigError` unless the environment allows fault injection."""
    if not chaos_enabled():
        raise GuardConfigError(
            f"Chaos injects faults into real calls and is refused unless the environment variable {CHAOS_ENV}=1 "
            "is set (in the test or staging process only, before the Guard is built)"
        )


def chaos_switch(policy: Chaos | None, replicas: Collection[Replica]) -> ChaosSwitch | None:
    """The switch for a Guard of ``replicas`` built with ``chaos=policy``: None (no wrapping, nothing can be
    injected later) unless ``LLMGUARD_CHAOS`` is set; a policy without it is refused."""
    if policy is not None:
        if not isinstance(policy, Chaos):
            raise GuardConfigError(f"chaos must be a Chaos(...) or None, got {policy!r}")
        refuse_unless_enabled()
    return ChaosSwitch(policy, replicas) if chaos_enabled() else None


class ChaosTransport(httpx.AsyncBaseTransport):
    """One replica's transport with the switch's faults injected into the attempts sent through it."""

    def __init__(self, inner: httpx.AsyncBaseTransport, replica: Replica, switch: ChaosSwitch) -> None:
        self.inner = inner
        self._replica = replica
        self._switch = switch

    @property
    def _pool(self) -> Any:
        """The wrapped transport's connection pool (what ``guard.snapshot()`` counts open connections of)."""
        return getattr(self.inner, "_pool", None)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        attempt = request.extensions.get(ATTEMPT_EXTENSION)
        drawn = self._switch.draw(self._replica) if isinstance(attempt, AttemptRecordBuilder) else None
        if drawn is None:
            return await self.inner.handle_async_request(request)
        assert isinstance(attempt, AttemptRecordBuilder)
        policy, fault, latency = drawn
        if latency:
            attempt.attempt_chaos("latency")
            connect = _timeout(request, "connect")
            if connect is not None and connect < latency:  # a connect this slow times out in the pool
                await anyio.sleep(connect)
                raise httpx.ConnectTimeout(f"connect slowed {latency:g}s by Chaos latency: timed out", request=request)
            await anyio.sleep(latency)
        if fault in _STATUS:
            attempt.attempt_chaos(fault)
            return _status_answer(request, fault, policy)
        if fault == "reset":
            attempt.attempt_chaos(fault)
            raise httpx.ReadError("connection reset by peer (injected by Chaos)", request=request)
        response = await self.inner.handle_async_request(request)
        if fault == "stall":
            response.stream = _Stalled(_stream(response), policy.stall_for, attempt, request)
        elif fault == "cut":
            response.stream = _Cut(_stream(response), attempt)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _status_answer(request: httpx.Request, fault: Fault, policy: Chaos) -> httpx.Response:
    status, openai_type, anthropic_type = _STATUS[fault]
    headers = {"content-type": "application/json", CHAOS_HEADER: fault}
    if status == 429:
        headers.update(_retry_after(policy.retry_after))
    message = f"HTTP {status} injected by Chaos"
    protocol = protocol_for(request.method, request.url.path)
    body: dict[str, object]
    if protocol is not None and protocol.name == "messages":  # the Anthropic API's error shape
        body = {"type": "error", "error": {"type": anthropic_type, "message": message}}
    else:
        body = {"error": {"message": message, "type": openai_type, "param": None, "code": openai_type}}
    return httpx.Response(status, headers=headers, content=json.dumps(body).encode(), request=request)


def _retry_after(seconds: float) -> dict[str, str]:
    """``Retry-After`` in whole seconds (HTTP's delay-seconds), rounded up; a fractional delay also exactly, in
    ``retry-after-ms`` (which the guard and the openai and anthropic SDKs read first)."""
    headers = {"retry-after": str(math.ceil(seconds))}
    if seconds != math.ceil(seconds):
        headers["retry-after-ms"] = str(round(seconds * 1000))
    return headers


def _timeout(request: httpx.Request, phase: str) -> float | None:
    """The request's ``phase`` timeout (connect, read) in seconds, as its pool would enforce it; None: none."""
    timeout = request.extensions.get("timeout")
    value = timeout.get(phase) if isinstance(timeout, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        return None
    return float(value)


def _stream(response: httpx.Response) -> httpx.AsyncByteStream:
    stream = response.stream
    assert isinstance(stream, httpx.AsyncByteStream)
    return stream


class _Stalled(httpx.AsyncByteStream):
    """A body held back ``seconds`` from its start, its status and headers passed on at once: a replica that
    queued the call (as a vLLM server's stream does) and stalls before its first token. A read timeout shorter
    than the stall ends the read then (`httpx.ReadTimeout`), as the pool ends a real one."""

    def __init__(
        self, inner: httpx.AsyncByteStream, seconds: float, attempt: AttemptRecordBuilder, request: httpx.Request
    ) -> None:
        self._inner, self._seconds, self._attempt, self._request = inner, seconds, attempt, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self._attempt.attempt_chaos("stall")
        read = _timeout(self._request, "read")
        if read is not None and read < self._seconds:
            await anyio.sleep(read)
            raise httpx.ReadTimeout(
                f"read stalled {self._seconds:g}s by Chaos: timed out after {read:g}s", request=self._request
            )
        await anyio.sleep(self._seconds)
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Cut(httpx.AsyncByteStream):
    """A body cut at the first read after the attempt's first content token, as by a peer closing mid-body."""

    def __init__(self, inner: httpx.AsyncByteStream, attempt: AttemptRecordBuilder) -> None:
        self._inner, self._attempt = inner, attempt

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._inner.__aiter__()
        async for chunk in chunks:
            if self._attempt.first_token is not None:
                self._attempt.attempt_chaos("cut")
                await _break(chunks)
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body (injected by Chaos)"
                )
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


async def _break(chunks: AsyncIterator[bytes]) -> None:
    """End ``chunks`` as a connection cut under a read ends a real body: its next read is cancelled at once, which
    goes up through every async generator reading the body (httpx's, httpcore's), each closing what it holds (the
    connection) on its way out, so none is left suspended for the garbage collector (which trio warns of). Chunks
    already received meanwhile are dropped."""
    while True:
        with anyio.CancelScope() as scope:
            scope.cancel()
            try:
                await chunks.__anext__()
            except StopAsyncIteration:
                return
        if scope.cancelled_caught:
            return
