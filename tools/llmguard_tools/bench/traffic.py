"""Planned traffic: a deterministic, seeded list of requests replayed identically for every client.

A plan fixes, for each logical request, its arrival offset (open loop), its prompt length in words
and its ``max_tokens``; the bench sends every request with ``"ignore_eos": true`` so the output
length is ``max_tokens`` too. Lengths are lognormal, shaped like a production mix (prompt
median 570 / p99 ~2000, capped at 4000; output median 200 / p99 ~800, capped at 1200), scaled down
by ``LengthModel.scaled`` so a laptop-sized simulated cluster can run hundreds of them in seconds.

Arrivals are one of:

* open loop, Poisson at ``rate`` requests/s;
* open loop, a piecewise-constant rate `RateProfile` (e.g. the spike 30 -> 140 -> 30 rps over
  15 s / 20 s / 25 s), time-compressed so the expected number of arrivals is the requested count;
* closed loop with ``concurrency`` workers (arrival offsets are then all 0: a worker sends the next
  request as soon as its previous one ends).

Open loop with ``concurrency`` set caps the requests in flight (arrivals wait for a free slot).
Multi-turn conversations (mode ``conversations``) are planned by `llmguard_tools.bench.conversations`.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from llmguard_tools.bench.rates import RateProfile

Mode = Literal["poisson", "profile", "closed", "conversations"]


@dataclass(frozen=True)
class LengthModel:
    """Lognormal prompt and output lengths, clipped to ``[1, max]``."""

    prompt_median: float = 570.0
    prompt_sigma: float = 0.55
    prompt_max: int = 4000
    output_median: float = 200.0
    output_sigma: float = 0.6
    output_max: int = 1200

    def __post_init__(self) -> None:
        for name in ("prompt_median", "output_median", "prompt_max", "output_max"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"LengthModel.{name} must be positive, got {value!r}")
        for name in ("prompt_sigma", "output_sigma"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"LengthModel.{name} must be >= 0, got {value!r}")

    def scaled(self, factor: float) -> LengthModel:
        """The same shape with medians and caps multiplied by ``factor``."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"length scale must be > 0, got {factor!r}")
        return LengthModel(
            prompt_median=self.prompt_median * factor,
            prompt_sigma=self.prompt_sigma,
            prompt_max=max(1, round(self.prompt_max * factor)),
            output_median=self.output_median * factor,
            output_sigma=self.output_sigma,
            output_max=max(1, round(self.output_max * factor)),
        )

    def sample(self, rng: random.Random) -> tuple[int, int]:
        prompt = rng.lognormvariate(math.log(self.prompt_median), self.prompt_sigma)
        output = rng.lognormvariate(math.log(self.output_median), self.output_sigma)
        return (
            min(self.prompt_max, max(1, round(prompt))),
            min(self.output_max, max(1, round(output))),
        )


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    arrival: float
    """Seconds after the run's start at which the request is sent (0 in closed loop)."""
    prompt_words: int
    max_tokens: int


@dataclass(frozen=True)
class TrafficPlan:
    requests: tuple[PlannedRequest, ...]
    mode: Mode
    seed: int
    lengths: LengthModel
    rate: float | None = None
    profile: RateProfile | None = None
    concurrency: int | None = None
    conversations: tuple[Any, ...] = ()
    """Mode ``conversations``: the `llmguard_tools.bench.conversations.Conversation` of every turn."""
    _fingerprint: str = field(default="", compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def duration(self) -> float:
        """Offset of the last planned arrival (0 in closed loop)."""
        return self.requests[-1].arrival if self.requests else 0.0

    def fingerprint(self) -> str:
        """A short hash of every (arrival, prompt_words, max_tokens): equal plans, equal hashes."""
        if not self._fingerprint:
            digest = hashlib.sha256()
            for r in self.requests:
                digest.update(f"{r.index}:{r.arrival:.6f}:{r.prompt_words}:{r.max_tokens};".encode())
            object.__setattr__(self, "_fingerprint", digest.hexdigest()[:16])
        return self._fingerprint

    def describe(self) -> str:
        n = len(self.requests)
        if self.mode == "closed":
            load = f"closed loop, {self.concurrency} concurrent"
        elif self.mode == "conversations":
            load = f"{len(self.conversations)} conversations, turns at ~{self.rate:g} rps, each after the last ended"
        elif self.mode == "poisson":
            load = f"open-loop Poisson at {self.rate:g} rps"
        else:
            assert self.profile is not None
            load = f"open-loop profile {self.profile.describe()}"
        if self.mode != "closed" and self.concurrency is not None:
            load += f", at most {self.concurrency} in flight"
        p = sorted(r.prompt_words for r in self.requests)
        o = sorted(r.max_tokens for r in self.requests)
        sizes = f"prompt words p50 {p[n // 2]} max {p[-1]}, output tokens p50 {o[n // 2]} max {o[-1]}" if n else ""
        return f"{n} requests, {load}; {sizes}; seed {self.seed}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": len(self.requests),
            "mode": self.mode,
            "seed": self.seed,
            "rate": self.rate,
            "profile": None if self.profile is None else [list(s) for s in self.profile.segments],
            "concurrency": self.concurrency,
            "lengths": asdict(self.lengths),
            "duration_s": self.duration,
            "fingerprint": self.fingerprint(),
            "description": self.describe(),
        }


