"""The replica set: routing, per-replica cool-downs, circuit state and TTFT history.

State here outlives a call and is shared by every call of one `Guard`. All of it
is touched from one event loop, so no locks are needed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import httpx

from llmguard_client._config import Replica

_TARGET_CACHE = 256
"""Distinct request URLs remembered per replica (cleared when full)."""


@dataclass(slots=True, eq=False)
class ReplicaState:
    """One replica with its transport and the guard's view of its health."""

    replica: Replica
    transport: httpx.AsyncBaseTransport
    base: httpx.URL
    name: str
    """The replica's URL without credentials (computed once: it is read on every attempt)."""
    in_flight: int = 0
    cooling_until: float = 0.0
    """Monotonic time before which a retry must not go here (from the server's Retry-After)."""
    open_until: float = 0.0
    """Monotonic time before which the circuit is open (the replica kept failing)."""
    consecutive_failures: int = 0
    tripped: bool = False
    """The circuit opened before and no success has closed it since (half-open after the cool-down)."""
    last_failure: float = -1e18
    ttft_ewma: float | None = None
    header_items: list[tuple[bytes, bytes]] = field(default_factory=list)
    """The replica's own headers, encoded once (they replace the caller's of the same name)."""
    header_names: frozenset[bytes] = frozenset()
    _targets: dict[tuple[str, str, int | None, bytes], httpx.URL] = field(default_factory=dict)
    _texts: dict[httpx.URL, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        own = self.replica.headers.items()
        self.header_items = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in own]
        self.header_names = frozenset(k for k, _ in self.header_items)

    def target_for(self, url: httpx.URL, known: tuple[httpx.URL, ...]) -> httpx.URL:
        """``url`` moved onto this replica (see `rebase`), cached: a service calls few distinct paths."""
        key = (url.scheme, url.host, url.port, url.raw_path)
        target = self._targets.get(key)
        if target is None:
            if len(self._targets) >= _TARGET_CACHE:
                self._targets.clear()
            target = self._targets[key] = rebase(url, self.base, known)
        return target

    def url_text(self, url: httpx.URL) -> str:
        """``str(url)``, cached alongside `target_for`."""
        text = self._texts.get(url)
        if text is None:
            if len(self._texts) >= _TARGET_CACHE:
                self._texts.clear()
            text = self._texts[url] = str(url)
        return text

    def __repr__(self) -> str:
        return (
            f"ReplicaState(name={self.name!r}, in_flight={self.in_flight}, cooling_until={self.cooling_until}, "
            f"open_until={self.open_until}, consecutive_failures={self.consecutive_failures})"
        )

    def leave(self) -> None:
        """One attempt on this replica ended (the lease calls it exactly once per attempt)."""
        self.in_flight -= 1

    def cooling(self, now: float) -> bool:
        return now < self.cooling_until

    def open(self, now: float) -> bool:
        return now < self.open_until


