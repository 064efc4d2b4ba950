"""Which failures to connect are this process's own (`local_fault`), read from the chain of causes httpx raises:
httpx's error from httpcore's, from the socket's (under anyio, from "All connection attempts failed", itself from
the one address's error or a group of every address's); and which failure a call that failed every attempt hands
its caller (`Failed.last`)."""

from __future__ import annotations

import errno
import socket
import sys
from typing import cast

import httpcore
import httpx
import pytest

from llmguard_client._core.outcome import AttemptFailure, Failed, local_fault
from llmguard_client._routing.replicas import ReplicaState
from llmguard_client.telemetry._record_builder import AttemptRecordBuilder

if sys.version_info < (3, 11):
    from exceptiongroup import ExceptionGroup


def raised(cause: BaseException, kind: type[httpx.TransportError] = httpx.ConnectError) -> httpx.TransportError:
    """``kind`` as httpx raises it: from httpcore's error, from anyio's "All connection attempts failed", from
    ``cause``."""
    try:
        try:
            try:
                raise OSError("All connection attempts failed") from cause
            except OSError as exc:
                raise httpcore.ConnectError(str(exc)) from exc
        except httpcore.ConnectError as exc:
            raise kind(str(exc)) from exc
    except kind as error:
        return error


def emfile() -> OSError:
    return OSError(errno.EMFILE, "Too many open files")


def refused() -> OSError:
    return ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed")


@pytest.mark.parametrize(
    "cause",
    [
        emfile(),
        OSError(errno.ENFILE, "Too many open files in system"),
        OSError(errno.ENOBUFS, "No buffer space available"),
        OSError(errno.ENOMEM, "Cannot allocate memory"),
        OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"),
        ExceptionGroup("multiple connection attempts failed", [emfile(), emfile()]),
    ],
    ids=["emfile", "enfile", "enobufs", "enomem", "eaddrnotavail", "every_address_emfile"],
)
def test_a_connection_this_process_could_not_open_is_local(cause: BaseException) -> None:
    assert local_fault(raised(cause))


@pytest.mark.parametrize(
    "cause",
    [
        refused(),
        socket.gaierror(socket.EAI_NONAME, "Name or service not known"),  # NXDOMAIN: a misconfigured name
        socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),  # also one host's broken zone
        ExceptionGroup("multiple connection attempts failed", [emfile(), refused()]),  # one address answered
        OSError("All connection attempts failed"),
    ],
    ids=["refused", "nxdomain", "eai_again", "one_address_refused", "no_errno"],
)
def test_a_connection_the_replica_refused_or_a_name_that_does_not_exist_is_the_replicas(cause: BaseException) -> None:
    assert not local_fault(raised(cause))


def test_only_a_failure_to_connect_is_judged_local() -> None:
    """A write that failed for want of buffers may have reached the server: it is judged as any transport error."""
    assert not local_fault(raised(OSError(errno.ENOBUFS, "No buffer space available"), httpx.WriteError))
    assert not local_fault(emfile())  # not httpx's: the caller's own transport's error, or a bug
    assert not local_fault(None)


def _failure(error: BaseException | None = None, status: int | None = None, *, cut: bool = False) -> AttemptFailure:
    failure = AttemptFailure(cast(AttemptRecordBuilder, None), cast(ReplicaState, object()), error, status)
    failure.cut = cut
    return failure


def test_the_caller_gets_the_last_server_answer_when_only_refused_connections_followed_it() -> None:
    answer, refused = _failure(status=429), _failure(httpx.ConnectError("refused"))
    assert Failed([answer, refused, _failure(httpx.ConnectError("refused"))]).last is answer
    reset = _failure(httpx.ReadError("reset"))
    assert Failed([answer, reset, refused]).last is refused  # a server reached after it, with no answer
    assert Failed([refused, answer]).last is answer
    only_refused = [refused, _failure(httpx.ConnectError("refused"))]
    assert Failed(only_refused).last is only_refused[-1]
    assert Failed([]).last is None


@pytest.mark.parametrize("timeout", [httpx.ConnectTimeout("slow"), httpx.PoolTimeout("no connection free")])
def test_a_timeout_after_a_server_answer_stays_the_callers(timeout: httpx.TimeoutException) -> None:
    timed_out = _failure(timeout)
    assert Failed([_failure(status=500), timed_out]).last is timed_out


def test_an_answer_whose_body_was_cut_is_not_handed_back_over_a_later_failure() -> None:
    refused = _failure(httpx.ConnectError("refused"))
    assert Failed([_failure(status=500, cut=True), refused]).last is refused


def test_a_replica_that_answered_then_refused_is_down_and_its_refusal_stands() -> None:
    """One replica answered 500, then refused (a restart): the caller gets the connection error, as plain."""
    replica = cast(ReplicaState, object())
    answer = AttemptFailure(cast(AttemptRecordBuilder, None), replica, None, 500)
    refused = AttemptFailure(cast(AttemptRecordBuilder, None), replica, httpx.ConnectError("refused"))
    assert Failed([answer, refused]).last is refused
