"""One replica's gate: the attempts it lets in flight (its learned limit) and a bounded line of the others,
served earliest deadline first (an interactive call before a batch one).

Each attempt weighs what its call's size is against the average call's (1.0 for every call when the policy does
not weigh them, `llmguard_client._admission.size`): the limit bounds the weights in flight (``load``), so a
replica holds more small calls than large ones. A replica with nothing in flight takes any call, and one whose
limit is not in use takes a call heavier than the whole limit (else steady light traffic, never leaving the
replica empty, would starve it) if the limit came down with no sign of overload.

A call that the limit keeps out but the controller's ceiling holds (the limit came down, with no sign of
overload) is paced, not refused: it waits as long as its first token can still come in time, and its wait is
predicted from the slots freed and from the limit's own growth, whichever is sooner. It is judged as any other
call once a sign of overload has cut the ceiling below it.

Whoever takes a slot gives it back exactly once (`Slot.release`). A slot freed while calls wait goes to the
waiting call with the earliest deadline at once, without yielding. The gate measures how fast slots free up
(the replica's completion rate for this guard), which turns a line into a wait: the slots that must free up
first (those in flight over the limit, after a cut, and one per call ahead) divided by the rate. Each time a
slot is freed or handed out the line is judged again: a waiting call that can no longer get its slot by the
latest instant it may wait (``until``) is refused then, not when that instant comes.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable

import anyio

from llmguard_client._admission.controller import USED, LimitController
from llmguard_client._admission.signal import LoadSignal

__all__ = ["ReplicaGate", "Slot", "Waiter"]

_RATE_WINDOW_S = 2.0
"""Slots freed over the last this many seconds make the rate."""
MARGIN = 2.0
"""A predicted wait is this many times the slots needed over the rate: the rate is measured over the last
seconds and falls when the replica slows down, and a call told to wait that then is refused learns it late."""


class Slot:
    """One attempt's place in flight on a replica; `release` gives it back (later calls do nothing)."""

    __slots__ = ("_gate", "weight")

    def __init__(self, gate: ReplicaGate, weight: float = 1.0) -> None:
        self._gate: ReplicaGate | None = gate
        self.weight = weight

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.give_back(self.weight)


class Waiter:
    """A call in line for a slot; ``slot`` is set when one is handed to it."""

    __slots__ = ("bound", "deadline", "event", "gone", "paced", "share", "slot", "target", "until", "weight")

    def __init__(
        self,
        deadline: float,
        until: float,
        weight: float = 1.0,
        share: float = 1.0,
        paced: bool = False,
        bound: float | None = None,
        target: float = math.inf,
    ) -> None:
        self.deadline = deadline
        self.target = target
        """Its tier's first-token target (`LimitController.target`), which the limit's growth is measured by."""
        self.until = until
        """The latest instant its slot may come (a slot later leaves no time for its first token)."""
        self.paced = paced
        """Kept out only by a limit that came down with no sign of overload (`ReplicaGate.paced`)."""
        self.bound = until if bound is None else bound
        """Its ``until`` once it is no longer paced (a sign of overload cut the ceiling below it)."""
        self.weight = weight
        self.share = share
        """The share of the limit the call may take (`ReplicaGate.fits`)."""
        self.event = anyio.Event()
        self.slot: Slot | None = None
        self.gone = False