class ReplicaSet:
    """Picks replicas for attempts and remembers what each one said."""

    _EWMA_WEIGHT = 0.2
    FAILURE_MEMORY = 5.0
    """Seconds a replica that failed is ranked after the ones that did not."""

    def __init__(
        self, replicas: Sequence[Replica], transport_factory: Callable[[Replica], httpx.AsyncBaseTransport]
    ) -> None:
        self.states = [
            ReplicaState(r, transport_factory(r), httpx.URL(r.url.rstrip("/")), r.name) for r in replicas
        ]
        self._turn = itertools.count()

    def __len__(self) -> int:
        return len(self.states)

    def __repr__(self) -> str:
        return f"ReplicaSet({self.states!r})"

    # --- choosing -------------------------------------------------------------------------

    def pick(self, now: float, exclude: Iterable[ReplicaState] = ()) -> ReplicaState | None:
        """The replica for a call's first attempt: the least loaded of those whose circuit is
        closed, round-robin among equals; None when every replica is excluded or open.

        A replica cooling down after a Retry-After is a signal, not a wall: it ranks after a
        ready replica with as many calls in flight, but is not avoided beyond that. Its
        Retry-After was computed for the rejected call, and its admission may well take other
        calls now; steering every new call away concentrates load on the other replicas and
        was measured to lose goodput against a plain round-robin client (docs/benchmarks.md).
        """
        excluded = set(map(id, exclude))
        candidates = [s for s in self.states if id(s) not in excluded and not s.open(now)]
        if not candidates:
            return None
        return self._least_loaded(candidates, now, rotate=True)

    def pick_ready(self, now: float, exclude: Iterable[ReplicaState] = ()) -> ReplicaState | None:
        """A replica that is neither cooling nor open and not excluded (for retries), or None."""
        excluded = set(map(id, exclude))
        ready = [s for s in self.states if id(s) not in excluded and not s.cooling(now) and not s.open(now)]
        return self._least_loaded(ready, now, rotate=False) if ready else None

    def pick_hedge(self, now: float, exclude: Iterable[ReplicaState]) -> ReplicaState | None:
        """A different replica for a hedge: ready, the best recent TTFT first, then the least loaded."""
        excluded = set(map(id, exclude))
        ready = [s for s in self.states if id(s) not in excluded and not s.cooling(now) and not s.open(now)]
        if not ready:
            return None
        return min(ready, key=lambda s: (s.ttft_ewma if s.ttft_ewma is not None else 0.0, s.in_flight))

    def _least_loaded(self, states: list[ReplicaState], now: float, *, rotate: bool) -> ReplicaState:
        """Replicas without a failure in the last `FAILURE_MEMORY` seconds first, then the fewest
        attempts in flight, then those not cooling; ties go round-robin (only calls' first picks
        advance the rotation)."""
        recent = now - self.FAILURE_MEMORY

        def rank(s: ReplicaState) -> tuple[bool, int, bool]:
            return (s.last_failure > recent, s.in_flight, s.cooling(now))

        best = min(map(rank, states))
        equals = [s for s in states if rank(s) == best]
        return equals[next(self._turn) % len(equals)] if rotate else equals[0]

    def cooling_wait(self, now: float) -> float | None:
        """Seconds until the first replica whose circuit is closed ends its Retry-After
        cool-down (0 if one is ready now); None when every circuit is open."""
        waits = [max(0.0, s.cooling_until - now) for s in self.states if not s.open(now)]
        return min(waits) if waits else None

    def any_cooling(self, now: float) -> bool:
        """True while some replica is signalling overload (a Retry-After cool-down)."""
        return any(s.cooling(now) for s in self.states)

    def all_open(self, now: float) -> bool:
        return all(s.open(now) for s in self.states)

    # --- learning -------------------------------------------------------------------------

    def cool_down(self, state: ReplicaState, now: float, seconds: float) -> None:
        state.cooling_until = max(state.cooling_until, now + seconds)

    def succeeded(self, state: ReplicaState, ttft: float | None) -> None:
        state.consecutive_failures = 0
        state.open_until = 0.0
        state.tripped = False
        if ttft is not None:
            w = self._EWMA_WEIGHT
            state.ttft_ewma = ttft if state.ttft_ewma is None else (1 - w) * state.ttft_ewma + w * ttft

    def failed(self, state: ReplicaState, now: float, threshold: int, cooldown: float) -> bool:
        """Count a failure (connect error, 5xx, reset); True when it opened the circuit."""
        state.consecutive_failures += 1
        state.last_failure = now
        if (state.tripped or state.consecutive_failures >= threshold) and not state.open(now):
            state.open_until = now + cooldown
            state.consecutive_failures = 0
            state.tripped = True
            return True
        return False

    async def aclose(self) -> None:
        for state in self.states:
            await state.transport.aclose()


def rebase(url: httpx.URL, base: httpx.URL, known: tuple[httpx.URL, ...]) -> httpx.URL:
    """``url`` moved onto ``base``: if it starts with a known replica base, that prefix is
    swapped for ``base``'s; otherwise its path is appended to ``base``. Query kept."""
    path = url.raw_path.split(b"?", 1)[0].decode("ascii")
    for candidate in known:
        if url.host == candidate.host and url.port == candidate.port and url.scheme == candidate.scheme:
            prefix = candidate.path.rstrip("/")
            if path == prefix or path.startswith(prefix + "/"):
                path = path[len(prefix) :]
                break
    return base.copy_with(path=base.path.rstrip("/") + path, query=url.query or None)
