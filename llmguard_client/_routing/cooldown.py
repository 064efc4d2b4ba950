"""The hard cool-down rule: which replicas may take a call's first attempt while some are cooling.

A replica cooling after a Retry-After (or an overload answer) gets no new first attempts while another
replica is ready, except its probes, one at a time, sent by the process that learned the cool-down (one mirrored
from another process is probed by that process, and here only a step after its next probe: `mirror_cool_down`).
The first goes `FIRST_PROBE` seconds into the
cool-down (or once `PROBE_AT` of it has passed, if that is sooner); each probe refused again (another overload
answer, which renews the cool-down) doubles the wait for the next, never beyond `PROBE_AT` of the cool-down as it
stands (`cool`). An outage shorter than the Retry-After is found over within seconds, and a server that means
its Retry-After sees a few probes of it (about log2 of half of it in seconds: 6 for 120 s). A probe that wins
ends the cool-down, and so does one answered with anything but another overload (a 500, a reset: the server no
longer asks for rest, and the circuit judges the rest; `llmguard_client._routing.replicas`); the next cool-down
starts over at `FIRST_PROBE`.

When several candidates are all cooling the rule steps aside and the router chooses among them all by load
and health, as it does without cool-downs: that is overload of every replica, where their Retry-Afters are
computed from their queues, and sending every call to the one that frees first piled the load onto it (the
overload benchmark's goodput fell from 1.03x/0.98x of plain to 0.97x/0.95x).

When a single candidate is left (one replica, as a hosted API) and it is cooling, there is nowhere else to
go: a first attempt waits for its probe (or the end of the cool-down, whichever comes first) if that fits
the call's first-token deadline, and is refused before it is sent otherwise (`first_wait`; the retry layer
decides, `llmguard_client._layers.retry`); a change of the cool-down (its probe served, or refused again)
wakes the waiting calls to decide again. A retry also waits for the first to free, within the call's
first-token deadline; a retry chosen ahead of its time takes the probe only if it is sent as the probe
(`take_probe`): one paced by the server's Retry-After goes after the cool-down, and leaves the probe to the
calls waiting. A probe that nothing answered (its caller gave up, its deadline passed first) is given back when
its call ends (`give_back_probe`): due again, the next call waiting goes as the probe.
"""

from __future__ import annotations

import math
from typing import Protocol, TypeVar

__all__ = [
    "FIRST_PROBE",
    "PROBE_AT",
    "REFUSALS_TO_COOL",
    "Cooling",
    "cool",
    "first_attempt_candidates",
    "first_wait",
    "give_back_probe",
    "mirror_cool_down",
    "probe_pending",
    "take_probe",
]

PROBE_AT = 0.5
"""The share of a cool-down (as it stands) after which its next probe goes at the latest."""

FIRST_PROBE = 1.0
"""Seconds from the start of a cool-down to its first probe (at most `PROBE_AT` of it); each probe refused again
waits twice as long as the last did before the next."""


REFUSALS_TO_COOL = 3
"""Overload answers in a row (none served, nor answered otherwise, between them) at which their replica cools: an
engine whose queue is full, or a rate limit, refuses every call until it frees, where a replica refusing some calls
at random serves the others between (a 503 or a 529 to half the calls: two in a row every fourth answer, three every
eighth). Before it, a Retry-After paces the refused call's own retry only. At once: a 429 without a Retry-After or
reporting a limit spent, an overload error inside a 200 stream, a Retry-After longer than the guard waits."""


class Cooling(Protocol):
    """What the rule reads and writes of a replica (`llmguard_client._routing.replicas.ReplicaState`)."""

    cooling_until: float
    probe_at: float
    set_at: float
    probing: bool
    probes: int
    probes_refused: int

    def cooling(self, now: float) -> bool: ...

    def cooling_end(self) -> float: ...


C = TypeVar("C", bound=Cooling)