class ReplicaGate:
    """The slots and the line of one replica."""

    def __init__(self, controller: LimitController, signal: LoadSignal, max_waiting: int, clock: Callable[[], float]):
        self.controller = controller
        self.signal = signal
        self.max_waiting = max_waiting
        self.clock = clock
        self.in_flight = 0
        """Attempts in flight."""
        self.load = 0.0
        """Their weights added up."""
        self.waiting = 0
        self.refused = 0
        self._line: list[tuple[float, int, Waiter]] = []
        self._order = itertools.count()
        self._freed: deque[tuple[float, float]] = deque()
        """(when, weight) of the slots freed lately."""

    # -- slots ---------------------------------------------------------------------------------

    def fits(self, weight: float, share: float = 1.0) -> bool:
        """Whether an attempt of ``weight`` fits under ``share`` of the limit now (always, on a replica with none
        in flight; one heavier than all of it, while the limit is not in use and came down with no sign of
        overload)."""
        controller = self.controller
        room = share * controller.allowed
        if self.in_flight == 0 or self.load + weight <= room:
            return True
        return weight > room and self.load < USED * room and controller.allowed < controller.undisproven

    def paced(self, ahead: float, weight: float, share: float = 1.0) -> bool:
        """Whether what is in flight, ``ahead`` in line and a call of ``weight`` fit under ``share`` of the
        ceiling: only a limit that came down with no sign of overload keeps the call out."""
        return self.load + ahead + weight <= share * self.controller.undisproven

    def try_take(self, weight: float = 1.0, share: float = 1.0, deadline: float = math.inf) -> Slot | None:
        """A slot at once, if there is room for ``weight`` under ``share`` of the limit and no call with a deadline
        as early as ``deadline`` is in line (those later in line wait for room this call's share leaves)."""
        if (self.waiting == 0 or self.ahead_of(deadline) == 0) and self.fits(weight, share):
            return self._take(weight, share)
        return None

    def _take(self, weight: float, share: float = 1.0) -> Slot:
        self.in_flight += 1
        self.load += weight
        if self.load > share * self.controller.ceiling:  # a call heavier than the whole limit
            self.controller.admitted(self.load / share)
        return Slot(self, weight)

    def _freed_window(self, now: float) -> deque[tuple[float, float]]:
        """The slots freed in the last `_RATE_WINDOW_S` before ``now``. A clock that went back (a test's frozen clock
        let go, a loop on another time line) moves them back with it: the latest was freed ``now`` at the latest."""
        freed = self._freed
        if freed and freed[-1][0] > now:
            by = now - freed[-1][0]
            self._freed = freed = deque((at + by, weight) for at, weight in freed)
        while freed and freed[0][0] < now - _RATE_WINDOW_S:
            freed.popleft()
        return freed

    def give_back(self, weight: float = 1.0) -> None:
        """A slot came back (the one caller: `Slot.release`)."""
        self.in_flight -= 1
        self.load = self.load - weight if self.in_flight else 0.0  # no rounding left over once empty
        now = self.clock()
        self._freed_window(now).append((now, weight))
        self.hand_out()

    def hand_out(self) -> None:
        """Free slots to the waiting calls, earliest deadline first (also after the limit grew)."""
        line = self._line
        for _, _, waiter in sorted(line) if line else ():
            if waiter.gone or not self.fits(waiter.weight, waiter.share):
                continue  # a call too large for the room left does not hold up a smaller one behind it
            self.waiting -= 1
            waiter.gone = True
            waiter.slot = self._take(waiter.weight, waiter.share)
            waiter.event.set()
        if line:
            line[:] = [entry for entry in line if not entry[2].gone]
            heapq.heapify(line)
            if line:
                self.rejudge()

    def rejudge(self) -> None:
        """Refuse now, earliest deadline first, each waiting call whose slot can no longer come by its ``until``
        at the rate slots free up (the calls kept ahead of it served first), or for a paced call as the limit
        grows if sooner; the others keep waiting. A paced call the ceiling no longer holds (a sign of overload
        cut it) waits no longer than its ``bound``."""
        rate = self.rate()
        now, kept = self.clock(), 0.0
        for _, _, waiter in sorted(self._line):
            if waiter.gone:
                continue
            if waiter.paced and not self.paced(kept, waiter.weight, waiter.share):
                waiter.paced = False
                waiter.until = min(waiter.until, waiter.bound)
            wait = self.wait_for(kept, waiter.weight, waiter.share, waiter.target if waiter.paced else None, rate)
            if now >= waiter.until or (math.isfinite(wait) and now + wait > waiter.until):
                waiter.gone = True
                self.waiting -= 1
                waiter.event.set()  # no slot: the caller is refused
            else:
                kept += waiter.weight
        if not self.waiting:
            self._line.clear()

    # -- the line ------------------------------------------------------------------------------

    def join(self, waiter: Waiter) -> bool:
        """Put ``waiter`` in line, for a slot by its ``until`` at the latest (False: the line is full)."""
        if self.waiting >= self.max_waiting:
            return False
        heapq.heappush(self._line, (waiter.deadline, next(self._order), waiter))
        self.waiting += 1
        return True

    def leave(self, waiter: Waiter) -> None:
        """``waiter`` stops waiting without a slot (its wait ended or was cancelled); a slot handed to it in
        the meantime comes back."""
        if waiter.slot is not None:
            waiter.slot.release()
            return
        if not waiter.gone:
            waiter.gone = True
            self.waiting -= 1
            if not self.waiting:
                self._line.clear()

    def ahead_of(self, deadline: float) -> float:
        """The weight of the calls in line that would be served before one with ``deadline``."""
        return sum(w.weight for d, _, w in self._line if not w.gone and d <= deadline)

    # -- rates ---------------------------------------------------------------------------------

    def rate(self) -> float:
        """Weight freed per second over the last `_RATE_WINDOW_S` (slots, when calls are not weighed; 0: too few
        freed to measure: slots freed before an idle spell measured how much was asked then, not how fast the
        replica frees them now)."""
        now = self.clock()
        freed = self._freed_window(now)
        if len(freed) < 2:
            return 0.0
        span = max(now - freed[0][0], freed[-1][0] - freed[0][0])
        return sum(w for _, w in freed) / span if span > 0 else 0.0

    def frees_needed(self, ahead: float, weight: float = 1.0, share: float = 1.0) -> float:
        """Weight that must free up before a call of ``weight`` with ``ahead`` in line before it gets a slot
        under ``share`` of the limit: what is in flight over it (it was cut), what is ahead, then its own (0:
        there is room now); never more than all of it (a replica with nothing in flight takes any call)."""
        return max(0.0, min(self.load + ahead, self.load + ahead + weight - share * self.controller.allowed))

    def wait_for(
        self,
        ahead: float,
        weight: float = 1.0,
        share: float = 1.0,
        target: float | None = None,
        rate: float | None = None,
    ) -> float:
        """Seconds until what is ``ahead`` in line and then this call get a slot, with the margin (inf: no rate
        measured yet while the line is not empty; 0 if there is room): at the rate slots free up, or (a paced
        call, with its tier's ``target``) as the limit grows, if sooner."""
        needed = self.frees_needed(ahead, weight, share)
        if needed == 0:
            return 0.0
        rate = self.rate() if rate is None else rate
        if rate <= 0:
            return math.inf
        wait = MARGIN * needed / rate
        ttft = self.signal.ttft_recent
        if target is not None and ttft is not None:
            to = (self.load + ahead + weight) / share
            wait = min(wait, MARGIN * self.controller.growth_time(to, ttft, target))
        return wait
