"""A call's failures to connect (`ConnectFaults`): when its retries go as the plain SDK's, and the backoffs its
failovers at once left owed. The waits themselves, through a Guard in virtual time, are in test_retry.py."""

from __future__ import annotations

import errno
from typing import cast

import httpx

from llmguard_client._core.outcome import AttemptFailure
from llmguard_client._layers.connect_faults import ConnectFaults
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
    faults = ConnectFaults()
    first = failure(A, refused())
    faults.saw([first])
    assert not faults.paces(first, going_back=False)  # one replica down: the retry goes at once to another
    faults.retried(first, 1, B, [A])
    second = failure(B, refused())
    faults.saw([second])
    assert not faults.paces(second, going_back=False)  # two down, a third ready: at once to it
    assert faults.paces(second, going_back=True)  # none left untried: back as the plain SDK's retry
    assert faults.wait(returning, 2) == 10.0 + 100.0  # its own round's backoff, and the one the failover skipped
    faults.retried(second, 2, A, [A, B])
    third = failure(A, refused())
    faults.saw([third])
    assert faults.wait(returning, 3) == 1000.0  # owed once only


def test_a_connection_that_failed_here_paces_the_retry_at_once() -> None:
    faults = ConnectFaults()
    first = failure(A, OSError(errno.EMFILE, "Too many open files"))
    faults.saw([first])
    assert faults.paces(first, going_back=False)  # another replica would fail alike
    assert faults.wait(returning, 1) == 10.0


def test_a_retry_back_to_the_replica_or_after_an_answer_owes_nothing() -> None:
    faults = ConnectFaults()
    first = failure(A, refused())
    faults.saw([first])
    faults.retried(first, 1, A, [A])  # back to the only replica: it waited its same-replica backoff
    answered = failure(A, status=500)
    faults.saw([answered])
    faults.retried(answered, 2, B, [A, A])  # after an answer: the replica was reached
    refused_too = failure(B, refused())
    faults.saw([refused_too])
    assert not faults.paces(answered, going_back=True)  # an answer is planned as any, whatever refused before
    assert faults.paces(refused_too, going_back=True)
    assert faults.wait(returning, 3) == 1000.0
