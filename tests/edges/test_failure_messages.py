"""A failure without an answer reaches the caller as the plain client's error would: its class, its text.

Against a real loopback server that reads each request and hangs up without answering (what a crashed or
restarted server does): a plain httpx caller catches ``httpx.RemoteProtocolError`` as without the guard, an
httpx2 caller finds the server's own reason in the chain, and an SDK that writes the reason into its message
(anthropic >= 2.17: "Connection to host:port failed: Server disconnected without sending a response.") writes
the same one plain and guarded. A request body that cannot be read is the caller's own error: it is raised as
it was, never turned into the guard's.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import Any

import httpx
import pytest

from llmguard_client import AllAttemptsFailed, AllAttemptsTimedOut, Guard, GuardFailure, RetryPolicy, guard_failure
from llmguard_client.errors import like_last_error
from tests.loopback import raw_server

HUNG_UP = "Server disconnected without sending a response."
RETRY = RetryPolicy(backoff_initial=0.01, backoff_max=0.02)


async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read the request's head, then close the connection without a word."""
    with suppress(asyncio.IncompleteReadError, ConnectionError):
        await reader.readuntil(b"\r\n\r\n")
    writer.close()


def hanging_up() -> AbstractAsyncContextManager[str]:
    """A server that reads each request's head, then closes the connection without a word; its base URL."""
    return raw_server(hang_up)


async def test_a_plain_httpx_caller_catches_the_error_its_client_would_raise() -> None:
    async with hanging_up() as url, Guard([url], retry=RETRY, instrumentation=None) as guard:
        async with httpx.AsyncClient() as plain:
            with pytest.raises(httpx.RemoteProtocolError) as unguarded:
                await plain.post(url + "/v1/chat/completions", json={"model": "m", "messages": []})
        client = guard.http_client()
        with pytest.raises(httpx.RemoteProtocolError) as guarded:
            await client.post(url + "/v1/chat/completions", json={"model": "m", "messages": []})
        await client.aclose()
    assert str(unguarded.value) == HUNG_UP
    error = guarded.value
    assert isinstance(error, AllAttemptsFailed) and guard_failure(error) == "all_attempts_failed"
    assert error.record is not None and len(error.record.attempts) == 3
    assert type(error.__cause__) is httpx.RemoteProtocolError and str(error.__cause__) == HUNG_UP


async def test_an_httpx2_caller_finds_the_servers_reason_in_the_chain() -> None:
    httpx2 = pytest.importorskip("httpx2")
    async with hanging_up() as url, Guard([url], retry=RETRY, instrumentation=None) as guard:
        client = guard.httpx2_client()
        with pytest.raises(httpx2.RemoteProtocolError) as guarded:
            await client.post(url + "/v1/chat/completions", json={"model": "m", "messages": []})
        await client.aclose()
    error = guarded.value
    assert isinstance(error, AllAttemptsFailed)
    cause = error.__cause__
    assert type(cause) is httpx2.RemoteProtocolError and str(cause) == HUNG_UP
    assert cause is not None and isinstance(
        cause.__cause__, httpx.RemoteProtocolError
    )  # the attempt's own error, as it was raised


