"""The simulated engine's vocabulary: its configuration, a request, an admitted sequence, counters, refusals.

`llmguard_tools.sim.engine.Engine` works on these; they hold no scheduling logic.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass, field

from llmguard_tools.sim.admission import AdmissionPolicy
from llmguard_tools.sim.lengths import SEED_OUTPUT_LENGTHS, LengthDist

__all__ = [
    "EngineConfig",
    "EngineRequest",
    "EngineStats",
    "Rates",
    "Rejected",
    "RequestTooLarge",
    "SeqState",
    "Sequence",
]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine sizes and policy. Defaults are the reference's: 10 ms steps, TBUD 400, KV 90k, chunks of 512."""

    step_s: float = 0.010
    tbud: int = 400
    kv_tokens: int = 90_000
    prefill_chunk: int = 512
    max_running: int = 256
    kv_watermark: float = 0.0
    max_model_len: int | None = None
    policy: AdmissionPolicy = "none"
    concurrency_limit: int = 100
    headroom: float = 0.95
    out_reserve: int = 320
    output_lengths: LengthDist = SEED_OUTPUT_LENGTHS
    step_time_factor: float = 1.0
    retry_after_min_s: float = 0.05
    retry_after_max_s: float = 60.0
    rate_tau_s: float = 1.0
    history_every_s: float = 0.5
    history_len: int = 240
    prefix_cache_tokens: int = 0
    """Capacity of the replica's prefix cache in tokens (0: no prefix caching, the default)."""
    cache_block_tokens: int = 16
    """Tokens per cached block: only whole blocks are cached and hit (16, like vLLM)."""

    def __post_init__(self) -> None:
        if self.step_s <= 0 or self.step_time_factor <= 0:
            raise ValueError("step_s and step_time_factor must be positive")
        if self.tbud < 1 or self.kv_tokens < 1 or self.prefill_chunk < 1 or self.max_running < 1:
            raise ValueError("tbud, kv_tokens, prefill_chunk and max_running must be >= 1")
        if not 0 < self.headroom <= 1 or not 0 <= self.kv_watermark < 1:
            raise ValueError("headroom must be in (0, 1] and kv_watermark in [0, 1)")
        if self.policy not in ("none", "concurrency", "token"):
            raise ValueError(f"unknown admission policy {self.policy!r}")
        if self.model_len > self.kv_tokens:
            raise ValueError("max_model_len cannot exceed kv_tokens")
        if self.prefix_cache_tokens < 0 or self.cache_block_tokens < 1:
            raise ValueError(
                f"prefix_cache_tokens must be >= 0 (0 disables the cache) and cache_block_tokens >= 1, got "
                f"{self.prefix_cache_tokens} and {self.cache_block_tokens}"
            )

    @property
    def model_len(self) -> int:
        """Longest sequence (prompt + output) a request may have: ``max_model_len`` or the whole KV pool."""
        return self.kv_tokens if self.max_model_len is None else self.max_model_len

    @property
    def step_period(self) -> float:
        """Wall time of one step: ``step_s * step_time_factor``."""
        return self.step_s * self.step_time_factor


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """What the engine needs to know about a request. ``output_tokens=None`` samples the output length;
    ``block_hashes`` identify the prompt's full blocks for the prefix cache (`llmguard_tools.sim.prefix_cache`)."""

    prompt_tokens: int
    max_tokens: int
    output_tokens: int | None = None
    block_hashes: tuple[int, ...] = ()


class SeqState(enum.Enum):
    """Where a request is in the engine."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(eq=False, slots=True)
class Sequence:
    """The handle of one admitted request; read its progress, never write it."""

    id: int
    prompt_tokens: int
    max_tokens: int
    output_tokens: int
    arrival: float
    reservation: int
    expected_output: int
    state: SeqState = SeqState.WAITING
    prefill_target: int = 0
    prefilled: int = 0
    generated: int = 0
    kv: int = 0
    computed: int = 0
    work: int = 0
    preemptions: int = 0
    paused_until: float = -math.inf
    stall_after: int = 0
    stall_s: float = 0.0
    first_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    cached: int = 0
    """Prompt tokens found in the prefix cache: skipped by prefill (they still take KV)."""
    block_hashes: tuple[int, ...] = ()
    """The prompt's block hashes, until its prefill is done and they are cached."""

    @property
    def done(self) -> bool:
        """True once the request finished or was aborted."""
        return self.state is SeqState.FINISHED or self.state is SeqState.ABORTED

    @property
    def expected_remaining(self) -> int:
        """Work the scheduler still expects (prefill left + reserved-length decode left), for Retry-After."""
        return (self.prefill_target - self.prefilled) + max(0, self.expected_output - self.generated)


class Rejected(Exception):
    """Admission refused the request; ``retry_after_s`` is the server's computed back-off."""

    def __init__(self, reason: str, retry_after_s: float) -> None:
        super().__init__(f"rejected by admission ({reason}); retry after {retry_after_s:.3f}s")
        self.reason = reason
        self.retry_after_s = retry_after_s


class RequestTooLarge(ValueError):
    """The request can never fit: prompt + max_tokens exceeds the model length."""


@dataclass(slots=True)
class EngineStats:
    """Counters since start or the last `Engine.reset_stats`."""

    submitted: int = 0
    admitted: int = 0
    rejected: int = 0
    completed: int = 0
    aborted_by_disconnect: int = 0
    aborted_other: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    recompute_tokens: int = 0
    aborted_work_tokens: int = 0
    preemptions: int = 0
    steps: int = 0

    @property
    def work_tokens(self) -> int:
        """All work done: prefill (including recompute) plus decode."""
        return self.prefill_tokens + self.decode_tokens


@dataclass(slots=True)
class Rates:
    """Exponentially weighted rates measured per step."""

    work_per_s: float
    avg_cost: float
    reject_pressure: float = 0.0
    history: deque[list[float]] = field(default_factory=deque)
