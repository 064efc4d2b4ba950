"""One replica's gate: the attempts it lets in flight (its learned limit) and a bounded line of the others,
served earliest deadline first (an interactive call before a batch one).

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

from llmguard_client._admission.controller import LimitController
from llmguard_client._admission.signal import LoadSignal

__all__ = ["ReplicaGate", "Slot", "Waiter"]

_RATE_WINDOW_S = 2.0
"""Slots freed over the last this many seconds make the rate."""
MARGIN = 2.0
"""A predicted wait is this many times the slots needed over the rate: the rate is measured over the last
seconds and falls when the replica slows down, and a call told to wait that then is refused learns it late."""


class Slot:
    """One attempt's place in flight on a replica; `release` gives it back (later calls do nothing)."""

    __slots__ = ("_gate",)

    def __init__(self, gate: ReplicaGate) -> None:
        self._gate: ReplicaGate | None = gate

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.give_back()


class Waiter:
    """A call in line for a slot; ``slot`` is set when one is handed to it."""

    __slots__ = ("deadline", "event", "gone", "slot", "until")

    def __init__(self, deadline: float, until: float) -> None:
        self.deadline = deadline
        self.until = until
        """The latest instant its slot may come (a slot later leaves no time for its first token)."""
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
        self.waiting = 0
        self.refused = 0
        self._line: list[tuple[float, int, Waiter]] = []
        self._order = itertools.count()
        self._freed: deque[float] = deque()

    # -- slots ---------------------------------------------------------------------------------

    def try_take(self) -> Slot | None:
        """A slot at once, if one is free and nobody is in line for it."""
        if self.waiting == 0 and self.in_flight < self.controller.allowed:
            self.in_flight += 1
            return Slot(self)
        return None

    def give_back(self) -> None:
        """A slot came back (the one caller: `Slot.release`)."""
        self.in_flight -= 1
        freed, now = self._freed, self.clock()
        freed.append(now)
        while freed and freed[0] < now - _RATE_WINDOW_S:
            freed.popleft()
        self.hand_out()

    def hand_out(self) -> None:
        """Free slots to the waiting calls, earliest deadline first (also after the limit grew)."""
        line = self._line
        while line and self.in_flight < self.controller.allowed:
            _, _, waiter = heapq.heappop(line)
            if waiter.gone:
                continue
            self.in_flight += 1
            self.waiting -= 1
            waiter.gone = True
            waiter.slot = Slot(self)
            waiter.event.set()
        if line:
            self.rejudge()

    def rejudge(self) -> None:
        """Refuse now, earliest deadline first, each waiting call whose slot can no longer come by its ``until``
        at the rate slots free up (the calls kept ahead of it served first); the others keep waiting."""
        rate = self.rate()
        if rate <= 0:
            return
        now, kept = self.clock(), 0
        for _, _, waiter in sorted(self._line):
            if waiter.gone:
                continue
            if now + MARGIN * self.frees_needed(kept) / rate > waiter.until:
                waiter.gone = True
                self.waiting -= 1
                waiter.event.set()  # no slot: the caller is refused
            else:
                kept += 1
        if not self.waiting:
            self._line.clear()

    # -- the line ------------------------------------------------------------------------------

    def join(self, deadline: float, until: float) -> Waiter | None:
        """Get in line, for a slot by ``until`` at the latest (None: the line is full)."""
        if self.waiting >= self.max_waiting:
            return None
        waiter = Waiter(deadline, until)
        heapq.heappush(self._line, (deadline, next(self._order), waiter))
        self.waiting += 1
        return waiter

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

    def ahead_of(self, deadline: float) -> int:
        """Calls in line that would be served before one with ``deadline``."""
        return sum(1 for d, _, w in self._line if not w.gone and d <= deadline)

    # -- rates ---------------------------------------------------------------------------------

    def rate(self) -> float:
        """Slots freed per second recently (0: none measured)."""
        freed = self._freed
        if len(freed) < 2:
            return 0.0
        span = max(self.clock() - freed[0], freed[-1] - freed[0])
        return len(freed) / span if span > 0 else 0.0

    def frees_needed(self, ahead: int) -> int:
        """Slots that must free up before a call with ``ahead`` calls in line before it gets one: those in
        flight over the limit (it was cut) and one per call ahead, then its own (0: a slot is free now)."""
        return max(0, self.in_flight + ahead + 1 - self.controller.allowed)

    def wait_for(self, ahead: int) -> float:
        """Seconds until ``ahead`` calls in line and then this one get a slot (inf: no rate measured yet while
        the line is not empty; 0 if a slot is free)."""
        needed = self.frees_needed(ahead)
        if needed == 0:
            return 0.0
        rate = self.rate()
        return MARGIN * needed / rate if rate > 0 else math.inf
