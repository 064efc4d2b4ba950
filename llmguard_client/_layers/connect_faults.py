"""A call's failures to connect, and when its retry after one goes as the plain SDK's would.

After a failure to connect, a call's retry goes at once to a replica it has not tried: one replica down, or two,
costs the call no wait while another is ready. But when no replica is left untried (every replica restarting) and
the call goes back to one that refused it, or when the connection failed here (`AttemptFailure.local`: this process
out of file descriptors, which another replica does not cure), a retry at the ordinary backoff would spend the
call's attempts in a moment, where the plain SDK's retries, spread over a second or more, ride the fault out. Such a
retry, once the call has failed to connect to two replicas or here, goes no sooner than the plain SDK's would: it
waits the same-replica backoff of its round (`Backoff.returning`), plus that of each earlier retry that went at once
to another replica after a failure to connect (the backoff the plain SDK would have waited there). A server's answer
in between (a 5xx) is planned as any: that replica was reached.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import httpx

from llmguard_client._core.outcome import AttemptFailure
from llmguard_client._routing.replicas import ReplicaState


class ConnectFaults:
    """One call's failures to connect (`saw`), and the rounds whose retries went at once to another replica after one
    (`retried`), which a retry paced as the plain SDK's (`paces`) waits for too (`wait`)."""

    __slots__ = ("_other", "_owed", "_refused")

    def __init__(self) -> None:
        self._refused: set[int] = set()
        """The replicas (ids) the call failed to connect to."""
        self._other: set[int] = set()
        """The replicas (ids) that failed the call otherwise (an answer, a reset, a timeout)."""
        self._owed: list[int] = []
        """The rounds whose retries went at once to another replica after a failure to connect."""

    def saw(self, failures: Iterable[AttemptFailure]) -> None:
        """A round's failures: note the replicas the call failed to connect to, and those it failed at otherwise."""
        self._refused.update(id(f.state) for f in failures if isinstance(f.error, httpx.ConnectError))
        self._other.update(id(f.state) for f in failures if not isinstance(f.error, httpx.ConnectError))

    def only_refused(self, state: ReplicaState) -> bool:
        """Whether every failure of the call at ``state`` was a failure to connect (no server there reached)."""
        return id(state) in self._refused and id(state) not in self._other

    def paces(self, last: AttemptFailure, going_back: bool) -> bool:
        """Whether the call's retry after ``last``, a failure to connect, goes as the plain SDK's would: ``last``'s
        connection failed here (`AttemptFailure.local`), or the retry goes back to a replica that failed the call
        (``going_back``: none untried is ready) after it failed to connect to two."""
        if not isinstance(last.error, httpx.ConnectError):
            return False
        return last.local or (going_back and len(self._refused) >= 2)

    def wait(self, returning: Callable[[int], float], rounds: int) -> float:
        """The least wait before the retry after round ``rounds`` when it `paces`: the same-replica backoff
        (``returning``: `Backoff.returning`) of that round, and of each round owed (`retried`)."""
        return sum(returning(n) for n in (*self._owed, rounds))

    def retried(self, last: AttemptFailure, rounds: int, state: ReplicaState, failed: Iterable[ReplicaState]) -> None:
        """The retry after round ``rounds`` goes to ``state``: one paced as the plain SDK's (`paces`) paid what was
        owed; one sent to a replica not among ``failed`` after ``last`` failed to connect is owed its round."""
        going_back = any(f is state for f in failed)
        if self.paces(last, going_back):
            self._owed.clear()
        elif isinstance(last.error, httpx.ConnectError) and not going_back:
            self._owed.append(rounds)
