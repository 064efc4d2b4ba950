"""The clients the bench compares, each sending one streaming chat completion per planned request.

* ``plain``           httpx.AsyncClient, one attempt, round-robin over the replicas.
* ``openai-default``  the real ``openai.AsyncOpenAI`` with its defaults (``max_retries=2``, honours
                      Retry-After up to 60 s), one SDK client per replica, round-robin.
* ``naive-retry``     what users write today: a tenacity loop retrying 429 / 5xx / connection errors up
                      to 3 times (4 attempts) with short exponential backoff (0.1 s, 0.2 s, 0.4 s, no
                      jitter, Retry-After ignored), each attempt to the next replica. It only retries
                      before the first token: after that, a retry would repeat text the user has seen.
* ``guarded``         this library: ``Guard(...).http_client()``; also ``guarded-nohedge`` and
                      ``guarded-noretry`` (``hedge=None`` / ``retry=None``) for ablations.

Every client is measured the same way, client-side: TTFT is the time from sending to the first SSE
event whose ``choices[].delta.content`` is non-empty, e2e to the end of the stream; completion tokens
come from the final usage chunk (the number of content chunks when there is none). The whole logical
request runs under one harness deadline (the user giving up): the tier's ``total`` for the baselines,
and ``total`` + 1 s as a safety net for the guarded clients, which enforce their own tier.
"""

from __future__ import annotations

import importlib
import itertools
import json
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio
import httpx

from llmguard_client.bench.traffic import PlannedRequest

CLIENT_NAMES = ("plain", "openai-default", "naive-retry", "guarded", "guarded-nohedge", "guarded-noretry", "rollout")

_POOL_LIMITS = httpx.Limits(max_connections=4096, max_keepalive_connections=512, keepalive_expiry=5.0)


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
class _Probe:
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


_PROBE: ContextVar[_Probe | None] = ContextVar("llmguard_bench_probe", default=None)


async def _count_attempt(request: httpx.Request) -> None:
    probe = _PROBE.get()
    if probe is not None:
        probe.attempts += 1
        probe.replica = f"{request.url.scheme}://{request.url.netloc.decode()}"


class StreamError(Exception):
    """The SSE stream carried an error event or ended without ``[DONE]``."""


