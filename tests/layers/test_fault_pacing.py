"""A call's failures at its replicas (`FaultPacing`): when its retries go as the plain SDK's, and the backoffs its
failovers at once left owed. The waits themselves, through a Guard in virtual time, are in test_retry.py."""

from __future__ import annotations

import errno
from typing import cast

import httpx

from llmguard_client._core.outcome import AttemptFailure
from llmguard_client._layers.fault_pacing import FaultPacing
from llmguard_client._routing.replicas import ReplicaState
from llmguard_client.telemetry._record_builder import AttemptRecordBuilder

A, B, C = (cast(ReplicaState, object()) for _ in range(3))


def failure(state: ReplicaState, cause: OSError | None = None, status: int | None = None) -> AttemptFailure:
    """A failure to connect to ``state`` raised from ``cause`` (as httpx raises it), or an answer ``status``."""
    error = None
    if cause is not None:
        error = httpx.ConnectError(str(cause))
        error.__cause__ = cause
    return AttemptFailure(cast(AttemptRecordBuilder, None), state, error, status)


def refused() -> OSError:
    return ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")


def returning(n: int) -> float:
    """A same-replica backoff whose rounds can be told apart in a sum."""
    return 10.0**n


def test_a_failover_at_once_is_owed_and_waited_for_once_going_back_after_two_refused() -> None:
    faults = FaultPacing()
    first = failure(A, refused())
    faults.saw([first])
    assert not faults.paces(first, going_back=False)  # one replica down: the retry goes at once to another
    faults.retried(first, B, [A], skipped=returning(1))
    second = failure(B, refused())
    faults.saw([second])
    assert not faults.paces(second, going_back=False)  # two down, a third ready: at once to it
    assert faults.paces(second, going_back=True)  # none left untried: back as the plain SDK's retry
    assert faults.wait(returning, 2) == 10.0 + 100.0  # its own round's backoff, and the one the failover skipped
    faults.retried(second, A, [A, B], skipped=returning(2))
    third = failure(A, refused())
    faults.saw([third])
    assert faults.wait(returning, 3) == 1000.0  # owed once only


def test_a_connection_that_failed_here_paces_the_retry_at_once() -> None:
    faults = FaultPacing()
    first = failure(A, OSError(errno.EMFILE, "Too many open files"))
    faults.saw([first])
    assert faults.paces(first, going_back=False)  # another replica would fail alike
    assert faults.wait(returning, 1) == 10.0


def test_a_retry_back_to_the_replica_owes_nothing() -> None:
    faults = FaultPacing()
    first = failure(A, refused())
    faults.saw([first])
    faults.retried(first, A, [A], skipped=0.0)  # back to the only replica: it waited its same-replica backoff
    again = failure(A, status=500)
    faults.saw([again])
    assert not faults.paces(again, going_back=True)  # one replica failed the call: its own backoff (`times`)
    faults.retried(again, A, [A, A], skipped=0.0)
    assert faults.wait(returning, 3) == 1000.0


def test_two_replicas_answering_5xx_pace_the_retry_back_as_two_refusing_do() -> None:
    """One backend restarting behind two gateways: each answers 502. The failover at once is owed, and the retry back
    to the first waits as the plain SDK's retries would have, with a refusal or a dropped connection among them."""
    faults = FaultPacing()
    first = failure(A, status=502)
    faults.saw([first])
    assert not faults.paces(first, going_back=False)
    faults.retried(first, B, [A], skipped=returning(1))
    dropped = AttemptFailure(cast(AttemptRecordBuilder, None), B, httpx.RemoteProtocolError("peer closed"))
    faults.saw([dropped])
    assert faults.paces(dropped, going_back=True)
    assert faults.wait(returning, 2) == 10.0 + 100.0
    faults.retried(dropped, A, [A, B], skipped=returning(2))
    third = failure(A, refused())
    faults.saw([third])
    assert faults.wait(returning, 3) == 1000.0  # owed once only


def test_overload_answers_are_paced_by_their_servers_not_as_a_replica_down() -> None:
    """A 429, 503 or 529 has its server's pace (its Retry-After, the replica's cool-down): it neither owes its
    failover nor paces the retry back."""
    faults = FaultPacing()
    for state, status in ((A, 503), (B, 529)):
        busy = failure(state, status=status)
        faults.saw([busy])
        assert not faults.paces(busy, going_back=True)
        faults.retried(busy, B, [A], skipped=returning(1))
    broken = failure(A, status=500)
    faults.saw([broken])
    assert not faults.paces(broken, going_back=True)  # one replica down among them: its own backoff


def test_a_failover_that_waited_the_backoff_owes_nothing() -> None:
    """An empty budget sends the retry to the other replica paced, after the same-replica backoff: the retry back
    after both failed waits its own round's backoff only."""
    faults = FaultPacing()
    first = failure(A, status=502)
    faults.saw([first])
    faults.retried(first, B, [A], skipped=0.0)
    second = failure(B, status=502)
    faults.saw([second])
    assert faults.paces(second, going_back=True)
    assert faults.wait(returning, 2) == 100.0
