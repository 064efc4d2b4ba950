"""The limit on one replica's attempts in flight, learned from each first token against the tier's SLO.

A gradient anchored to the SLO (Netflix's Gradient2, Envoy's adaptive concurrency, with the caller's TTFT target
as the reference instead of a measured minimum). For an admitted attempt whose first token took ``ttft`` on a
tier whose target is ``target = Admission.target x tier.ttft`` (but never below twice the replica's fastest
first token, so that a replica slow even when idle is not taken for a queue):

- in time (``ttft < target``) and the limit in use (in flight >= 80 % of it), the limit grows, by up to
  ``growth`` per first token (up to doubling per round trip, as TCP's slow start), ever more slowly as first
  tokens approach the target::

      limit <- limit + growth x (1 - ttft / target)

  A limit that is not in use does not grow: a quiet period must not leave a limit the next spike overruns.
- in time and the limit not in use, it comes down by up to ``growth`` per first token, but never below the load
  proven in time (``proven``: the most an attempt found in flight and still had its first token in time, slowly
  forgotten) over the in-use share::

      limit <- max(min(limit, proven / 0.8), limit - growth)

  The starting limit is a guess: without this, a guess above what the replica holds stays untested until a
  spike overruns it, and N processes with a Guard each start with N times the guess (measured with 4: 7 % of
  the engines' work wasted at the spike's onset, against 0.1 % for one process).
- in time, the limit is never below the load the attempt met (``held``): the replica just held it in time.
- late (``ttft > target``), it shrinks to what would have been in time, in proportion to the load the attempt
  met when it was sent (``held``: its replica's attempts in flight then, itself included), at most by half::

      limit <- min(limit, held x max(0.5, target / ttft))

  Measured against the load at the time of sending, not the limit now, a late first token of an attempt sent
  before the last decrease asks for no more than that decrease did: a burst of late answers to an earlier,
  higher limit cuts it once, not once per answer (the lag that makes a naive controller collapse its limit).

An overload answer (429/503/in-stream) or a reported waiting queue longer than ``max_server_queue`` cuts the
limit to ``held x backoff`` in the same way.

``ceiling`` is the limit as only signs of overload bring it down (a late first token, an overload answer, a
long reported queue): it starts at ``initial_limit``, rises with the limit and is cut with it, but does not
come down while the limit is not in use. The room between the two is a pace, not a refusal: the gate lets a
call that fits under the ceiling wait for the limit to grow back (as TCP restarts slow start after an idle
period) as long as its first token can still come in time, and refuses at once only what the ceiling does not
hold.
"""

from __future__ import annotations

import math

from llmguard_client._admission.policy import Admission

__all__ = ["LimitController"]

USED = 0.8
"""The share of the limit in flight from which the limit counts as in use (and may grow)."""
PROVEN_MEMORY = 400
"""The load proven in time is forgotten by 1 / this per first token in time (an e-fold over that many)."""
FLOOR_FACTOR = 2.0
"""The target is never below this many times the replica's fastest first token: a replica that is slow even
when idle (a hosted API far away) is not taken for a queue, and its limit neither collapses nor freezes."""


class LimitController:
    """One replica's learned limit (a float; `allowed` is the whole number of attempts it lets in)."""

    __slots__ = ("ceiling", "limit", "policy", "proven")

    def __init__(self, policy: Admission) -> None:
        self.policy = policy
        self.limit = float(policy.initial_limit)
        self.proven = 0.0
        """The most an attempt found in flight (``held``) and still had its first token in time, fading."""
        self.ceiling = self.limit
        """The limit as only signs of overload bring it down (not its coming down while not in use)."""

    @property
    def allowed(self) -> int:
        return max(self.policy.min_limit, int(self.limit))

    @property
    def undisproven(self) -> int:
        """The whole number of attempts the ceiling lets in: no sign of overload has been seen at that load."""
        return max(self.policy.min_limit, int(self.ceiling))

    def admitted(self, load: float) -> None:
        """A call was let in over the limit, making ``load`` in flight, with no sign of overload: until one
        comes, that load is not disproven either."""
        self.ceiling = min(float(self.policy.max_limit), max(self.ceiling, load))

    def first_token(
        self,
        ttft: float,
        tier_ttft: float,
        held: float,
        in_flight: float,
        floor: float | None = None,
        share: float = 1.0,
    ) -> None:
        """An attempt sent when its replica held ``held`` (attempts, or their weights) got its first token (or hit
        its deadline) after ``ttft`` s; ``in_flight`` are held now; ``floor``: the replica's fastest first token;
        ``share``: the share of the limit its call may take (a call of a longer tier leaves the rest to the most
        urgent one's), which use is measured against."""
        target = self.target(tier_ttft, floor)
        if ttft > target:
            self._cut(held * max(0.5, target / ttft))
            return
        policy = self.policy
        self.proven = max(held, self.proven * (1.0 - 1.0 / PROVEN_MEMORY))
        if in_flight >= USED * share * self.allowed:
            self._set(self.limit + policy.growth * (1.0 - ttft / target))
        else:
            self._set(max(min(self.limit, self.proven / (USED * share)), self.limit - policy.growth))
        self._set(max(self.limit, held))  # the load it met was held in time
        self.ceiling = max(self.ceiling, self.limit)

    def target(self, tier_ttft: float, floor: float | None = None) -> float:
        """The first-token time the limit aims at for a tier (``floor``: the replica's fastest first token)."""
        return max(self.policy.target * tier_ttft, FLOOR_FACTOR * floor if floor is not None else 0.0)

    def growth_time(self, to: float, ttft: float, target: float) -> float:
        """Seconds for the limit to grow to ``to`` while in use, first tokens coming after ``ttft`` s against
        ``target``: each round trip of ``ttft`` multiplies it by ``1 + growth x (1 - ttft / target)``, up to the
        ceiling (inf: past the ceiling, or first tokens not in time)."""
        if to <= self.allowed:
            return 0.0
        gain = self.policy.growth * (1.0 - ttft / target)
        if to > self.undisproven or gain <= 0.0:
            return math.inf
        return ttft * max(1.0, math.log(to / self.limit) / math.log1p(gain))

    def overload(self, held: float) -> None:
        """The replica said it is overloaded, or reported a long queue, to an attempt sent when it held
        ``held``: multiplicative decrease from that load."""
        self._cut(held * self.policy.backoff)

    def _cut(self, value: float) -> None:
        self._set(min(self.limit, value))
        self.ceiling = max(self.limit, min(self.ceiling, value))

    def _set(self, value: float) -> None:
        self.limit = min(float(self.policy.max_limit), max(float(self.policy.min_limit), value))
