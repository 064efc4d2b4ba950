"""`BenchClient`: a named client that runs one logical request per `BenchClient.run` and returns its `Sample`.

The whole logical request runs under one harness deadline (the user giving up): the tier's ``total`` for the
baselines, and ``total`` + 1 s as a safety net for the guarded clients, which enforce their own tier.
"""

from __future__ import annotations

import itertools
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import anyio
import httpx

from llmguard_tools.bench.measure import PROBE, HTTPStatus, Probe, Sample, TierSpec
from llmguard_tools.bench.tiermix import DEFAULT_TIER, TIERS
from llmguard_tools.bench.traffic import PlannedRequest

__all__ = ["BenchClient"]


class BenchClient(ABC):
    """A named client that runs one logical request per call to `run`."""

    name: str = "?"
    tiers: Sequence[str] = ()
    """Each planned call's tier, by index (``--tier-mix``); empty: every call on the run's tier."""

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
    async def _send(self, body: dict[str, Any], probe: Probe) -> None:
        """Send ``body`` and consume the answer into ``probe``; raise `HTTPStatus` for non-200."""

    async def run(self, req: PlannedRequest, body: dict[str, Any], scheduled_at: float) -> Sample:
        """Run one logical request. ``scheduled_at`` is the planned send time (perf_counter clock)."""
        probe = Probe(t0=time.perf_counter())
        tier = self.tiers[req.index] if self.tiers else None
        deadline = self.deadline if tier in (None, DEFAULT_TIER) else self.deadline_for(tier)
        probe.extra["tier"] = tier
        token = PROBE.set(probe)
        status: str = "ok"
        http_status: int | None = 200
        cause: str | None = None
        try:
            with anyio.fail_after(deadline):
                await self._send(body, probe)
        except HTTPStatus as exc:
            status, http_status, cause = f"http_{exc.status}", exc.status, exc.cause
        except TimeoutError:
            status, http_status, cause = "timeout", None, "harness_deadline"
        except Exception as exc:
            status, http_status, cause = self.classify(exc, probe)
        finally:
            PROBE.reset(token)
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
            tier=tier,
        )

    def deadline_for(self, tier: str) -> float:
        """When a call of ``tier`` (not the run's own) is given up on: that tier's total."""
        return TIERS[tier].total

    def attempts_of(self, probe: Probe) -> int | None:
        return probe.attempts or None

    def waited_of(self, probe: Probe) -> float | None:
        return None

    def in_attempts_of(self, probe: Probe) -> float | None:
        return None

    def replica_of(self, probe: Probe) -> str | None:
        return probe.replica

    def trail_of(self, probe: Probe) -> str | None:
        return None

    def classify(self, exc: Exception, probe: Probe) -> tuple[str, int | None, str | None]:
        if isinstance(exc, httpx.TimeoutException):
            return "timeout", None, type(exc).__name__
        return "error", None, f"{type(exc).__name__}: {exc}"[:160]
