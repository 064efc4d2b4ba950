"""What every bench client measures, the same way: one `Sample` per logical request, from a `Probe`.

TTFT is the time from sending to the first SSE event whose ``choices[].delta.content`` is non-empty, e2e to
the end of the stream; completion tokens come from the final usage chunk (the number of content chunks
when there is none). `consume_sse` reads an OpenAI-style stream into a probe; `count_attempt` is an httpx
request hook counting the physical attempts of the request the probe belongs to.
"""

from __future__ import annotations

import json
import time
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import httpx

__all__ = [
    "PROBE",
    "HTTPStatus",
    "Probe",
    "Sample",
    "StreamError",
    "TierSpec",
    "consume_sse",
    "count_attempt",
]


@dataclass(frozen=True)
class TierSpec:
    """Deadlines handed to the guard (seconds); ``total`` is also the baselines' give-up time."""

    ttft: float = 1.0
    total: float = 10.0
    stall: float | None = 2.0


@dataclass
class Sample:
    """One logical request as the caller saw it."""

    index: int
    client: str
    status: str
    """``ok``, ``http_<code>``, ``timeout`` or ``error``."""
    http_status: int | None
    cause: str | None
    scheduled: float
    """Planned arrival offset, seconds."""
    lag: float
    """How late it was actually sent versus plan (generator or concurrency-cap delay)."""
    ttft: float | None
    e2e: float
    completion_tokens: int
    prompt_tokens: int | None
    attempts: int | None
    """Physical attempts the client made (None when it cannot be known)."""
    replica: str | None = None
    """Origin of the last attempt (guarded: the replica that answered)."""
    trail: str | None = None
    """guarded only: the attempts as ``kind@replica:outcome`` joined by ``>``, from the phase record."""
    waited: float | None = None
    """guarded only: seconds the guard spent waiting between rounds (Retry-After or backoff)."""
    in_attempts: float | None = None
    """guarded only: seconds during which at least one attempt was in flight (server and network time)."""
    tier: str | None = None
    """The call's tier, with ``--tier-mix`` (bench/tiermix.py)."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first: (e2e - ttft) / (tokens - 1)."""
        if not self.ok or self.ttft is None:
            return None
        if self.completion_tokens <= 1:
            return 0.0
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tpot"] = self.tpot
        return d


@dataclass
class Probe:
    """What one logical request has seen so far; survives cancellation by the deadline."""

    t0: float
    first_token: float | None = None
    content_chunks: int = 0
    usage_completion: int | None = None
    usage_prompt: int | None = None
    done: bool = False
    attempts: int = 0
    replica: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


PROBE: ContextVar[Probe | None] = ContextVar("llmguard_bench_probe", default=None)


async def count_attempt(request: httpx.Request) -> None:
    probe = PROBE.get()
    if probe is not None:
        probe.attempts += 1
        probe.replica = f"{request.url.scheme}://{request.url.netloc.decode()}"


class StreamError(Exception):
    """The SSE stream carried an error event or ended without ``[DONE]``."""


class HTTPStatus(Exception):
    """A non-200 answer (raised so tenacity can retry it; the bench reports it as ``http_<code>``)."""

    def __init__(self, status: int, cause: str | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.cause = cause


def _on_chunk(probe: Probe, obj: dict[str, Any]) -> None:
    if "error" in obj and not obj.get("choices"):
        raise StreamError(f"error event in stream: {obj['error']!r}"[:200])
    for choice in obj.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content"):
            if probe.first_token is None:
                probe.first_token = time.perf_counter()
            probe.content_chunks += 1
    usage = obj.get("usage")
    if usage:
        probe.usage_completion = usage.get("completion_tokens")
        probe.usage_prompt = usage.get("prompt_tokens")


async def consume_sse(response: httpx.Response, probe: Probe) -> None:
    """Read an OpenAI-style SSE stream to ``[DONE]``, recording first-token time and usage.

    The body is read to its end after ``[DONE]`` (as the openai SDK does), so that the connection goes back to
    the pool: left unread, its last chunk makes httpx close it, and every request then paid a new connection.
    """
    async for line in response.aiter_lines():
        if probe.done or not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            probe.done = True
        elif data:
            _on_chunk(probe, json.loads(data))
    if not probe.done:
        raise StreamError("stream ended without [DONE]")


class Replayed(NamedTuple):
    """What `replay` returns."""

    samples: list[Sample]
    wall: float
    behind: float
    """Seconds the load generator fell behind plan, at most (see `ClientRun.behind`)."""
