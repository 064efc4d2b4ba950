"""The guarded clients: this library as a bench client, ``Guard(...).http_client()``.

``guarded`` uses the default policies; ``guarded-nohedge`` and ``guarded-noretry`` (``hedge=None`` /
``retry=None``) are ablations; ``guarded-affinity`` and ``guarded-noaffinity`` set cache-aware routing
(``affinity="auto"`` / ``affinity=None``) whatever the default; ``guarded-admission`` adds ``Admission()`` and
``guarded-hints`` polls the replicas' ``/metrics`` for their queues. Besides the sample, each reads the guard's
phase record (attempts, waits, the replica that answered) from the response's ``llmguard`` extension.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import httpx

from llmguard_tools.bench.client_base import BenchClient
from llmguard_tools.bench.measure import HTTPStatus, Probe, TierSpec, consume_sse
from llmguard_tools.bench.tiermix import DEFAULT_TIER, TIERS

TIER_HEADER = "x-llmguard-tier"
FLEET_CONNECT_WITHIN = 5.0
"""Seconds a fleet Guard waits for its store before the traffic starts (past them it starts on local state)."""
"""Which of the Guard's tiers a call is on."""

__all__ = [
    "GuardedAdmissionClient",
    "GuardedAffinityClient",
    "GuardedClient",
    "GuardedContinuationClient",
    "GuardedHintsClient",
    "GuardedNoAffinityClient",
    "GuardedNoHedgeClient",
    "GuardedNoRetryClient",
    "guard_api",
]


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
    fleet: tuple[str, str] | None = None
    """``(Redis URL, fleet name)``: the Guard shares its fleet state there (``--guard-processes N --fleet``)."""

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
                "interactive": tier_cls(ttft=self.tier.ttft, total=self.tier.total, stall=self.tier.stall),
                **{
                    name: tier_cls(ttft=spec.ttft, total=spec.total, stall=spec.stall)
                    for name, spec in TIERS.items()
                    if name in self.tiers
                },
            },
            default_tier="interactive",
            **self.guard_kwargs,
            **({"fleet": self.fleet[0], "name": self.fleet[1]} if self.fleet else {}),
        )
        self._http: httpx.AsyncClient = self._guard.http_client()
        self._http.headers.update(self.headers)
        if self.fleet:
            await self._connected()

    async def _connected(self, within: float = FLEET_CONNECT_WITHIN) -> None:
        """Connect the Guard's fleet store before the traffic starts (the processes wait for each other's start):
        otherwise a short run's first calls, or all of them, ran on local state alone."""
        await self._guard.__aenter__()
        with anyio.move_on_after(within):
            while not ((fleet := self._guard.snapshot().fleet) and fleet.connected):  # noqa: ASYNC110 - polled
                await anyio.sleep(0.02)

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._guard.aclose()

    async def _send(self, body: dict[str, Any], probe: Probe) -> None:
        # The guard rewrites the origin to the replica it picks; urls[0] is only a placeholder.
        url = self.urls[0] + "/v1/chat/completions"
        extensions: Mapping[str, Any] = {}
        tier = probe.extra.get("tier")
        headers = {TIER_HEADER: tier} if tier not in (None, DEFAULT_TIER) else None
        try:
            async with self._http.stream("POST", url, json=body, headers=headers) as response:
                extensions = response.extensions
                if response.status_code != 200:
                    await response.aread()
                    raise HTTPStatus(response.status_code, response.headers.get("x-llmguard-cause"))
                await consume_sse(response, probe)
        finally:  # read once the response is closed: the call's final record (a snapshot before)
            probe.extra["record"] = extensions.get("llmguard")

    def deadline_for(self, tier: str) -> float:
        """The guard enforces the tier's deadlines; the harness's is a safety net 1 s after them."""
        return TIERS[tier].total + 1

    def waited_of(self, probe: Probe) -> float | None:
        """Gaps before retry rounds, during which no attempt of the call was running."""
        attempts = getattr(probe.extra.get("record"), "attempts", None) or []
        waited, last_end = 0.0, None
        for attempt in attempts:
            if attempt.kind == "retry" and last_end is not None:
                waited += max(0.0, attempt.start - last_end)
            if attempt.finish is not None:
                last_end = attempt.finish if last_end is None else max(last_end, attempt.finish)
        return waited

    def in_attempts_of(self, probe: Probe) -> float | None:
        """Length of the union of the attempts' [start, finish] intervals."""
        attempts = getattr(probe.extra.get("record"), "attempts", None) or []
        spans = sorted((a.start, a.finish) for a in attempts if a.finish is not None)
        total, end = 0.0, -math.inf
        for start, finish in spans:
            if finish > end:
                total += finish - max(start, end)
                end = finish
        return total

    def attempts_of(self, probe: Probe) -> int | None:
        record = probe.extra.get("record")
        attempts = getattr(record, "attempts", None)
        return len(attempts) if attempts is not None else None

    def replica_of(self, probe: Probe) -> str | None:
        record = probe.extra.get("record")
        replica = getattr(record, "replica", None)
        if replica is None:
            attempts = getattr(record, "attempts", None) or []
            replica = getattr(attempts[-1], "replica", None) if attempts else None
        return None if replica is None else str(replica)

    def trail_of(self, probe: Probe) -> str | None:
        attempts = getattr(probe.extra.get("record"), "attempts", None)
        if not attempts:
            return None
        parts = []
        for a in attempts:
            replica = str(getattr(a, "replica", "?")).rsplit(":", 1)[-1]
            code = getattr(a, "status_code", None)
            kind, outcome = getattr(a, "kind", "?"), getattr(a, "outcome", "?")
            parts.append(f"{kind}@{replica}:{outcome}{'/' + str(code) if code else ''}")
        skipped = getattr(probe.extra.get("record"), "not_continued", None)
        if skipped is not None:
            parts.append(f"not_continued:{skipped}")
        return ">".join(parts)

    def classify(self, exc: Exception, probe: Probe) -> tuple[str, int | None, str | None]:
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


