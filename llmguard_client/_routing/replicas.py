"""The replica set: routing, per-replica cool-downs, circuit state and health.

State here outlives a call and is shared by every call of one `Guard`. All of it
is touched from one event loop, so no locks are needed. Which replica gets an
attempt is the `llmguard_client._routing.router.Router`'s choice, among those this set
allows (not excluded, circuit closed, and for retries and hedges not cooling).

Panic mode (Envoy's panic threshold): while fewer than ``panic_threshold`` of the replicas are healthy
(circuit closed and not drained as degraded; a circuit that opened is closed again only by a call it served, not
by the end of its cool-down, when it is half-open), health stops excluding replicas: one whose circuit is open
still takes a first attempt or a retry when no other is left, ranked after every other (degraded ones
already rank last, `llmguard_client._routing.router`). With one replica, its circuit never stops the guard
from sending to it. A hedge is never sent to an open circuit. A log line says when panic starts and ends.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from llmguard_client._core.redact import CREDENTIALS, basic_credential, credential_key
from llmguard_client._http.urlpath import path_under, sent_path, with_sent_path
from llmguard_client._routing.affinity.routing import AffinityRouting, Prefer
from llmguard_client._routing.caller import caller, calling_as, holds_for_caller, scopes, united
from llmguard_client._routing.cooldown import (
    FIRST_PROBE,
    REFUSALS_TO_COOL,
    cool,
    first_attempt_candidates,
    first_wait,
    give_back_probe,
    probe_pending,
    take_probe,
)
from llmguard_client._routing.health import shift
from llmguard_client._routing.reach import deepest, same_base, same_origin
from llmguard_client._routing.router import ReplicaHealth, Router
from llmguard_client._routing.wakeup import Wakeup
from llmguard_client.config import AffinityPolicy, Replica
from llmguard_client.telemetry._record_builder import AnyAttempt
from llmguard_client.telemetry.record import AttemptOutcome

logger = logging.getLogger("llmguard_client")

Keep = Callable[[Callable[[], None]], object]
"""Where a call keeps what it must undo when it ends (its lease's ``hold``)."""

_TARGET_CACHE = 256
"""Distinct request URLs remembered per replica (cleared when full)."""
_COOLING_SCOPES = 8
"""The keys one cool-down holds for at most (`ReplicaState.hold_for`)."""


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
    probe_at: float = math.inf
    """When this cool-down's next probe may take a first attempt (inf: none from this process)."""
    probing: bool = False
    """The probe was sent: its win ends the cool-down."""
    probes: int = 0
    """How many probes this process sent here: the last one's number names the probe in flight."""
    probes_refused: int = 0
    """How many probes of this cool-down were refused again (each doubles the wait for the next)."""
    asked_beyond: tuple[float, float] = (0.0, 0.0)
    """For a cool-down cut short of a longer Retry-After than the guard waits: (the ``cooling_until`` it set,
    when the server's Retry-After ends); it no longer applies once ``cooling_until`` changes."""
    open_until: float = 0.0
    """Monotonic time before which the circuit is open (the replica kept failing)."""
    consecutive_failures: int = 0
    refusals: int = 0
    """Overload answers in a row (generation calls): none served, nor answered otherwise, between them
    (`ReplicaSet.refused`)."""
    holder: str | None = None
    """The limit scopes (`llmguard_client._routing.caller.scopes`) the cool-down in force holds for, a 429's: those
    rate limits or quotas, not the replica's; None: every caller (a 503, a 529, the guard's own). One cool-down is
    kept: another key's 429 joins its scopes to it (`hold_for`)."""
    key_ends: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    """For a cool-down held for several keys (`holder` naming more than one): each key's own end, and when the
    server's Retry-After to it ends (None: within the guard's wait). A key's calls wait for its own end only."""
    run_keys: frozenset[str] = frozenset()
    """The limit scopes of the 429s in the run of `refusals`: a run of some keys' 429s, which other keys' calls
    served do not end, holds for those keys (`servers_run` for when it holds for every caller)."""
    run_own: bool = False
    """The replica's own refusal (a 503, a 529) is in that run."""
    served_in_run: bool = False
    """A call outside the run's keys was answered since that run began: no other key's refusal joins it."""
    unnamed: bool = False
    """The cool-down in force is the guard's own, for overload answers that named no wait (no Retry-After): a call
    the replica serves ends it, as its probe's would."""
    tripped: bool = False
    """The circuit opened before and no success has closed it since (half-open after the cool-down)."""
    local_cool: bool = False
    """The cool-down in force was set by an injected fault (`Chaos`): this process's own, never shared with a fleet
    (neither it nor its end)."""
    local_open: bool = False
    """The same for the circuit: it was opened by an injected fault."""
    set_at: float = -math.inf
    """When its cool-down or circuit was last set (see `settle`)."""
    seen: float = -math.inf
    """The time `settle` was last asked at."""
    health: ReplicaHealth = field(default_factory=ReplicaHealth)
    """Speed, failures, drain and rate-limit room, as the router sees them."""

    @property
    def ttft_ewma(self) -> float | None:
        """The router's TTFT estimate (seconds; None until a first token arrived)."""
        return self.health.ttft

    header_items: list[tuple[bytes, bytes]] = field(default_factory=list)
    """The replica's own headers but ``Host``, encoded once (they replace the caller's of the same name), with the
    ``Authorization`` its URL's userinfo stands for."""
    host: bytes | None = None
    """The replica's own ``Host`` header (None: the one its URL gives): a server or ingress that routes on it."""
    own_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    """Every header of the replica's own, ``Host`` first: what a request of the guard's own to it carries."""
    header_names: frozenset[bytes] = frozenset()
    """The caller's headers they replace (their names, lowercase)."""
    replaces_credential: bool = False
    """Whether they replace a `CREDENTIALS` header of the caller's."""
    foreign_keys: frozenset[bytes] = frozenset()
    """The keys the other replicas' own credential headers carry (`ReplicaSet`): a caller's credential carrying one
    is that replica's, not this one's."""
    _targets: dict[tuple[str, str, int | None, bytes], httpx.URL] = field(default_factory=dict)
    _texts: dict[httpx.URL, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        own = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.replica.headers.items()]
        basic = basic_credential(httpx.URL(self.replica.url))
        if basic is not None:  # the replica's credential, as if in its headers (`Replica` refuses both at once)
            own.append((b"authorization", basic))
        self.host = next((v for k, v in own if k == b"host"), None)
        self.header_items = [(k, v) for k, v in own if k != b"host"]
        self.own_headers = self.header_items if self.host is None else [(b"host", self.host), *self.header_items]
        self.header_names = frozenset(k for k, _ in self.header_items)
        self.replaces_credential = bool(self.header_names & CREDENTIALS)

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
        if now < self.seen:  # read on every pick: the check inline, `settle` only when the clock read earlier
            self.settle(now)
        self.seen = now
        return now < self.cooling_until and now < self.cooling_end()  # read on every pick: no cool-down, no more

    def cooling_end(self) -> float:
        """When the cool-down that holds for the call running here ends (0: none holds for it): its key's own end,
        in one held for several keys."""
        if not holds_for_caller(self.holder):
            return 0.0
        own = self._own_end()
        return self.cooling_until if own is None else min(own[0], self.cooling_until)

    def asked_until(self) -> float | None:
        """When the server's Retry-After to the call running here ends, for a cool-down cut short of it (the guard
        waits less than it asked; None: it did not)."""
        own = self._own_end()
        if own is not None:
            return own[1]
        set_until, asked_until = self.asked_beyond
        return asked_until if set_until == self.cooling_until else None

    def _own_end(self) -> tuple[float, float | None] | None:
        """The entry of `key_ends` for the call running here (None: outside a call, or a cool-down of one key)."""
        current = caller()
        return self.key_ends.get(current) if self.key_ends and current is not None else None

    def note_ends(self, holder: str | None, until: float, asked_until: float | None, asker: str | None) -> bool:
        """The keys of ``holder`` (a 429's, or a run's of several keys) were refused until ``until``, the server
        asking ``asker``'s call to wait until ``asked_until`` (None: no longer): in a cool-down held for several
        keys, a key new to it ends then, and only ``asker`` has its end lengthened and what the server asked of it
        kept (another key of the run was not told of it: a quota's day, or a long limit refused again, is that
        key's). None: every key of ``holder`` (a fleet event's). Returns whether one changed."""
        if self.holder is None or "," not in self.holder:
            self.key_ends.clear()
            return False
        changed = False
        for key in scopes(holder) if holder is not None else ():
            if key in self.key_ends and asker is not None and key != asker:
                continue
            end, asked = self.key_ends.get(key, (-math.inf, None))
            told = asked_until if key == asker else None
            if until > end:
                later = asked if told is None else told if asked is None else max(asked, told)
                self.key_ends[key] = (until, later)
                changed = True
        return changed

    def servers_run(self) -> bool:
        """Whether the run of `refusals` holds for every caller: the replica's own refusal is in it, or
        `REFUSALS_TO_COOL` keys' 429s with no call served between (a queue refusing every key, or a limit they
        share). Two keys past their own limits at once are not."""
        return self.run_own or len(self.run_keys) >= REFUSALS_TO_COOL

    def refusals_in_row(self) -> int:
        """`refusals`, when their run holds for the call running here (0: a run of other keys' 429s)."""
        current = caller()
        return self.refusals if self.servers_run() or current is None or current in self.run_keys else 0

    def hold_for(self, now: float, holder: str | None) -> tuple[str | None, float, bool]:
        """Before a cool-down for ``holder`` (a 429's scopes; None: every caller) starts or is renewed at ``now``:
        the holder it takes. One in force for every caller stays so, and one for every caller takes over one in
        force for some keys (renewed as before, its probes and length kept); one in force for other keys holds for
        theirs and ``holder``'s, up to `_COOLING_SCOPES` keys; past them it is dropped first (those keys' next calls
        meet their limits again, as they would unguarded). And the latest it may end: a key's limit does not
        lengthen a cool-down every caller takes (that key's next call after it meets its limit again); and whether a
        key not held back before (its own end passed, or new) joins one in force for other keys."""
        if self.holder == holder and now < self.cooling_until:
            return holder, math.inf, False
        if now >= self.cooling_until:
            self.key_ends.clear()
            return holder, math.inf, False
        if self.holder is None:
            return None, math.inf if holder is None else self.cooling_until, False
        self.key_ends_of_one()
        if holder is None:
            self.key_ends.clear()
            return None, math.inf, False
        live = [key for key in scopes(self.holder) if self.key_ends.get(key, (self.cooling_until,))[0] > now]
        both = united(",".join(live), holder)
        if live and len(scopes(both)) <= _COOLING_SCOPES:
            for key in set(self.key_ends) - set(live):
                del self.key_ends[key]
            return both, math.inf, not set(scopes(holder)) <= set(live)
        self.key_ends.clear()  # every key's own end has passed (or too many keys): a cool-down of ``holder``'s own
        self.cooling_until, self.probe_at, self.probing, self.probes_refused = 0.0, math.inf, False, 0
        self.unnamed, self.asked_beyond = False, (0.0, 0.0)
        return holder, math.inf, False

    def release(self, key: str | None) -> None:
        """A call of ``key`` was answered otherwise than with overload: in a cool-down held for several keys, that key's
        limit no longer holds its calls back (the others' go on, until their own ends)."""
        if key is None or not self.key_ends or key not in self.key_ends or self.holder is None:
            return
        del self.key_ends[key]
        left = [k for k in scopes(self.holder) if k != key]
        self.holder = ",".join(left)
        # It ends when the last of the keys left does (the key that left may have set its end).
        self.cooling_until = min(self.cooling_until, max(self.key_ends.get(k, (self.cooling_until,))[0] for k in left))
        if len(left) == 1:  # a cool-down of one key again: its own Retry-After is the cool-down's
            _, asked = self.key_ends.pop(left[0], (self.cooling_until, None))
            self.asked_beyond = (self.cooling_until, asked) if asked is not None else (0.0, 0.0)
            self.key_ends.clear()

    def key_ends_of_one(self) -> None:
        """Give each key of the cool-down in force its own end (`key_ends`), before another key joins it: the
        cool-down's, when it holds for one key."""
        if not self.key_ends and self.holder is not None:
            asked = self.asked_until()
            for key in scopes(self.holder):
                self.key_ends[key] = (self.cooling_until, asked)

    def open(self, now: float) -> bool:
        if now < self.seen:
            self.settle(now)
        self.seen = now
        return now < self.open_until

    def settle(self, now: float) -> None:
        """Keep this replica's instants on the clock's time line as it reads ``now``. A clock that went back (a
        test's frozen clock let go, a loop on another time line) finds instants set after ``now``: all of them move
        back together until the latest is ``now``, so a wait keeps what was left of it (a cool-down never
        outlasts its length) and what fades goes on fading. Only instants set when something happened (an answer,
        a cool-down, a report) tell: a retry's pick and send are set ahead, at the instant it will be sent."""
        by = self.behind(now)
        if by:
            self.set_at += by
            self.cooling_until += by
            self.probe_at += by
            self.open_until += by
            set_until, asked_until = self.asked_beyond
            self.asked_beyond = (set_until + by, asked_until + by)
            self.key_ends = {
                key: (end + by, None if asked is None else asked + by) for key, (end, asked) in self.key_ends.items()
            }
            shift(self.health, by)
        self.seen = now

    def behind(self, now: float) -> float:
        """How far `settle` would move this replica's instants at ``now`` (0, or less when the clock went back),
        without moving them: what a reader that changes nothing (a snapshot, from any thread) adds to them."""
        if now >= self.seen:
            return 0.0
        h = self.health
        latest = max(self.set_at, h.failure_at, h.rejection_at, h.drained_at, h.reported_at)
        return min(0.0, now - latest)


class SharedState(Protocol):
    """Where a `ReplicaSet` reports what it learned, to share it (`llmguard_client._fleet.FleetMirror`)."""

    def cooled(self, state: ReplicaState, seconds: float, holder: str | None) -> None: ...

    def opened(self, state: ReplicaState, seconds: float) -> None: ...

    def cleared(self, state: ReplicaState) -> None: ...

    def closed(self, state: ReplicaState) -> None: ...


class ReplicaSet:
    """Picks replicas for attempts and remembers what each one said."""

    shared: SharedState | None = None
    """Told of each cool-down, opened circuit, closed circuit and successful probe (the fleet mirror; None: in
    process)."""

    def __init__(
        self,
        replicas: Sequence[Replica],
        transport_factory: Callable[[Replica], httpx.AsyncBaseTransport],
        router: Callable[[list[ReplicaState]], Router[ReplicaState]] = Router,
        affinity: AffinityPolicy | None = None,
        panic_threshold: float = 0.5,
    ) -> None:
        self.panic_threshold = panic_threshold
        """Below this share of healthy replicas, open circuits still take calls (`RetryPolicy.panic_threshold`)."""
        self.cooling_changed = Wakeup()
        """Wakes the first attempts waiting for a cool-down when one is renewed, or ended by its probe."""
        self._panicking = False
        self._transport_factory = transport_factory
        self.renewals = 0
        """How many times the replicas' pools were renewed for another event loop (`renew_transports`)."""
        self.states = [ReplicaState(r, transport_factory(r), httpx.URL(r.name), r.name) for r in replicas]
        keys = [{credential_key(v) for k, v in s.header_items if k in CREDENTIALS} for s in self.states]
        for state, own in zip(self.states, keys, strict=True):
            state.foreign_keys = frozenset().union(*(k for k in keys if k is not own)) - own
        self._by_name = {s.name: s for s in self.states}
        self.router = router(self.states)
        """Chooses among the replicas this set allows, and learns their speed and failures."""
        names = [s.name for s in self.states]
        self.affinity = AffinityRouting(names, affinity, self.router.cheapest) if affinity is not None else None
        """Cache affinity: the keyed calls' preferred replicas (None: off)."""

    def __len__(self) -> int:
        return len(self.states)

    def __repr__(self) -> str:
        return f"ReplicaSet({self.states!r})"

    # --- choosing -------------------------------------------------------------------------

    def pick(
        self,
        now: float,
        exclude: Iterable[ReplicaState] = (),
        key: str | None = None,
        *,
        cornered: bool = False,
        resting: bool = True,
        take: bool = True,
        keep: Keep | None = None,
    ) -> ReplicaState | None:
        """The replica for a call's first attempt, among those not excluded whose circuit is closed
        (None when there is none): the router's least-cost choice, or a probe of a drained replica.

        A replica cooling down after a Retry-After gets no first attempt while another is ready, but one
        probe per cool-down; when all are cooling, the router spreads calls over them by load
        (`llmguard_client._routing.cooldown`).

        A call with an affinity ``key`` goes to the key's first replica the router allows, within the load
        bound (`llmguard_client._routing.affinity.routing`); ``pick_ready`` and ``pick_hedge`` do the same.
        A ``cornered`` call (one that only the replicas not excluded can serve: `llmguard_client._routing.reach`)
        goes to one whose circuit is open when none of them has a closed one, as with one replica. Not
        ``resting`` (a call off the generation paths), cool-downs are not heeded and no probe is taken. Not
        ``take`` (a retry chosen ahead of ``now``, when it will be sent), a due probe may be chosen but is not
        taken: `take_probe` takes it if the attempt goes as the probe. ``keep``: see `take_probe`.
        """
        offered = self._allowed(now, exclude, cornered=cornered)
        if resting:  # else (a call off the generation paths) a cooling replica takes it, as a ready one would
            offered = first_attempt_candidates(offered, now)
        state = self.router.pick(now, offered, self._prefer(key, now))
        if take and resting and len(offered) == 1 and state is not None:  # offered alone: perhaps as the probe
            self.take_probe(state, now, keep)
        return state

    def asked_beyond(self, now: float, exclude: Iterable[ReplicaState] = ()) -> float:
        """Seconds left of the Retry-After of the only replica left (not excluded), when it asked for longer than
        the guard waits and is cooling for it (0: it did not, or more than one replica is left)."""
        state = self.alone(now, exclude)
        if state is None:
            return 0.0
        if not state.cooling(now):
            return 0.0
        asked = state.asked_until()
        return 0.0 if asked is None else max(0.0, asked - now)

    def alone(self, now: float, exclude: Iterable[ReplicaState] = ()) -> ReplicaState | None:
        """The only replica left (not excluded; circuit closed, or open in panic mode when nowhere else is), or
        None when there are several, or none."""
        allowed = self._allowed(now, exclude)
        return allowed[0] if len(allowed) == 1 else None

    def allows(self, now: float, state: ReplicaState, exclude: Iterable[ReplicaState] = ()) -> bool:
        """Whether ``state`` may take an attempt: not excluded, its circuit closed (or open in panic mode when no
        replica left has a closed one)."""
        return any(s is state for s in self._allowed(now, exclude))

    def take_probe(self, state: ReplicaState, at: float, keep: Keep | None = None) -> None:
        """An attempt goes to ``state`` at ``at``: if ``state`` is cooling then with its probe due, it is that
        probe (the calls waiting for it wait for its answer instead). ``keep`` (the call's lease's ``hold``)
        keeps the probe's give-back: when the call ends with nothing having answered the probe (its caller gave
        up, its deadline passed first), the probe is due again and the calls waiting are woken."""
        probe = take_probe(state, at)
        if probe is not None and keep is not None:
            keep(lambda: self._give_back_probe(state, probe))

    def probe_unsent(self, state: ReplicaState) -> None:
        """The probe in flight of ``state``'s cool-down never reached it (its connection failed in this process): it
        is due again at once, and the calls waiting for it are woken (its own: another scope's is not its)."""
        if holds_for_caller(state.holder):
            self._give_back_probe(state, state.probes)

    def _give_back_probe(self, state: ReplicaState, probe: int) -> None:
        if give_back_probe(state, probe):
            self.cooling_changed.notify()

    def first_wait(self, now: float, exclude: Iterable[ReplicaState] = ()) -> float:
        """Seconds before `pick` can offer a first attempt: 0, unless the one replica left is cooling with no
        probe due (`llmguard_client._routing.cooldown.first_wait`)."""
        return first_wait(self._allowed(now, exclude), now)

    def probe_pending(self, now: float, exclude: Iterable[ReplicaState] = ()) -> bool:
        """Whether the one replica left is cooling with its probe in flight
        (`llmguard_client._routing.cooldown.probe_pending`)."""
        return probe_pending(self._allowed(now, exclude), now)

    def panic(self, now: float) -> bool:
        """Whether fewer than ``panic_threshold`` of the replicas are healthy (circuit closed, not degraded);
        logs when that starts and ends. A half-open circuit (its cool-down over, no call served since it opened)
        is not closed yet: its probe failing again is the same outage, not a new panic."""
        healthy = sum(
            1 for s in self.states if now >= s.open_until + s.behind(now) and not s.tripped and not s.health.drained
        )
        panicking = healthy < self.panic_threshold * len(self.states)
        if panicking != self._panicking:
            self._panicking = panicking
            if panicking:
                logger.warning(
                    "llmguard: panic mode: %d of %d replica(s) healthy, under the panic threshold of %.0f%%; "
                    "replicas with an open circuit take calls again (ranked last)",
                    healthy,
                    len(self.states),
                    100 * self.panic_threshold,
                )
            else:
                logger.info("llmguard: panic mode over: %d of %d replica(s) healthy", healthy, len(self.states))
        return panicking

    def _allowed(
        self, now: float, exclude: Iterable[ReplicaState], *, cooling: bool = True, cornered: bool = False
    ) -> list[ReplicaState]:
        """The replicas not excluded whose circuit is closed (and, with ``cooling`` False, not cooling); in panic
        mode or ``cornered``, when there is none, those whose circuit is open too."""
        excluded = set(map(id, exclude))
        left = [s for s in self.states if id(s) not in excluded and (cooling or not s.cooling(now))]
        closed = [s for s in left if not s.open(now)]
        # Judged whenever a circuit is open (and while in panic, to see it end), so both are logged as they come.
        if (len(closed) < len(left) or self._panicking) and self.panic(now) and not closed:
            return left
        if cornered and not closed:
            return left
        return closed

    def pick_ready(
        self, now: float, exclude: Iterable[ReplicaState] = (), key: str | None = None
    ) -> ReplicaState | None:
        """A replica that is neither cooling nor open and not excluded (for retries), or None."""
        return self.router.pick_ready(now, self._allowed(now, exclude, cooling=False), self._prefer(key, now))

    def pick_hedge(self, now: float, exclude: Iterable[ReplicaState], key: str | None = None) -> ReplicaState | None:
        """A different replica for a hedge: ready and healthy, the best recent TTFT first, then the least loaded."""
        return self.router.pick_hedge(now, self._ready(now, exclude), self._prefer(key, now))

    def expected_hit(self, key: str | None, state: ReplicaState) -> bool | None:
        """Whether a call keyed ``key`` sent to ``state`` should find its prefix cached there (None: unkeyed, or
        affinity off): ``state`` answered the key's last call."""
        if self.affinity is None or key is None:
            return None
        return self.affinity.expected_hit(key, state.name)

    def _prefer(self, key: str | None, now: float) -> Prefer[ReplicaState] | None:
        return self.affinity.prefer(key, now) if self.affinity is not None and key is not None else None

    def _ready(self, now: float, exclude: Iterable[ReplicaState]) -> list[ReplicaState]:
        excluded = set(map(id, exclude))
        return [s for s in self.states if id(s) not in excluded and not s.cooling(now) and not s.open(now)]

    def cooling_wait(self, now: float, exclude: Iterable[ReplicaState] = ()) -> float | None:
        """Seconds until a replica not excluded whose circuit is closed (in panic mode: any) may take an attempt
        again (0 if one is ready now): the first end of a Retry-After cool-down or, with one replica left, its
        probe if that comes sooner. None when there is none."""
        allowed = self._allowed(now, exclude)
        if len(allowed) == 1:
            return first_wait(allowed, now)
        return min((max(0.0, s.cooling_end() - now) for s in allowed), default=None)

    def cooling_left(self, now: float, exclude: Iterable[ReplicaState] = ()) -> float:
        """Seconds until the first cool-down among the replicas `cooling_wait` reads ends (0: none cooling)."""
        return min((max(0.0, s.cooling_end() - now) for s in self._allowed(now, exclude)), default=0.0)

    def any_cooling(self, now: float) -> bool:
        """True while some replica is signalling overload (a Retry-After cool-down)."""
        return any(s.cooling(now) for s in self.states)

    def all_open(self, now: float) -> bool:
        return all(s.open(now) for s in self.states)

    def probe_answered(self, state: ReplicaState) -> None:
        """A probe of ``state``'s cool-down was answered with something other than overload (a 500, a reset):
        the server no longer asks for rest, so the cool-down ends here (the circuit judges the failure; other
        processes of a fleet keep theirs: a clear would close their circuits too)."""
        self._probe_ended(state)

    def _probe_ended(self, state: ReplicaState) -> None:
        """If ``state``'s cool-down had its probe in flight, that probe's answer ends it: the calls waiting go (an
        answer to a call of another scope than the one it holds for is no answer to its probe)."""
        if state.probing and holds_for_caller(state.holder):
            state.cooling_until, state.probing = 0.0, False
            self.cooling_changed.notify()

    # --- learning -------------------------------------------------------------------------

    def cool_down(
        self,
        state: ReplicaState,
        now: float,
        seconds: float,
        asked: float | None = None,
        *,
        unnamed: bool = False,
        injected: bool | None = None,
        holder: str | None = None,
    ) -> None:
        """The server asked for ``seconds`` of rest: no first attempts but probes until then (at growing intervals:
        `llmguard_client._routing.cooldown.cool`). ``asked``: its own Retry-After, when it was longer than
        ``seconds`` (the guard's cap, `RetryPolicy.max_retry_after`). ``unnamed``: the overload answers named no wait
        (the guard's own cool-down): any call the replica serves ends it, not only its probe. ``injected``: the
        answer was a `Chaos` fault, so the cool-down stays in this process (see `_sharing`); None: no answer asked
        for it (the guard's own, for a circuit that tripped), so it is local when that circuit is. ``holder``: the
        limit scopes of the 429s that asked for it, which it holds for alone (`ReplicaState.hold_for`); None: every
        caller."""
        until = state.cooling_until
        state.holder, latest, joined = state.hold_for(now, holder)
        seconds = min(seconds, latest - now)
        if joined and not state.probing:  # a key joining is probed as soon as a cool-down of its own would be
            state.probe_at = min(state.probe_at, now + FIRST_PROBE)
        with calling_as(state.holder):  # the cool-down in force as the one it renews sees it
            named = state.cooling(now) and not state.unnamed
            cooled = cool(state, now, seconds)
        noted = state.note_ends(holder, now + seconds, None if asked is None else now + asked, caller())
        if not (cooled or noted):
            return
        if cooled:
            state.unnamed = unnamed and not named
        self.cooling_changed.notify()  # the calls waiting decide again: renewed, or their probe refused
        if state.cooling_until != until:
            state.asked_beyond = (state.cooling_until, now + asked) if asked is not None else (0.0, 0.0)
            state.local_cool = state.local_open if injected is None else injected
            shared = self._sharing(state.local_cool)
            if shared is not None:  # a run's keys renewing a cool-down they are in: the key refused, alone
                asker = caller()
                renewed = holder is not None and asker in scopes(holder) and until > now and not joined
                shared.cooled(state, seconds, asker if renewed else holder)

    def refused(self, state: ReplicaState, holder: str | None = None) -> tuple[int, str | None]:
        """``state`` answered a generation call with overload (429/503/529, an in-stream overload error): how many such
        answers in a row it has now sent, and whom a cool-down they ask for holds for. A call it serves (`succeeded`),
        or any other answer (`answered`), ends the run. ``holder``: a 429's scope (None: the replica's own refusal).
        A run of some keys' 429s goes on past other keys' calls answered between; another key's refusal joins it
        when no call was answered since it began (two keys past their limits at once), and else starts a run of its
        own. A key's 429 asks for a cool-down for the run's keys, every caller's once `REFUSALS_TO_COOL` keys are in
        it (a queue refusing every key, or a limit they share): the replica's own refusals in the run count, but do
        not make a key's Retry-After every caller's."""
        if state.refusals and state.served_in_run and (holder is None or holder not in state.run_keys):
            state.refusals = 0
        if state.refusals == 0:
            state.run_keys, state.run_own, state.served_in_run = frozenset(), False, False
        if holder is None:
            state.run_own = True
        elif len(state.run_keys) < REFUSALS_TO_COOL:
            state.run_keys |= {holder}
        state.refusals += 1
        if holder is None or len(state.run_keys) >= REFUSALS_TO_COOL:
            return state.refusals, None
        return state.refusals, ",".join(sorted(state.run_keys))

    def answered(self, state: ReplicaState) -> None:
        """``state`` answered a generation call with something other than overload (a 500, a 404, a 429 refusing
        that request for its own size): its run of overload answers (`refused`) ends, unless the run is other
        keys', which no other key's refusal joins then."""
        current = caller()
        state.release(current)
        if state.servers_run() or current is None or current in state.run_keys or len(state.run_keys) > 1:
            state.refusals = 0  # several keys' run: refused at once no more (another key is served)
        else:
            state.served_in_run = True

    def succeeded(
        self,
        state: ReplicaState,
        ttft: float | None,
        now: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """An attempt on ``state`` won (its first token came ``ttft`` s after it started, scaled to a typical
        prompt's: `TTFTStats.scale`): the circuit closes, a cool-down whose probe this was ends, and the router
        learns its TTFT and rate-limit headers."""
        ours = holds_for_caller(state.holder)  # another scope's cool-down: this call says nothing of its limit
        own = ours and state.unnamed and (now is None or state.cooling(now))  # the guard's own: any call served ends
        probed = ours and state.probing
        # The cool-down's own probe (or any call, for the guard's own): it serves again. A circuit closing says
        # nothing of a Retry-After another process was given.
        cleared = self._sharing(state.local_cool) if probed or own else None
        closed = self._sharing(state.local_open) if state.tripped else None
        if cleared is not None:
            cleared.cleared(state)
        elif closed is not None:
            closed.closed(state)
        if probed or own:
            state.local_cool = False
        state.local_open = False
        if own:
            state.cooling_until, state.probing, state.unnamed = 0.0, False, False
            self.cooling_changed.notify()
        self._probe_ended(state)
        self.answered(state)
        if state.tripped:
            logger.info("llmguard: replica %s answered again; its circuit is closed", state.name)
        state.consecutive_failures = 0
        state.open_until = 0.0
        state.tripped = False
        when = now if now is not None else state.health.failure_at  # no clock given: nothing fades
        if ttft is not None:
            self.router.first_token(state, when, ttft)
        else:
            self.router.answered(state, when)
        if headers is not None:
            self.router.saw_headers(state, when, headers)

    def rejected(self, state: ReplicaState, now: float, status: int) -> None:
        """A generation call on ``state`` was answered ``status`` (401, 403 or 404): the router weighs it against
        the other replicas' (`Router.rejected`); it never counts toward the circuit."""
        self.router.rejected(state, now, status)

    def served(self, key: str | None, state: ReplicaState) -> bool | None:
        """``state`` answered a call keyed ``key``: it becomes the key's home. Whether that was `expected_hit`."""
        return None if self.affinity is None else self.affinity.served(key, state.name)

    def losers(self, attempts: Iterable[AnyAttempt], scale: float | None = 1.0) -> None:
        """Attempts that lost a race before their first token: how long each waited (times ``scale``, the call's
        `TTFTStats.scale`; None: unknown, nothing learned) is a lower bound on its replica's TTFT
        (`Router.outran`)."""
        self._waited(attempts, "lost", scale)

    def timed_out(self, attempts: Iterable[AnyAttempt], scale: float | None = 1.0) -> None:
        """A streamed call's first-token deadline ended these attempts (those still waiting were cancelled): how
        long each waited is a lower bound on its replica's TTFT, as for a lost race."""
        self._waited(attempts, "cancelled", scale)

    def _waited(self, attempts: Iterable[AnyAttempt], outcome: AttemptOutcome, scale: float | None) -> None:
        if scale is None:
            return
        for attempt in attempts:
            if attempt.outcome == outcome and attempt.first_token is None and attempt.finish is not None:
                state = self._by_name.get(attempt.replica)
                if state is not None:
                    self.router.outran(state, attempt.finish, (attempt.finish - attempt.start) * scale)

    def stream_finished(
        self, state: ReplicaState, now: float, *, ok: bool | None, tokens: int | None, duration: float | None
    ) -> None:
        """The body of a call won by ``state`` ended (see `Router.stream_finished`); the transport
        calls it once per delivered response, when the caller's stream ends or is closed."""
        self.router.stream_finished(state, now, ok=ok, tokens=tokens, duration=duration)

    def saw_headers(self, state: ReplicaState, now: float, headers: Mapping[str, str]) -> None:
        """A failed attempt's response headers (rate-limit room); wins pass theirs to `succeeded`."""
        self.router.saw_headers(state, now, headers)

    def failed(
        self, state: ReplicaState, now: float, threshold: int, cooldown: float, *, injected: bool = False
    ) -> bool:
        """Count a failure (connect error, 5xx, 408, reset); True when it opened the circuit. The first opening of an
        episode is logged (a probe that fails again reopens it silently; the probe that succeeds says so).
        ``injected``: the failure was a `Chaos` fault, so a circuit it opens stays in this process (see `_sharing`)."""
        state.consecutive_failures += 1
        self.router.failed(state, now)
        if (state.tripped or state.consecutive_failures >= threshold) and not state.open(now):
            if not state.tripped:
                logger.warning(
                    "llmguard: replica %s failed %d calls in a row; its circuit is open: no new calls for %gs, "
                    "then a probe (until one succeeds)",
                    state.name,
                    state.consecutive_failures,
                    cooldown,
                )
            state.open_until, state.set_at = now + cooldown, now
            state.consecutive_failures = 0
            state.tripped = True
            state.local_open = injected
            shared = self._sharing(injected)
            if shared is not None:
                shared.opened(state, cooldown)
            return True
        return False

    def _sharing(self, local: bool) -> SharedState | None:
        """Where a change is told (None: nowhere): the fleet, unless the change is ``local``, as what an injected
        fault (`Chaos`) taught is (a cool-down, a circuit, and their end): a fault test in one process must not hold
        back the calls of the others, which the replica never refused."""
        return None if local else self.shared

    def transports(self) -> list[httpx.AsyncBaseTransport]:
        """Each replica's current transport."""
        return [state.transport for state in self.states]

    def renew_transports(self) -> list[httpx.AsyncBaseTransport]:
        """Give each replica a new transport from the factory (for another event loop); returns the old ones."""
        old = self.transports()
        for state in self.states:
            state.transport = self._transport_factory(state.replica)
        self.renewals += 1
        return old

    async def aclose(self) -> None:
        for state in self.states:
            await state.transport.aclose()


def rebase(url: httpx.URL, base: httpx.URL, known: tuple[httpx.URL, ...]) -> httpx.URL:
    """``url`` moved onto ``base``: if it starts with a known replica base, that prefix is swapped for
    ``base``'s; if it is on a known replica's origin but under none of their bases (an Azure client's
    ``/openai/files`` beside a replica ``/openai/deployments/dep1``), its path is kept as the client built it
    (`llmguard_client._routing.reach` sends it only to that origin's replicas); otherwise (a virtual base URL)
    its path goes under ``base``'s, the segments they share written once (`joined`). The prefix swapped is the
    `deepest` base the request is under (``/v1/x`` rather than ``/v1``). Paths as sent, their
    percent-escapes kept (`sent_path`), a base matched however spelled (`deepest`) and written as ``base``
    spells it; a request already under ``base`` is kept as it is, byte for byte (a signed URL stays signed);
    query kept."""
    path = sent_path(url)
    under = deepest(url, path, known)
    if under is not None:
        index, rest = under
        if same_base(base, known[index]):
            return with_sent_path(base, path, url.query)
        return with_sent_path(base, sent_path(base).rstrip("/") + rest, url.query)
    if any(same_origin(url, candidate) for candidate in known):
        return with_sent_path(base, path, url.query)
    return with_sent_path(base, joined(sent_path(base), path), url.query)


def joined(base_path: str, path: str) -> str:
    """``path`` (a request's whole path) under ``base_path`` (a replica's), with the longest end of the base
    that begins the path written once: both are OpenAI-style base URLs more often than not, so a base
    ``/tenant/v1`` and a request for ``/v1/chat/completions`` (sent to a virtual ``http://llm.internal/v1``)
    give ``/tenant/v1/chat/completions``, not ``/tenant/v1/v1/chat/completions``."""
    segments = base_path.rstrip("/").split("/")  # "/tenant/v1" -> ["", "tenant", "v1"]
    for start in range(1, len(segments)):
        rest = path_under(path, "/" + "/".join(segments[start:]))
        if rest is not None:
            return "/".join(segments) + rest
    return "/".join(segments) + path
