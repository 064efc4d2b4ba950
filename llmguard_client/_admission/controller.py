"""The limit on one replica's attempts in flight, learned from each first token against the tier's SLO.

A gradient anchored to the SLO (Netflix's Gradient2, Envoy's adaptive concurrency, with the caller's TTFT target
as the reference instead of a measured minimum). For an admitted attempt whose first token took ``ttft`` on a
tier whose target is ``target = Admission.target x tier.ttft``:

- in time (``ttft < target``) and the limit in use (in flight >= 80 % of it), the limit grows, ever more slowly
  as first tokens approach the target::

      limit <- limit + smoothing x sqrt(limit) x (1 - ttft / target)

  A limit that is not in use does not grow: a quiet period must not leave a limit the next spike overruns.
- late (``ttft > target``), it shrinks in proportion, at most by half::

      limit <- limit x max(0.5, target / ttft)

  once per round trip: a late first token of an attempt sent before the last decrease reflects the old limit,
  not the new one, and is not counted again (as TCP halves its window once per window of losses).

An overload answer (429/503/in-stream) or a reported waiting queue longer than ``max_server_queue`` multiplies
the limit by ``backoff``, under the same once-per-round-trip rule.
"""

from __future__ import annotations

import math

from llmguard_client._admission.policy import Admission

__all__ = ["LimitController"]

USED = 0.8
"""The share of the limit in flight from which the limit counts as in use (and may grow)."""


class LimitController:
    """One replica's learned limit (a float; `allowed` is the whole number of attempts it lets in)."""

    __slots__ = ("_last_cut", "limit", "policy")

    def __init__(self, policy: Admission) -> None:
        self.policy = policy
        self.limit = float(policy.initial_limit)
        self._last_cut = -math.inf

    @property
    def allowed(self) -> int:
        return max(self.policy.min_limit, int(self.limit))

    def first_token(self, now: float, sent: float, tier_ttft: float, in_flight: int) -> None:
        """An attempt sent at ``sent`` got its first token (or hit its deadline) at ``now``."""
        policy = self.policy
        target = policy.target * tier_ttft
        ttft = now - sent
        if ttft > target:
            self._cut(now, sent, max(0.5, target / ttft))
        elif in_flight >= USED * self.limit:
            self._set(self.limit + policy.smoothing * math.sqrt(self.limit) * (1.0 - ttft / target))

    def overload(self, now: float, sent: float) -> None:
        """The replica said it is overloaded, or reported a long queue: multiplicative decrease."""
        self._cut(now, sent, self.policy.backoff)

    def _cut(self, now: float, sent: float, factor: float) -> None:
        if sent < self._last_cut:
            return  # sent under the limit before the last cut: already answered for
        self._last_cut = now
        self._set(self.limit * factor)

    def _set(self, value: float) -> None:
        self.limit = min(float(self.policy.max_limit), max(float(self.policy.min_limit), value))