@asynccontextmanager
async def refusing() -> AsyncIterator[str]:
    """A port bound but not listening: every connection is refused (``[Errno 111] Connect call failed``)."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{bound.getsockname()[1]}"


@pytest.mark.parametrize("max_retries", [0, 2])
@pytest.mark.parametrize("server", [hanging_up, refusing])
async def test_an_sdk_writes_the_same_connection_error_plain_and_guarded(
    server: Callable[[], AbstractAsyncContextManager[str]], max_retries: int
) -> None:
    """The same reason plain and guarded, also when the SDK's own retries meet the call the guard gave up on (its
    remembered error keeps the chain of causes the SDK reads the reason from)."""
    anthropic = pytest.importorskip("anthropic")
    messages: Any = [{"role": "user", "content": "hi"}]
    async with server() as url, Guard([url], retry=RETRY, instrumentation=None) as guard:
        errors = []
        for http_client in (None, guard.http_client_for(anthropic.AsyncAnthropic)):
            kwargs: dict[str, Any] = {} if http_client is None else {"http_client": http_client}
            client = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=max_retries, **kwargs)
            with pytest.raises(anthropic.APIConnectionError) as caught:
                await client.messages.create(model="m", max_tokens=5, messages=messages)
            await client.close()
            errors.append(caught.value)
    plain, guarded = errors
    assert str(guarded) == str(plain)
    assert guard_failure(plain) is None and guard_failure(guarded) == "all_attempts_failed"


async def unreadable(error: OSError) -> AsyncIterator[bytes]:
    yield b'{"model": "m", '
    raise error


async def test_a_request_body_that_cannot_be_read_is_raised_as_the_callers_own_error() -> None:
    async with hanging_up() as url, Guard([url], retry=RETRY, instrumentation=None) as guard:
        client = guard.http_client()
        error = OSError("the upload's file went away")
        with pytest.raises(OSError) as caught:
            await client.post(url + "/v1/chat/completions", content=unreadable(error))
        await client.aclose()
    assert caught.value is error
    assert guard_failure(caught.value) is None


async def test_a_request_the_client_cannot_send_is_its_own_fault_not_the_replicas() -> None:
    """A header value with a newline is refused by the client's HTTP library before anything is sent: the guard
    neither retries it (the SDK's own retries decide, as without a guard) nor counts it against the replica."""
    async with hanging_up() as url, Guard([url], retry=RETRY, instrumentation=None) as guard:
        client = guard.http_client()
        for _ in range(6):  # more than the circuit's failures
            with pytest.raises(httpx.LocalProtocolError) as caught:
                await client.post(url + "/v1/chat/completions", json={}, headers={"x-note": "two\nlines"})
            assert caught.value.record is not None and len(caught.value.record.attempts) == 1  # type: ignore[attr-defined]
        snapshot = guard.snapshot()
        await client.aclose()
    assert snapshot.budget is not None and snapshot.budget.spent == 0
    assert snapshot.replicas[0].healthy and snapshot.replicas[0].circuit_open_for == 0


def hang_up_then_go_silent() -> AbstractAsyncContextManager[str]:
    """A server that hangs up on its first request and never answers the later ones (it reads on until the client
    closes the connection); its base URL."""
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        if connections == 1:
            await hang_up(reader, writer)
            return
        with suppress(ConnectionError):
            await reader.read()  # until the client gives up and closes
        writer.close()

    return raw_server(handle)


async def test_a_last_attempt_that_timed_out_is_raised_as_a_timeout_after_an_earlier_failure() -> None:
    """The guard retried a hang-up, and its retry met the caller's read timeout: the plain SDK's own retries end in
    that timeout (``APITimeoutError``), and so does the guarded call, whose attempts did not all time out; the
    error is also the timeout's httpx class, as the plain client's is."""
    openai = pytest.importorskip("openai")
    async with hang_up_then_go_silent() as url, Guard([url], retry=RETRY, instrumentation=None) as guard:
        client = openai.AsyncOpenAI(
            base_url=url + "/v1",
            api_key="k",
            max_retries=0,
            timeout=httpx.Timeout(5.0, read=0.3),
            http_client=guard.http_client_for(openai.AsyncOpenAI),
        )
        with pytest.raises(openai.APITimeoutError) as caught:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        await client.close()
    error = caught.value.__cause__
    assert isinstance(error, AllAttemptsTimedOut) and isinstance(error, httpx.ReadTimeout)
    assert guard_failure(error) == "all_attempts_timed_out" and error.record is not None
    assert [a.error for a in error.record.attempts] == ["remote_protocol_error", "read_timeout"]
    assert type(error.__cause__).__name__ == "ReadTimeout"  # httpx's, or httpx2's for an SDK built on it


@pytest.mark.parametrize("kind", [AllAttemptsFailed, AllAttemptsTimedOut])
@pytest.mark.parametrize(
    "last", [httpx.ConnectTimeout("t"), httpx.ReadTimeout("t"), httpx.PoolTimeout("t"), httpx.ReadError("r")]
)
def test_a_failure_of_the_attempts_is_also_the_last_attempts_httpx_class(
    kind: type[GuardFailure], last: httpx.RequestError
) -> None:
    like = like_last_error(kind, last)
    assert issubclass(like, kind) and issubclass(like, type(last)) and like.__name__ == kind.__name__
    assert like_last_error(kind, last) is like  # one class per pair, not one per call
    assert like_last_error(kind, ValueError("not httpx's")) is kind
    error = like("every attempt failed", retry_after=2.5)
    error.cause = "budget_exhausted"
    copy = pickle.loads(pickle.dumps(error))  # to a process pool, a task queue: as a plain httpx error goes
    assert type(copy) is like and str(copy) == str(error)
    assert (copy.cause, copy.retry_after, guard_failure(copy)) == ("budget_exhausted", 2.5, "budget_exhausted")