class GuardedAffinityClient(GuardedClient):
    name = "guarded-affinity"
    guard_kwargs = {"affinity": "auto"}  # noqa: RUF012


class GuardedNoAffinityClient(GuardedClient):
    name = "guarded-noaffinity"
    guard_kwargs = {"affinity": None}  # noqa: RUF012


class GuardedContinuationClient(GuardedClient):
    """The guarded client with mid-stream failover by continuation (``llmguard bench --continuation``)."""

    name = "guarded-continuation"

    async def start(self) -> None:
        policy = importlib.import_module("llmguard_client").ContinuationPolicy()
        self.guard_kwargs = {"continuation": policy}
        await super().start()


class GuardedAdmissionClient(GuardedClient):
    """The guarded client with adaptive admission (``Admission()``): each replica's capacity learned, and a call
    that could not be served within its ttft refused at once (a 429 with Retry-After)."""

    name = "guarded-admission"

    async def start(self) -> None:
        policy = importlib.import_module("llmguard_client").Admission()
        self.guard_kwargs = {"admission": policy}
        await super().start()


class GuardedHintsClient(GuardedClient):
    """The guarded client with each replica's own queue length read from its ``/metrics``
    (``poll_vllm_metrics`` every ``every`` seconds, its default when ``None``, in a task group the client owns
    while it runs)."""

    name = "guarded-hints"
    every: float | None = None

    async def start(self) -> None:
        await super().start()
        poll = importlib.import_module("llmguard_client.server_hints").poll_vllm_metrics
        rate = {} if self.every is None else {"every": self.every}
        self._polling = anyio.create_task_group()
        await self._polling.__aenter__()
        self._polling.start_soon(functools.partial(poll, self._guard, **rate))

    async def aclose(self) -> None:
        self._polling.cancel_scope.cancel()
        await self._polling.__aexit__(None, None, None)
        await super().aclose()