def make_plan(
    n: int,
    *,
    seed: int = 0,
    lengths: LengthModel | None = None,
    rate: float | None = None,
    profile: RateProfile | None = None,
    concurrency: int | None = None,
) -> TrafficPlan:
    """Build the plan. Poisson if ``rate`` alone; ``profile`` (its first segment rescaled to ``rate``
    when both are given) fitted to ``n`` expected arrivals; closed loop if only ``concurrency``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"--requests must be a positive integer, got {n!r}")
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"--rate must be > 0 requests/s, got {rate!r}")
    if concurrency is not None and (isinstance(concurrency, bool) or concurrency < 1):
        raise ValueError(f"--concurrency must be a positive integer, got {concurrency!r}")
    if rate is None and profile is None and concurrency is None:
        raise ValueError("give a --rate, a --profile or a --concurrency")
    lengths = lengths or LengthModel()
    # Independent streams: changing the arrival process never changes the request sizes.
    size_rng = random.Random(seed * 1_000_003 + 17)
    arrival_rng = random.Random(seed * 1_000_003 + 29)
    sizes = [lengths.sample(size_rng) for _ in range(n)]

    mode: Mode
    fitted: RateProfile | None = None
    if profile is not None:
        mode = "profile"
        fitted = profile.fitted(n, rate)
        arrivals = _profile_arrivals(arrival_rng, fitted, n)
    elif rate is not None:
        mode = "poisson"
        arrivals = _profile_arrivals(arrival_rng, RateProfile(((rate, 1.0),), "poisson"), n)
    else:
        mode = "closed"
        arrivals = [0.0] * n
    requests = tuple(
        PlannedRequest(index=i, arrival=a, prompt_words=p, max_tokens=m)
        for i, (a, (p, m)) in enumerate(zip(arrivals, sizes, strict=True))
    )
    return TrafficPlan(
        requests=requests,
        mode=mode,
        seed=seed,
        lengths=lengths,
        rate=rate if profile is None else (fitted.segments[0][0] if fitted else None),
        profile=fitted,
        concurrency=concurrency,
    )


def _profile_arrivals(rng: random.Random, profile: RateProfile, n: int) -> list[float]:
    """Non-homogeneous Poisson arrivals; past the profile's end the last rate continues."""
    arrivals: list[float] = []
    t = 0.0
    seg_start = 0.0
    segments = list(profile.segments)
    i = 0
    while len(arrivals) < n:
        rate, duration = segments[i]
        seg_end = seg_start + duration if i < len(segments) - 1 else math.inf
        gap = rng.expovariate(rate)
        if t + gap <= seg_end:
            t += gap
            arrivals.append(t)
        else:  # memoryless: restart the draw at the boundary with the next segment's rate
            t = seg_end
            seg_start = seg_end
            i += 1
    return arrivals


_VOCAB = (
    *("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards"),
    *("quietly", "judge", "boxing", "matches", "under", "pale", "summer", "light", "and", "distant"),
    *("rivers", "carry", "old", "songs", "toward", "patient", "mountains"),
)


def prompt_text(req: PlannedRequest) -> str:
    """Deterministic prompt of exactly ``req.prompt_words`` whitespace-separated words."""
    words = [f"req{req.index}"]
    words.extend(_VOCAB[(req.index * 7 + k) % len(_VOCAB)] for k in range(req.prompt_words - 1))
    return " ".join(words)


def request_body(req: PlannedRequest, model: str) -> dict[str, Any]:
    """The streaming chat-completion body every client sends for ``req``."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt_text(req)}],
        "max_tokens": req.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }


def body_fingerprint(body: dict[str, Any]) -> str:
    """Stable short hash of a request body (tests use it to check identical replay)."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
