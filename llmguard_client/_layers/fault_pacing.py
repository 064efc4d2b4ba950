"""When a call's retry, after its replicas failed it, goes as the plain SDK's would.

After a replica fails a call (a refused connection, a 5xx or 408, a dropped connection), the call's retry goes at
once to a replica it has not tried: one replica down, or two, costs the call no wait while another is ready. But
when no replica is left untried (one backend restarting behind every replica, every replica restarting) and the
call goes back to one that failed it, or when the connection failed here (`AttemptFailure.local`: this process out
of file descriptors, which another replica does not cure), a retry at the ordinary backoff would spend the call's
attempts in a moment, where the plain SDK's retries, spread over a second or more, ride the fault out. Such a retry,
once two replicas failed the call (or the connection failed here), goes no sooner than the plain SDK's would: it
waits the same-replica backoff of its round (`Backoff.returning`), plus that of each earlier retry that went at once
to another replica after such a failure (the backoff the plain SDK would have waited there). An overload answer
(429, 503, 529) is paced by its server instead (its Retry-After, the replica's cool-down), and a failure inside a
2xx answer is none the plain SDK retries: those are planned as any.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import httpx

from llmguard_client._core.outcome import AttemptFailure
from llmguard_client._routing.replicas import ReplicaState


class FaultPacing:
    """One call's failures at its replicas (`saw`), and the backoff its retries at once to another replica after one
    did not wait (`retried`), which a retry paced as the plain SDK's (`paces`) waits for too (`wait`)."""

    __slots__ = ("_down", "_other", "_owed", "_refused")

    def __init__(self) -> None:
        self._refused: set[int] = set()
        """The replicas (ids) the call failed to connect to."""
        self._other: set[int] = set()
        """The replicas (ids) that failed the call otherwise (an answer, a reset, a timeout)."""
        self._down: set[int] = set()
        """The replicas (ids) that failed the call as a replica that is down does (`_failed_down`)."""
        self._owed = 0.0
        """Seconds of the plain SDK's backoff that the call's retries at once to another replica, after such a
        failure, did not wait (`retried`)."""

    def saw(self, failures: Iterable[AttemptFailure]) -> None:
        """A round's failures: note the replicas the call failed to connect to, those it failed at otherwise, and
        those that failed it as a replica that is down does."""
        for failure in failures:
            connect = isinstance(failure.error, httpx.ConnectError)
            (self._refused if connect else self._other).add(id(failure.state))
            if _failed_down(failure):
                self._down.add(id(failure.state))

    def only_refused(self, state: ReplicaState) -> bool:
        """Whether every failure of the call at ``state`` was a failure to connect (no server there reached)."""
        return id(state) in self._refused and id(state) not in self._other

    def paces(self, last: AttemptFailure, going_back: bool) -> bool:
        """Whether the call's retry after ``last`` goes as the plain SDK's would: ``last``'s connection failed here
        (`AttemptFailure.local`), or ``last`` failed as a replica that is down does and the retry goes back to a
        replica that failed the call (``going_back``: none untried is ready) after two failed it so."""
        if isinstance(last.error, httpx.ConnectError) and last.local:
            return True
        return _failed_down(last) and going_back and len(self._down) >= 2

    def wait(self, returning: Callable[[int], float], rounds: int) -> float:
        """The least wait before the retry after round ``rounds`` when it `paces`: the same-replica backoff
        (``returning``: `Backoff.returning`) of that round, and what is owed (`retried`)."""
        return self._owed + returning(rounds)

    def retried(
        self, last: AttemptFailure, state: ReplicaState, failed: Iterable[ReplicaState], skipped: float
    ) -> None:
        """The retry after ``last`` goes to ``state``, ``skipped`` seconds sooner than the plain SDK's retry would
        have at the least: one paced as the plain SDK's (`paces`) paid what was owed; one sent to a replica not among
        ``failed`` after ``last`` failed as a replica that is down does owes those seconds (none when it went paced
        after the same-replica backoff: an empty budget's)."""
        going_back = any(f is state for f in failed)
        if self.paces(last, going_back):
            self._owed = 0.0
        elif _failed_down(last) and not going_back:
            self._owed += skipped


def _failed_down(failure: AttemptFailure) -> bool:
    """The replica failed the request as one that is down or restarting does: a refused connection, a 5xx or 408,
    a dropped connection (`AttemptFailure.replica_failed`), not an overload answer its server paces, nor a failure
    inside a 2xx answer, which the plain SDK does not retry."""
    return failure.replica_failed and not failure.overload and not failure.in_ok_answer
