"""Per-replica fault and straggler knobs, drawn per request from a seeded `random.Random`."""

from __future__ import annotations

import email.utils
import math
import random
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "FaultConfig",
    "FaultPlan",
    "NeighbourBursts",
    "OverloadSignal",
    "RetryAfterStyle",
    "draw_faults",
    "retry_after_headers",
]

RetryAfterStyle = Literal["seconds", "garbage", "negative", "huge", "http-date", "ms-only"]
OverloadSignal = Literal["http", "in_stream"]
"""How an admission rejection is answered: ``http``, a 429 with Retry-After; ``in_stream``, vLLM 0.32's
queue-overflow shape: HTTP 200 and an in-stream error event (``code: 503``, then the protocol's tail, e.g.
``[DONE]``) for a streaming request, a plain 503 JSON error for a non-streaming one, never a Retry-After."""


@dataclass(frozen=True, slots=True)
class NeighbourBursts:
    """Another tenant's work landing on a replica: every ``every_s`` seconds, from ``offset_s`` after the replica
    started, ``requests`` requests of ``prompt_tokens`` prompt tokens and ``output_tokens`` output tokens join
    its engine at once. They do not come through HTTP, so a client sees them only in the replica's ``/metrics``
    (``vllm:num_requests_waiting``) and in the first tokens of its own requests queued behind them."""

    every_s: float
    requests: int
    prompt_tokens: int
    output_tokens: int
    offset_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.every_s > 0 or self.offset_s < 0:
            raise ValueError(f"every_s must be > 0 and offset_s >= 0 seconds, got {self.every_s!r}, {self.offset_s!r}")
        if self.requests < 1 or self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(
                f"requests, prompt_tokens and output_tokens must be >= 1, got "
                f"{self.requests}, {self.prompt_tokens}, {self.output_tokens}"
            )

    def burst_at(self, index: int) -> float:
        """Seconds after the replica started at which burst ``index`` (0, 1, ...) lands."""
        return self.offset_s + index * self.every_s


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """What can go wrong on one replica; every knob defaults to off.

    Probabilities are per request. ``stall_first`` holds a request (it keeps its slot) for ``stall_first_s``
    before its first token; ``stall_mid`` holds it for ``stall_mid_s`` after ``fault_after_tokens`` tokens;
    ``reset`` aborts the TCP connection and ``malformed`` sends one unparsable event at that point too.
    ``html_500`` answers an HTML error page; ``blackhole`` reads the request and never answers until the
    client goes away. ``slow_factor`` multiplies the replica's step time. ``retry_after`` shapes 429 headers.

    Failures inside HTTP 200 streams (streaming requests only): ``error_first`` answers an error event (code
    500) before any token, without running the request; ``error_mid`` sends one after ``fault_after_tokens``
    tokens; ``truncate`` ends the body there without finish reason or end marker. ``overload_signal`` says how
    admission rejections are answered (`OverloadSignal`).

    ``first_token_delay_s`` holds every request that long before its first token (a slow prefill; not counted
    as a fault). ``slow_between`` limits ``slow_factor`` and ``first_token_delay_s`` to a window of seconds
    after the replica started (None: always), for a replica that degrades and recovers.

    ``rate_limited_between``: a window of seconds after the replica started during which it answers every
    request with a 429 and ``Retry-After: rate_limited_retry_after_s`` (a hosted API's quota running out for
    a while), without running it; None: never.

    ``neighbour``: bursts of another tenant's requests queued on the replica (`NeighbourBursts`); None: never.
    """

    stall_first_p: float = 0.0
    stall_first_s: float = 2.0
    stall_mid_p: float = 0.0
    stall_mid_s: float = 2.0
    reset_p: float = 0.0
    malformed_p: float = 0.0
    html_500_p: float = 0.0
    blackhole_p: float = 0.0
    fault_after_tokens: int = 2
    slow_factor: float = 1.0
    retry_after: RetryAfterStyle = "seconds"
    error_first_p: float = 0.0
    error_mid_p: float = 0.0
    truncate_p: float = 0.0
    overload_signal: OverloadSignal = "http"
    first_token_delay_s: float = 0.0
    slow_between: tuple[float, float] | None = None
    rate_limited_between: tuple[float, float] | None = None
    rate_limited_retry_after_s: float = 30.0
    neighbour: NeighbourBursts | None = None

    def __post_init__(self) -> None:
        probabilities = (
            self.stall_first_p,
            self.stall_mid_p,
            self.reset_p,
            self.malformed_p,
            self.html_500_p,
            self.blackhole_p,
            self.error_first_p,
            self.error_mid_p,
            self.truncate_p,
        )
        if any(not 0.0 <= p <= 1.0 for p in probabilities):
            raise ValueError("fault probabilities must be in [0, 1]")
        if self.slow_factor <= 0 or self.stall_first_s < 0 or self.stall_mid_s < 0 or self.fault_after_tokens < 1:
            raise ValueError("slow_factor must be > 0, stall durations >= 0, fault_after_tokens >= 1")
        if self.overload_signal not in ("http", "in_stream"):
            raise ValueError(f"overload_signal must be 'http' or 'in_stream', got {self.overload_signal!r}")
        if self.first_token_delay_s < 0:
            raise ValueError(f"first_token_delay_s must be >= 0 seconds, got {self.first_token_delay_s!r}")
        if self.slow_between is not None and not 0 <= self.slow_between[0] < self.slow_between[1]:
            raise ValueError(
                f"slow_between must be (start, end) seconds with 0 <= start < end, got {self.slow_between!r}"
            )

        window = self.rate_limited_between
        if window is not None and not 0 <= window[0] < window[1]:
            raise ValueError(f"rate_limited_between must be (start, end) seconds with 0 <= start < end, got {window!r}")
        if not self.rate_limited_retry_after_s > 0:
            raise ValueError(f"rate_limited_retry_after_s must be > 0 seconds, got {self.rate_limited_retry_after_s!r}")

    def rate_limited_at(self, elapsed: float) -> bool:
        """Whether every request ``elapsed`` s after the start is refused with a 429 (`rate_limited_between`)."""
        window = self.rate_limited_between
        return window is not None and window[0] <= elapsed < window[1]

    @property
    def stream_faults(self) -> bool:
        """True if any failure inside a 200 stream can be drawn."""
        return bool(self.error_first_p or self.error_mid_p or self.truncate_p)

    def slow_at(self, elapsed: float) -> bool:
        """Whether the slowdown (``slow_factor``, ``first_token_delay_s``) applies ``elapsed`` s after the start."""
        window = self.slow_between
        return window is None or window[0] <= elapsed < window[1]


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """The faults that fire for one request."""

    html_500: bool = False
    blackhole: bool = False
    stall_first: bool = False
    stall_mid: bool = False
    reset: bool = False
    malformed: bool = False
    error_first: bool = False
    error_mid: bool = False
    truncate: bool = False

    @property
    def any(self) -> bool:
        """True if at least one fault fires."""
        return (
            self.html_500
            or self.blackhole
            or self.stall_first
            or self.stall_mid
            or self.reset
            or self.malformed
            or self.error_first
            or self.error_mid
            or self.truncate
        )