class _Status(Exception):
    """A non-200 answer (raised so tenacity can retry it)."""

    def __init__(self, status: int, cause: str | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.cause = cause


def _on_chunk(probe: _Probe, obj: dict[str, Any]) -> None:
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


async def consume_sse(response: httpx.Response, probe: _Probe) -> None:
    """Read an OpenAI-style SSE stream to ``[DONE]``, recording first-token time and usage."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            probe.done = True
            return
        if data:
            _on_chunk(probe, json.loads(data))
    raise StreamError("stream ended without [DONE]")


class BenchClient(ABC):
    """A named client that runs one logical request per call to `run`."""

    name: str = "?"

    def __init__(
        self,
        urls: Sequence[str],
        *,
        model: str,
        tier: TierSpec,
        deadline: float | None = None,
        api_key: str | None = None,
    ):
        if not urls:
            raise ValueError("at least one replica URL is needed")
        self.urls = [u.rstrip("/") for u in urls]
        self.model = model
        self.tier = tier
        self.api_key = api_key
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.deadline = deadline if deadline is not None else tier.total
        self._rr = itertools.cycle(range(len(self.urls)))

    def next_url(self) -> str:
        return self.urls[next(self._rr)]

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Build connections etc. (inside the event loop)."""

    @abstractmethod
    async def aclose(self) -> None: ...

    @abstractmethod
    async def _send(self, body: dict[str, Any], probe: _Probe) -> None:
        """Send ``body`` and consume the answer into ``probe``; raise `_Status` for non-200."""

    async def run(self, req: PlannedRequest, body: dict[str, Any], scheduled_at: float) -> Sample:
        """Run one logical request. ``scheduled_at`` is the planned send time (perf_counter clock)."""
        probe = _Probe(t0=time.perf_counter())
        token = _PROBE.set(probe)
        status: str = "ok"
        http_status: int | None = 200
        cause: str | None = None
        try:
            with anyio.fail_after(self.deadline):
                await self._send(body, probe)
        except _Status as exc:
            status, http_status, cause = f"http_{exc.status}", exc.status, exc.cause
        except TimeoutError:
            status, http_status, cause = "timeout", None, "harness_deadline"
        except Exception as exc:
            status, http_status, cause = self.classify(exc, probe)
        finally:
            _PROBE.reset(token)
        end = time.perf_counter()
        completion = probe.usage_completion if probe.usage_completion is not None else probe.content_chunks
        return Sample(
            index=req.index,
            client=self.name,
            status=status,
            http_status=http_status,
            cause=cause,
            scheduled=req.arrival,
            lag=max(0.0, probe.t0 - scheduled_at),
            ttft=None if probe.first_token is None else probe.first_token - probe.t0,
            e2e=end - probe.t0,
            completion_tokens=completion,
            prompt_tokens=probe.usage_prompt,
            attempts=self.attempts_of(probe),
            replica=self.replica_of(probe),
            trail=self.trail_of(probe),
            waited=self.waited_of(probe),
            in_attempts=self.in_attempts_of(probe),
        )

    def attempts_of(self, probe: _Probe) -> int | None:
        return probe.attempts or None

    def waited_of(self, probe: _Probe) -> float | None:
        return None

    def in_attempts_of(self, probe: _Probe) -> float | None:
        return None

    def replica_of(self, probe: _Probe) -> str | None:
        return probe.replica

    def trail_of(self, probe: _Probe) -> str | None:
        return None

    def classify(self, exc: Exception, probe: _Probe) -> tuple[str, int | None, str | None]:
        if isinstance(exc, httpx.TimeoutException):
            return "timeout", None, type(exc).__name__
        return "error", None, f"{type(exc).__name__}: {exc}"[:160]


async def _stream_once(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], probe: _Probe
) -> httpx.Response:
    async with http.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise _Status(response.status_code, response.headers.get("x-llmguard-cause"))
        await consume_sse(response, probe)
        return response


class PlainClient(BenchClient):
    name = "plain"

    async def start(self) -> None:
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(self.deadline),
            limits=_POOL_LIMITS,
            headers=self.headers,
            event_hooks={"request": [_count_attempt]},
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, body: dict[str, Any], probe: _Probe) -> None:
        await _stream_once(self._http, self.next_url() + "/v1/chat/completions", body, probe)


class NaiveRetryClient(PlainClient):
    name = "naive-retry"
    RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

    async def _send(self, body: dict[str, Any], probe: _Probe) -> None:
        from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

        def retryable(exc: BaseException) -> bool:
            if probe.first_token is not None:
                return False
            if isinstance(exc, _Status):
                return exc.status in self.RETRY_STATUSES
            return isinstance(exc, httpx.TransportError)

        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(4),
            wait=wait_exponential(multiplier=0.1, min=0.1, max=1.0),
            retry=retry_if_exception(retryable),
            reraise=True,
        ):
            with attempt:
                await _stream_once(self._http, self.next_url() + "/v1/chat/completions", body, probe)


