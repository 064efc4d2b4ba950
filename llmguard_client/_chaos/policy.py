"""The `Chaos` policy: which faults to inject, each at its own rate, and the switch that must allow it."""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

import httpx

from llmguard_client._core.redact import mask_url_secrets
from llmguard_client.config import replica_name
from llmguard_client.errors import GuardConfigError

CHAOS_ENV = "LLMGUARD_CHAOS"
"""The environment variable that must be ``1`` (or true/yes/on) for a Guard to inject faults at all."""
_ON = frozenset({"1", "true", "yes", "on"})

Fault = Literal["status_429", "status_503", "status_500", "reset", "stall", "cut", "latency"]
"""The name an injected fault is marked with in the attempt's record (``AttemptRecord.chaos``) and span."""

EXCLUSIVE: tuple[tuple[str, Fault], ...] = (
    ("rate_limited", "status_429"),
    ("unavailable", "status_503"),
    ("server_error", "status_500"),
    ("reset", "reset"),
    ("stall", "stall"),
    ("cut", "cut"),
)
"""The faults of which an attempt gets at most one: (the policy's rate field, the fault's name), in draw order."""


def chaos_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``LLMGUARD_CHAOS`` is 1/true/yes/on. Anything else, a typo included, leaves chaos off."""
    raw = (os.environ if environ is None else environ).get(CHAOS_ENV)
    return raw is not None and raw.strip().lower() in _ON


def _name(replica: str) -> str:
    """A replica named in ``Chaos.replicas``, read as `Replica` reads its URL (scheme and host in any case, a
    default port, credentials); kept as given, without a trailing slash, when it is no URL."""
    try:
        return replica_name(replica)
    except httpx.InvalidURL:
        return replica.rstrip("/")


def _rate(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise GuardConfigError(f"Chaos.{name} must be a rate from 0.0 to 1.0, got {value!r}")


def _seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise GuardConfigError(f"Chaos.{name} must be a finite number of seconds >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Chaos:
    """Faults the guard injects into its own attempts, for testing an application against a bad dependency.

    Each rate is the fraction of attempts (physical requests: primaries, retries, hedges, continuations) that
    get that fault. An attempt gets at most one of the first six (their rates add up to at most 1.0);
    ``latency`` is drawn on its own and adds to any of them. The guard handles an injected fault as it would
    the real one: a 429 cools the replica down for its Retry-After, a stall is hedged, a cut stream is
    continued (``ContinuationPolicy``) or fails typed.

    rate_limited:  answer 429 with ``Retry-After: retry_after`` (nothing is sent to the replica), in whole
                   seconds rounded up, a fractional delay also exactly in ``retry-after-ms``.
    unavailable:   answer 503 (nothing is sent).
    server_error:  answer 500 (nothing is sent).
    reset:         the connection is reset before an answer (an ``httpx.ReadError``; nothing is sent).
    stall:         the request is sent, the answer's status and headers come at once and its body is held back
                   ``stall_for`` seconds (a server that queued the call); a read timeout shorter than that (the
                   client's) ends the read at that timeout (``httpx.ReadTimeout``): a stream's first read.
    cut:           the request is sent, and its stream is cut (``httpx.RemoteProtocolError``, as a peer closing
                   mid-body) at the first read after its first content token. An answer that is complete
                   by then (a non-streamed body) is not cut, nor marked.
    latency:       wait ``latency_for`` seconds before sending, as a slow connect: a connect timeout shorter than
                   that (the client's) ends the attempt at that timeout (``httpx.ConnectTimeout``; nothing is sent).
    replicas:      inject only into attempts to these replicas (base URLs, as the Guard was given them, read as
                   `Replica` reads them: scheme and host in any case; one that is not the Guard's is refused when
                   the policy is set); None: every replica.
    seed:          seeds the random source the attempts' draws come from (None: unseeded). With one seed and
                   the same sequence of attempts, the same attempts get the same faults.

    Refused unless the environment variable ``LLMGUARD_CHAOS`` is ``1`` (`GuardConfigError`), so that it cannot
    reach production by a configuration slip.
    """

    rate_limited: float = 0.0
    retry_after: float = 1.0
    unavailable: float = 0.0
    server_error: float = 0.0
    reset: float = 0.0
    stall: float = 0.0
    stall_for: float = 30.0
    cut: float = 0.0
    latency: float = 0.0
    latency_for: float = 0.5
    replicas: Collection[str] | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        for name, _ in EXCLUSIVE:
            _rate(name, getattr(self, name))
        _rate("latency", self.latency)
        total = sum(getattr(self, name) for name, _ in EXCLUSIVE)
        if total > 1.0 + 1e-9:
            names = ", ".join(name for name, _ in EXCLUSIVE)
            raise GuardConfigError(
                f"Chaos rates {names} must add up to at most 1.0 (one fault an attempt), got {total}"
            )
        _seconds("retry_after", self.retry_after)
        _seconds("stall_for", self.stall_for)
        _seconds("latency_for", self.latency_for)
        if self.replicas is not None:
            if isinstance(self.replicas, str) or not all(isinstance(r, str) and r for r in self.replicas):
                raise GuardConfigError(
                    "Chaos.replicas must be a collection of replica names or None, got "
                    f"{mask_url_secrets(repr(self.replicas))}"
                )
            object.__setattr__(self, "replicas", frozenset(_name(r) for r in self.replicas))
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise GuardConfigError(f"Chaos.seed must be an integer or None, got {self.seed!r}")