def draw_faults(config: FaultConfig, rng: random.Random) -> FaultPlan:
    """Draw one request's faults. Consumes six numbers, three more when ``config.stream_faults``, so runs replay
    exactly (and configurations without stream faults replay as they did before those existed)."""
    draws = [rng.random() for _ in range(9 if config.stream_faults else 6)] + [1.0, 1.0, 1.0]
    return FaultPlan(
        html_500=draws[0] < config.html_500_p,
        blackhole=draws[1] < config.blackhole_p,
        stall_first=draws[2] < config.stall_first_p,
        stall_mid=draws[3] < config.stall_mid_p,
        reset=draws[4] < config.reset_p,
        malformed=draws[5] < config.malformed_p,
        error_first=draws[6] < config.error_first_p,
        error_mid=draws[7] < config.error_mid_p,
        truncate=draws[8] < config.truncate_p,
    )


def retry_after_headers(style: RetryAfterStyle, seconds: float, wall_now: float) -> list[tuple[str, str]]:
    """The Retry-After headers of a 429 for a computed back-off of ``seconds``, in the given style.

    ``seconds``: integer ``Retry-After`` (rounded up, >= 1) plus exact ``retry-after-ms``; ``garbage``:
    unparsable values; ``negative``: negative values; ``huge``: ~31 years; ``http-date``: an IMF-fixdate
    ``Retry-After`` only; ``ms-only``: ``retry-after-ms`` only.
    """
    whole = max(1, math.ceil(seconds))
    millis = max(1, round(seconds * 1000))
    if style == "seconds":
        return [("retry-after", str(whole)), ("retry-after-ms", str(millis))]
    if style == "garbage":
        return [("retry-after", "soon"), ("retry-after-ms", "a while")]
    if style == "negative":
        return [("retry-after", str(-whole)), ("retry-after-ms", str(-millis))]
    if style == "huge":
        return [("retry-after", "999999999"), ("retry-after-ms", "999999999000")]
    if style == "http-date":
        return [("retry-after", email.utils.formatdate(wall_now + whole, usegmt=True))]
    return [("retry-after-ms", str(millis))]