class OpenAIDefaultClient(BenchClient):
    name = "openai-default"

    async def start(self) -> None:
        import openai

        self._openai = openai
        self._clients = [
            openai.AsyncOpenAI(
                base_url=u + "/v1",
                api_key=self.api_key or "bench",
                http_client=openai.DefaultAsyncHttpxClient(event_hooks={"request": [_count_attempt]}),
            )
            for u in self.urls
        ]

    async def aclose(self) -> None:
        for c in self._clients:
            await c.close()

    async def _send(self, body: dict[str, Any], probe: _Probe) -> None:
        client = self._clients[next(self._rr)]
        stream = await client.chat.completions.create(
            model=body["model"],
            messages=body["messages"],
            max_tokens=body["max_tokens"],
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": body.get("ignore_eos", True)},
        )
        try:
            async for chunk in stream:
                for choice in chunk.choices:
                    if choice.delta is not None and choice.delta.content:
                        if probe.first_token is None:
                            probe.first_token = time.perf_counter()
                        probe.content_chunks += 1
                if chunk.usage is not None:
                    probe.usage_completion = chunk.usage.completion_tokens
                    probe.usage_prompt = chunk.usage.prompt_tokens
        finally:
            await stream.close()
        probe.done = True

    def classify(self, exc: Exception, probe: _Probe) -> tuple[str, int | None, str | None]:
        oa = self._openai
        if isinstance(exc, oa.APITimeoutError):
            return "timeout", None, "APITimeoutError"
        if isinstance(exc, oa.APIStatusError):
            return f"http_{exc.status_code}", exc.status_code, exc.response.headers.get("x-llmguard-cause")
        if isinstance(exc, oa.APIConnectionError):
            return "error", None, f"APIConnectionError: {exc.__cause__ or exc}"[:160]
        return super().classify(exc, probe)


def guard_api() -> tuple[Any, Any]:
    """``(Guard, Tier)`` from the core, imported lazily; RuntimeError with a clear message if absent."""
    try:
        mod = importlib.import_module("llmguard_client")
        return mod.Guard, mod.Tier
    except (ImportError, AttributeError) as exc:
        raise RuntimeError(f"the guarded client needs llmguard_client.Guard and Tier ({exc})") from exc


class GuardedClient(BenchClient):
    name = "guarded"
    guard_kwargs: dict[str, Any] = {}  # noqa: RUF012 - per-class constant, never mutated

    def __init__(
        self,
        urls: Sequence[str],
        *,
        model: str,
        tier: TierSpec,
        deadline: float | None = None,
        api_key: str | None = None,
    ):
        deadline = deadline if deadline is not None else tier.total + 1
        super().__init__(urls, model=model, tier=tier, deadline=deadline, api_key=api_key)

    async def start(self) -> None:
        guard_cls, tier_cls = guard_api()
        self._guard = guard_cls(
            replicas=list(self.urls),
            tiers={
                "interactive": tier_cls(ttft=self.tier.ttft, total=self.tier.total, stall=self.tier.stall)
            },
            default_tier="interactive",
            **self.guard_kwargs,
        )
        self._http: httpx.AsyncClient = self._guard.http_client()
        self._http.headers.update(self.headers)

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._guard.aclose()

    async def _send(self, body: dict[str, Any], probe: _Probe) -> None:
        # The guard rewrites the origin to the replica it picks; urls[0] is only a placeholder.
        url = self.urls[0] + "/v1/chat/completions"
        async with self._http.stream("POST", url, json=body) as response:
            try:
                if response.status_code != 200:
                    await response.aread()
                    raise _Status(response.status_code, response.headers.get("x-llmguard-cause"))
                await consume_sse(response, probe)
            finally:
                probe.extra["record"] = response.extensions.get("llmguard")

    def waited_of(self, probe: _Probe) -> float | None:
        """Gaps before retry rounds, during which no attempt of the call was running."""
        attempts = getattr(probe.extra.get("record"), "attempts", None) or []
        waited, last_end = 0.0, None
        for attempt in attempts:
            if attempt.kind == "retry" and last_end is not None:
                waited += max(0.0, attempt.start - last_end)
            if attempt.finish is not None:
                last_end = attempt.finish if last_end is None else max(last_end, attempt.finish)
        return waited

    def in_attempts_of(self, probe: _Probe) -> float | None:
        """Length of the union of the attempts' [start, finish] intervals."""
        attempts = getattr(probe.extra.get("record"), "attempts", None) or []
        spans = sorted((a.start, a.finish) for a in attempts if a.finish is not None)
        total, end = 0.0, -math.inf
        for start, finish in spans:
            if finish > end:
                total += finish - max(start, end)
                end = finish
        return total

    def attempts_of(self, probe: _Probe) -> int | None:
        record = probe.extra.get("record")
        attempts = getattr(record, "attempts", None)
        return len(attempts) if attempts is not None else None

    def replica_of(self, probe: _Probe) -> str | None:
        record = probe.extra.get("record")
        replica = getattr(record, "replica", None)
        if replica is None:
            attempts = getattr(record, "attempts", None) or []
            replica = getattr(attempts[-1], "replica", None) if attempts else None
        return None if replica is None else str(replica)

    def trail_of(self, probe: _Probe) -> str | None:
        attempts = getattr(probe.extra.get("record"), "attempts", None)
        if not attempts:
            return None
        parts = []
        for a in attempts:
            replica = str(getattr(a, "replica", "?")).rsplit(":", 1)[-1]
            code = getattr(a, "status_code", None)
            kind, outcome = getattr(a, "kind", "?"), getattr(a, "outcome", "?")
            parts.append(f"{kind}@{replica}:{outcome}{'/' + str(code) if code else ''}")
        return ">".join(parts)

    def classify(self, exc: Exception, probe: _Probe) -> tuple[str, int | None, str | None]:
        cause = getattr(exc, "cause", None)
        record = getattr(exc, "record", None)
        if record is not None:
            probe.extra["record"] = record
        if cause is not None and not isinstance(exc, httpx.TimeoutException):
            # A guard failure raised instead of returned: report it as the HTTP answer it stands for.
            code = getattr(exc, "status_code", None)
            if isinstance(code, int):
                return f"http_{code}", code, str(cause)
        if isinstance(exc, httpx.TimeoutException):
            return "timeout", None, str(cause) if cause is not None else type(exc).__name__
        return super().classify(exc, probe)