def cool(s: Cooling, now: float, seconds: float) -> bool:
    """An overload answer from ``s`` at ``now`` asked for ``seconds`` of rest: a cool-down starts, or is renewed when
    it ends later than the one in force, its next probe due in `FIRST_PROBE` s doubled for each probe of this
    cool-down refused so far (at most `PROBE_AT` of what is left of it). If this was the answer of the probe in
    flight, that probe was refused: it counts, and the next one is due even when the cool-down is not renewed (a
    shorter Retry-After than is left). Returns whether the cool-down changed."""
    refused = s.probing
    if now + seconds <= s.cooling_until and not refused:
        return False
    if not (s.cooling(now) and (refused or s.probe_at < math.inf)):
        s.probes_refused = 0  # a new cool-down here (none in force, or one mirrored, probed elsewhere): start over
    elif refused:
        s.probes_refused += 1
    s.cooling_until, s.set_at = max(s.cooling_until, now + seconds), now
    s.probe_at = now + min(PROBE_AT * (s.cooling_until - now), FIRST_PROBE * 2.0**s.probes_refused)
    s.probing = False
    return True


def mirror_cool_down(s: Cooling, now: float, until: float) -> None:
    """A cool-down another process of the fleet learned (or renewed, its probe refused), until ``until``, mirrored
    here at ``now``. Its probes are that process's, and their outcome reaches this one (a renewal, or the end of
    the cool-down when one is served); this one's probe is due a step later than that process's next (2 s after
    a new cool-down, doubling with each renewal, at most `PROBE_AT` of it), so it goes only when that process sent
    none (idle, scaled down, gone): a recovered server is not left unasked for the whole cool-down, and while
    that process probes, the server sees its probes alone."""
    s.probes_refused = s.probes_refused + 1 if s.cooling(now) else 0
    s.cooling_until, s.set_at = until, now
    s.probe_at = now + min(PROBE_AT * (until - now), FIRST_PROBE * 2.0 ** (s.probes_refused + 1))
    s.probing = False


def take_probe(s: Cooling, now: float) -> int | None:
    """Make the attempt sent to ``s`` at ``now`` its cool-down's probe, if one is due then: its answer ends the
    cool-down or renews it (`cool`). Returns the probe's number (for `give_back_probe`), or None."""
    if not (s.cooling(now) and s.probe_at <= now):
        return None
    s.probe_at, s.probing = math.inf, True
    s.probes += 1
    return s.probes


def give_back_probe(s: Cooling, probe: int) -> bool:
    """The call that sent probe number ``probe`` ended: if nothing answered that probe (it is still the one in
    flight), it is due again at once. Returns whether it was given back."""
    if not (s.probing and s.probes == probe):
        return False
    s.probe_at, s.probing = -math.inf, False
    return True


def first_attempt_candidates(candidates: list[C], now: float) -> list[C]:
    """The replicas among ``candidates`` that may take a first attempt at ``now`` (see the module docstring):
    all of them while none is cooling; else a due probe alone, or the ready ones; when several are all
    cooling, all of them again (the router spreads them by load); a single cooling one only as its probe
    (else none: `first_wait` says for how long). A due probe is offered, not taken: `take_probe` takes it
    when the attempt is sent as the probe."""
    if not any(s.cooling(now) for s in candidates):
        return candidates
    ready = [s for s in candidates if not s.cooling(now)]
    if ready or len(candidates) == 1:
        for s in candidates:
            if s.probe_at <= now and s.cooling(now):
                return [s]
        return ready
    return candidates


def first_wait(candidates: list[C], now: float) -> float:
    """Seconds before `first_attempt_candidates` offers one of ``candidates``: 0, unless a single one is left
    and it is cooling with no probe due: then until its probe or the end of its cool-down."""
    if len(candidates) != 1:
        return 0.0
    s = candidates[0]
    if not s.cooling(now) or s.probe_at <= now:
        return 0.0
    return min(s.probe_at, s.cooling_end()) - now


def probe_pending(candidates: list[C], now: float) -> bool:
    """Whether the single one of ``candidates`` is cooling with its probe in flight: its answer, not the end of the
    cool-down, is the next chance of the calls waiting (served, they go; refused, its next probe is due)."""
    return len(candidates) == 1 and candidates[0].cooling(now) and candidates[0].probing
