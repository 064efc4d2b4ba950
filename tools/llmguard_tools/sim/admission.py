"""Admission control at submit time: the policies ``none``, ``concurrency`` and ``token`` of the reference simulation.

``token`` keeps a reservation ledger: each admitted request reserves ``prompt + min(max_tokens, out_reserve)``
KV tokens, and a request is rejected when the ledger would exceed ``kv_tokens * headroom``. The reservation
is returned by `Admitter.release` on every path out of the engine (finish, abort, error).
"""

from __future__ import annotations

from typing import Literal

__all__ = ["AdmissionPolicy", "Admitter", "retry_after_seconds"]

AdmissionPolicy = Literal["none", "concurrency", "token"]


class Admitter:
    """Decides admission and holds the token reservation ledger."""

    __slots__ = ("concurrency_limit", "headroom", "kv_tokens", "out_reserve", "policy", "reserved")

    def __init__(
        self,
        policy: AdmissionPolicy,
        *,
        kv_tokens: int,
        headroom: float,
        out_reserve: int,
        concurrency_limit: int,
    ) -> None:
        self.policy: AdmissionPolicy = policy
        self.kv_tokens = kv_tokens
        self.headroom = headroom
        self.out_reserve = out_reserve
        self.concurrency_limit = concurrency_limit
        self.reserved = 0

    @property
    def limit(self) -> float:
        """The reservation ceiling of the ``token`` policy, in KV tokens."""
        return self.kv_tokens * self.headroom

    def cost(self, prompt_tokens: int, max_tokens: int) -> int:
        """The KV reservation a request needs: its prompt plus its (capped) output."""
        return prompt_tokens + min(max_tokens, self.out_reserve)

    def try_acquire(self, prompt_tokens: int, max_tokens: int, in_system: int) -> int | None:
        """Admit a request: return its reservation (0 unless ``token``), or None when it is rejected."""
        if self.policy == "concurrency":
            return 0 if in_system < self.concurrency_limit else None
        if self.policy == "token":
            cost = self.cost(prompt_tokens, max_tokens)
            if self.reserved + cost > self.limit:
                return None
            self.reserved += cost
            return cost
        return 0

    def release(self, amount: int) -> None:
        """Return a reservation taken by `try_acquire`."""
        self.reserved -= amount
        if self.reserved < 0:  # pragma: no cover - a double release is a bug in the caller
            raise AssertionError("reservation ledger went negative")

    def deficit_tokens(self, prompt_tokens: int, max_tokens: int, in_system: int, avg_cost: float) -> float:
        """How many tokens of admitted work must drain before this request would be admitted."""
        if self.policy == "token":
            return max(0.0, self.reserved + self.cost(prompt_tokens, max_tokens) - self.limit)
        if self.policy == "concurrency":
            return max(0, in_system + 1 - self.concurrency_limit) * avg_cost
        return 0.0


def retry_after_seconds(backlog_tokens: float, tokens_per_s: float, low: float, high: float) -> float:
    """The reference's Retry-After: backlog divided by the measured token rate, clamped to ``[low, high]``."""
    return max(low, min(high, backlog_tokens / max(tokens_per_s, 1.0)))
