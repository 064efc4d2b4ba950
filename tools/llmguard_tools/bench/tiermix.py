"""``--tier-mix batch:0.3``: a share of the planned calls sent on another tier, and each tier's figures.

A call on the ``batch`` tier carries ``x-llmguard-tier: batch`` to a guarded client, whose Guard knows it as
`BATCH` (30 s to the first token, 600 s in all); a baseline, which has no tiers, gives such a call the batch
tier's ``total`` before it gives up. Which calls are batch is drawn from the plan's seed on a random stream of
its own, so every client sends the same calls on the same tiers.

A batch call is good when it completes with its first token within the batch tier's ``ttft``; an interactive
call when it meets the run's goodput SLO.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmguard_tools.bench.measure import Sample, TierSpec

__all__ = ["BATCH", "DEFAULT_TIER", "TierFigures", "assign", "parse_tier_mix", "tier_figures"]

DEFAULT_TIER = "interactive"
BATCH = TierSpec(ttft=30.0, total=600.0, stall=None)
"""The batch tier of a mix."""
TIERS: Mapping[str, TierSpec] = {"batch": BATCH}
"""The tiers a mix may name, besides the run's own (interactive) tier."""


def parse_tier_mix(spec: str) -> dict[str, float]:
    """``"batch:0.3"`` -> ``{"batch": 0.3}``; the shares add up to less than 1 (the rest is interactive)."""
    mix: dict[str, float] = {}
    for part in spec.split(","):
        name, _, share = part.strip().partition(":")
        if name not in TIERS:
            raise ValueError(f"--tier-mix: unknown tier {name!r}; choose from {', '.join(TIERS)}")
        try:
            mix[name] = float(share)
        except ValueError:
            raise ValueError(f"--tier-mix: {part!r} is not TIER:SHARE (e.g. batch:0.3)") from None
        if not 0.0 < mix[name] < 1.0:
            raise ValueError(f"--tier-mix: the share of {name} must be between 0 and 1, not {share}")
    if sum(mix.values()) >= 1.0:
        raise ValueError("--tier-mix: the shares must leave some calls on the interactive tier")
    return mix


def assign(n: int, mix: Mapping[str, float], seed: int) -> tuple[str, ...]:
    """The tier of each of ``n`` planned calls (by index), drawn from ``seed``."""
    rng = random.Random(f"tier-mix:{seed}")
    out = []
    for _ in range(n):
        x, tier = rng.random(), DEFAULT_TIER
        for name, share in mix.items():
            if x < share:
                tier = name
                break
            x -= share
        out.append(tier)
    return tuple(out)


@dataclass(frozen=True)
class TierFigures:
    """One tier's calls in one client's run."""

    calls: int
    completed: float
    """Share of the tier's calls that completed."""
    good: float
    """Share that met the tier's target (interactive: the goodput SLO; batch: first token within its ttft)."""


def tier_figures(samples: Sequence[Sample], good: Sequence[Sample]) -> dict[str, TierFigures]:
    """Per tier: calls, completed and good shares; ``good``: the samples that met the run's SLO."""
    met = {id(s) for s in good}
    out: dict[str, TierFigures] = {}
    for tier in sorted({s.tier or DEFAULT_TIER for s in samples}):
        mine = [s for s in samples if (s.tier or DEFAULT_TIER) == tier]
        spec = TIERS.get(tier)
        if spec is None:
            ok = sum(1 for s in mine if id(s) in met)
        else:
            ok = sum(1 for s in mine if s.ok and s.ttft is not None and s.ttft <= spec.ttft)
        out[tier] = TierFigures(len(mine), sum(1 for s in mine if s.ok) / len(mine), ok / len(mine))
    return out
