"""A call's failures to connect, and when they are evidently not one replica's.

After a failure to connect, a call's retry goes at once to a replica it has not tried: one replica down costs the call
nothing. But a fault that is not one replica's (every replica restarting, this process out of file descriptors, its
resolver restarting) would spend the call's attempts that way in a moment, where the plain SDK's retries, spread over
a second or more, ride it out. So once the call has failed to connect to two replicas, or when the connection failed
here (`AttemptFailure.local`), its retry after a failure to connect goes no sooner than the plain SDK's would: it
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
    (`retried`), which a retry paced as the plain SDK's waits for too (`wait`)."""

    __slots__ = ("_owed", "_refused")

    def __init__(self) -> None:
        self._refused: set[int] = set()
        """The replicas (ids) the call failed to connect to."""
        self._owed: list[int] = []
        """The rounds whose retries went at once to another replica after a failure to connect."""

    def saw(self, failures: Iterable[AttemptFailure]) -> None:
        """A round's failures: note the replicas the call failed to connect to."""
        self._refused.update(id(f.state) for f in failures if isinstance(f.error, httpx.ConnectError))

    def widespread(self, last: AttemptFailure) -> bool:
        """Whether the call's retry after ``last``, a failure to connect, goes as the plain SDK's would: the call
        failed to connect to two replicas, or ``last``'s connection failed here (`AttemptFailure.local`)."""
        return isinstance(last.error, httpx.ConnectError) and (last.local or len(self._refused) >= 2)

    def wait(self, returning: Callable[[int], float], rounds: int) -> float:
        """The least wait before the retry after round ``rounds`` when `widespread`: the same-replica backoff
        (``returning``: `Backoff.returning`) of that round, and of each round owed (`retried`)."""
        return sum(returning(n) for n in (*self._owed, rounds))

    def retried(self, last: AttemptFailure, rounds: int, state: ReplicaState, failed: Iterable[ReplicaState]) -> None:
        """The retry after round ``rounds`` goes to ``state``: one paced as the plain SDK's (`widespread`) paid what
        was owed; one sent to a replica not among ``failed`` after ``last`` failed to connect is owed its round."""
        if self.widespread(last):
            self._owed.clear()
        elif isinstance(last.error, httpx.ConnectError) and not any(f is state for f in failed):
            self._owed.append(rounds)
