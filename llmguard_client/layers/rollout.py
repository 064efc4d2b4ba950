"""Gradual rollout: a fraction of calls takes the guarded path, the rest is the control cohort.

The control cohort makes one plain attempt (no deadlines, hedges or retries, server
answers passed through untouched) but is measured the same way, so the two cohorts
can be compared side by side (``record.cohort``). A request header
``x-llmguard-cohort: guarded|control`` pins one call (e.g. for a sticky user cohort).
"""

from __future__ import annotations

import random

import httpx

from llmguard_client._call import COHORT_HEADER, Call
from llmguard_client._errors import GuardConfigError
from llmguard_client._outcome import Outcome, Route
from llmguard_client._pipeline import Next

COHORTS = ("guarded", "control")


class Rollout:
    """Assigns each call to a cohort."""

    def __init__(self, fraction: float, rng: random.Random | None = None) -> None:
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
            raise GuardConfigError(
                f"rollout must be the fraction of calls to guard, from 0.0 to 1.0 (e.g. 0.05), got {fraction!r}"
            )
        self.fraction = float(fraction)
        self._rng = rng or random.Random()

    def cohort(self, request: httpx.Request) -> str:
        pinned: str | None = request.headers.get(COHORT_HEADER)
        if pinned is not None:
            pinned = pinned.strip().lower()
            if pinned not in COHORTS:
                raise GuardConfigError(f"{COHORT_HEADER} must be one of {', '.join(COHORTS)}; got {pinned!r}")
            return pinned
        if self.fraction >= 1.0:
            return "guarded"
        return "guarded" if self._rng.random() < self.fraction else "control"


class RolloutLayer:
    """Puts the call in its cohort; the control cohort skips every guarded behaviour downstream."""

    def __init__(self, rollout: Rollout) -> None:
        self.rollout = rollout

    async def __call__(self, call: Call, route: Route, call_next: Next) -> Outcome:
        call.guarded = self.rollout.cohort(call.request) == "guarded"
        call.record.cohort = "guarded" if call.guarded else "control"
        if call.guarded and call.budget is not None:
            call.budget.record_request()
        return await call_next(call, route)
