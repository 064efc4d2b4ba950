"""Which calls are compared: those of one rollout fraction.

Calls of different fractions are never pooled: each step of a rollout runs in its own period, with its
own share of users in each cohort, so pooled cohorts differ by period as much as by the guard (Simpson's
paradox: 5 % guarded in a busy hour then 50 % in a quiet one pools a mostly-busy control against a
mostly-quiet guarded cohort). Calls made at fraction 0 (the kill switch, or the guard set off) are
control only and never compared. Records without a fraction form a stratum of their own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from llmguard_tools.compare.load import Call

__all__ = ["STEP_DIGITS", "Stratum", "choose", "strata"]

STEP_DIGITS = 6
"""Decimal places a recorded rollout fraction is compared at (a fraction is set to far fewer)."""


@dataclass(frozen=True, slots=True)
class Stratum:
    """The calls of one rollout fraction (None: the records did not say)."""

    fraction: float | None
    calls: list[Call]

    @property
    def both_cohorts(self) -> bool:
        return {c.cohort for c in self.calls} >= {"guarded", "control"}

    @property
    def off(self) -> bool:
        """Made with the guard off: every call control, nothing to compare."""
        return self.fraction == 0.0

    def name(self) -> str:
        if self.fraction is None:
            return "not recorded"
        return f"{self.fraction:g}" + (" (guard off)" if self.off else "")


def strata(calls: Sequence[Call]) -> list[Stratum]:
    """The calls by rollout fraction, newest first: by the latest wall-clock start (``start_unix``) among a
    fraction's calls, and by the order of the records where they have none."""
    by_fraction: dict[float | None, list[Call]] = {}
    newest: dict[float | None, tuple[float, int]] = {}
    for index, call in enumerate(calls):
        fraction = _step(call.fraction)
        by_fraction.setdefault(fraction, []).append(call)
        when = (call.start_unix if call.start_unix is not None else -math.inf, index)
        newest[fraction] = max(newest.get(fraction, when), when)
    order = sorted(by_fraction, key=lambda f: newest[f], reverse=True)
    return [Stratum(f, by_fraction[f]) for f in order]


def _step(fraction: float | None) -> float | None:
    """The rollout step a recorded fraction belongs to: rounded to `STEP_DIGITS` places, so that one step set by
    arithmetic (``0.1 + 0.2`` is recorded as 0.30000000000000004) is one stratum with the 0.3 set by hand."""
    return None if fraction is None else round(fraction, STEP_DIGITS)


def choose(found: Sequence[Stratum], fraction: float | None = None) -> Stratum | None:
    """The stratum to compare: the one of ``fraction`` when given (None if the records have none), else the
    newest fraction above 0 with calls of both cohorts, else calls without a fraction that have both, else the
    newest with any calls above 0 (not enough to compare: the verdict holds). None when every call was made
    with the guard off."""
    if fraction is not None:
        return next((s for s in found if s.fraction is not None and math.isclose(s.fraction, fraction)), None)
    candidates = [s for s in found if not s.off]
    return (
        next((s for s in candidates if s.fraction is not None and s.both_cohorts), None)
        or next((s for s in candidates if s.both_cohorts), None)
        or next(iter(candidates), None)
    )