class GuardedNoHedgeClient(GuardedClient):
    name = "guarded-nohedge"
    guard_kwargs = {"hedge": None}  # noqa: RUF012


class GuardedNoRetryClient(GuardedClient):
    name = "guarded-noretry"
    guard_kwargs = {"retry": None}  # noqa: RUF012


_CLIENTS: dict[str, type[BenchClient]] = {
    c.name: c
    for c in (
        PlainClient,
        OpenAIDefaultClient,
        NaiveRetryClient,
        GuardedClient,
        GuardedNoHedgeClient,
        GuardedNoRetryClient,
    )
}


def parse_clients(spec: str) -> list[str]:
    """Validate a comma-separated client list (order kept, duplicates dropped)."""
    names: list[str] = []
    for raw in spec.split(","):
        name = raw.strip()
        if not name:
            continue
        if name not in CLIENT_NAMES:
            raise ValueError(f"unknown client {name!r}; choose from {', '.join(CLIENT_NAMES)}")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError("--clients is empty")
    return names


def make_client(
    name: str,
    urls: Sequence[str],
    *,
    model: str,
    tier: TierSpec,
    deadline: float | None = None,
    api_key: str | None = None,
    rollout: float | None = None,
    records: str | None = None,
) -> BenchClient:
    if name == "rollout":  # bench/rollout.py: a Guard at a partial rollout, records for `llmguard compare`
        from llmguard_client.bench.rollout import RolloutClient

        return RolloutClient(
            urls, model=model, tier=tier, deadline=deadline, api_key=api_key, fraction=rollout, records=records
        )
    if name not in _CLIENTS:
        raise ValueError(f"unknown client {name!r}; choose from {', '.join(CLIENT_NAMES)}")
    return _CLIENTS[name](urls, model=model, tier=tier, deadline=deadline, api_key=api_key)


ClientFactory = Callable[[str, Sequence[str]], BenchClient]
