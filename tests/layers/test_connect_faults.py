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


def test_a_failover_at_once_is_owed_and_waited_for_once_two_replicas_refused() -> None:
    faults = ConnectFaults()
    first = failure(A, refused())
    faults.saw([first])
    assert not faults.widespread(first)  # one replica down: the retry goes at once to another
    faults.retried(first, 1, B, [A])
    second = failure(B, refused())
    faults.saw([second])
    assert faults.widespread(second)
    assert faults.wait(returning, 2) == 10.0 + 100.0  # its own round's backoff, and the one the failover skipped
    faults.retried(second, 2, C, [A, B])
    third = failure(C, refused())
    faults.saw([third])
    assert faults.wait(returning, 3) == 1000.0  # owed once only


def test_a_connection_that_failed_here_is_widespread_at_once() -> None:
    faults = ConnectFaults()
    first = failure(A, OSError(errno.EMFILE, "Too many open files"))
    faults.saw([first])
    assert faults.widespread(first)
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
    assert not faults.widespread(answered)  # an answer is planned as any, whatever refused before
    assert faults.widespread(refused_too)
    assert faults.wait(returning, 3) == 1000.0
