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
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import Any

import httpx
import pytest

from llmguard_client import AllAttemptsFailed, Guard, RetryPolicy, guard_failure
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
