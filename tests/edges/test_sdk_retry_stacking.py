"""An SDK retrying on top of the guard is seen and stopped: a retry of a call the guard gave up on fails at
once with the same error, whatever ``max_retries`` says; a new call with the same body is sent as usual.

Real openai SDK (async and sync, default ``max_retries=2``) through the guard to real loopback servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import ssl
import weakref
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from llmguard_client import FailureMode, Guard, RetryPolicy, Tier, TTFTTimeout, guard_failure
from llmguard_client._core.given_up import GivenUp, Remembered
from llmguard_client._core.headers import CallerHeaders
from llmguard_client.errors import AllAttemptsFailed
from tests.edges.conftest import pools
from tests.loopback import LoopbackServer, Script

openai = pytest.importorskip("openai")
pytest.importorskip("httpx2")


async def recall(memory: GivenUp, request: httpx.Request, now: float, held: bool = True) -> Remembered | None:
    """What the memory answers ``request`` with, its SDK told by its headers as the transport tells it."""
    return await memory.recall(request, now, held, CallerHeaders(request).from_sdk)


MESSAGES: Any = [{"role": "user", "content": "hi"}]
RETRY = RetryPolicy(backoff_initial=0.01, backoff_max=0.02)


def guard_over(servers: list[LoopbackServer], mode: FailureMode, **kwargs: Any) -> Guard:
    kwargs.setdefault("tiers", {"t": Tier(ttft=0.3, total=10.0)})
    return Guard(
        [s.url for s in servers],
        failure_mode=mode,
        retry=RETRY,
        instrumentation=None,
        transport_factory=pools,
        **kwargs,
    )


def sent(servers: list[LoopbackServer], at_least: int) -> int:
    """Requests the servers received (waiting for at least ``at_least``: a guard that gave up may do so before
    a busy machine's server thread recorded the request)."""
    servers[0].wait_for(lambda: sum(len(s.received) for s in servers) >= at_least)
    return sum(len(s.received) for s in servers)


def sdk_retries(caplog: pytest.LogCaptureFixture) -> int:
    """How many retries the openai SDK logged that it would send ("Retrying request ...")."""
    return sum(r.name.startswith("openai") and r.getMessage().startswith("Retrying") for r in caplog.records)


@pytest.mark.parametrize("mode", ["auto", "raise"])
async def test_the_sdk_retry_of_a_timed_out_call_sends_nothing(
    servers: list[LoopbackServer], mode: FailureMode, caplog: pytest.LogCaptureFixture
) -> None:
    """Through ``guard.httpx2_client()`` the SDK retries the timeout, as it retries any error of its HTTP
    client's; each retry fails at once."""
    for server in servers:
        server.script = Script(hang_before_headers=5.0)
    async with guard_over(servers, mode) as guard:
        client = openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="k", http_client=guard.httpx2_client())
        assert client.max_retries == 2
        with caplog.at_level(logging.INFO):
            with pytest.raises(openai.APITimeoutError) as caught:
                await client.chat.completions.create(model="m", messages=MESSAGES)
    assert guard_failure(caught.value) == "ttft_timeout"
    assert "retry 2 of a call the guard already gave up on" in str(caught.value.__cause__)
    assert sdk_retries(caplog) == 2
    assert sent(servers, 1) == 1  # the guard's one attempt; the SDK's two retries sent nothing
    warnings = [r for r in caplog.records if "max_retries=0" in r.getMessage()]
    assert len(warnings) == (1 if mode == "raise" else 0)  # raise mode is told once that the SDK stacks


@pytest.mark.parametrize("mode", ["auto", "raise"])
async def test_openai_is_given_a_final_timeout_as_its_own_error_and_sends_no_retry(
    servers: list[LoopbackServer], mode: FailureMode, caplog: pytest.LogCaptureFixture
) -> None:
    """Through ``guard.http_client_for(openai.AsyncOpenAI)`` the guard raises a deadline it will not retry as
    openai's own ``APITimeoutError``, which openai >= 3 passes on without retrying: the caller gets it when the
    deadline passes, not after the SDK's backoff sleeps, and the cause is the guard's own."""
    for server in servers:
        server.script = Script(hang_before_headers=5.0)
    async with guard_over(servers, mode) as guard:
        client = openai.AsyncOpenAI(
            base_url=servers[0].url + "/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI)
        )
        assert client.max_retries == 2
        with caplog.at_level(logging.INFO):
            with pytest.raises(openai.APITimeoutError) as caught:
                await client.chat.completions.create(model="m", messages=MESSAGES)
    cause = caught.value.__cause__
    assert isinstance(cause, TTFTTimeout) and cause.final and not str(cause).startswith("retry")
    assert guard_failure(caught.value) == "ttft_timeout" and sdk_retries(caplog) == 0
    assert sent(servers, 1) == 1
    assert not [r for r in caplog.records if "max_retries=0" in r.getMessage()]  # nothing stacked to warn of


def test_the_sync_sdk_retry_of_a_failed_call_sends_nothing(servers: list[LoopbackServer]) -> None:
    for server in servers:
        server.script = Script(malformed_at=0)  # an event that is not JSON before any token, on every replica
    with guard_over(servers, "raise", tiers={"t": Tier(ttft=5.0, total=10.0)}) as guard:
        client = openai.OpenAI(
            base_url=servers[0].url + "/v1", api_key="k", http_client=guard.http_client_for(openai.OpenAI)
        )
        with pytest.raises(openai.APIConnectionError) as caught:
            client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    assert guard_failure(caught.value) == "all_attempts_failed"
    assert isinstance(caught.value.__cause__, AllAttemptsFailed) and caught.value.__cause__.final
    assert sent(servers, 3) == 3  # the guard's three attempts; the SDK, given its own error, sent no retry


@pytest.mark.parametrize("first", ["503", "dropped connection"])
async def test_the_sdk_retry_of_a_failure_the_guard_left_to_it_is_sent(first: str) -> None:
    """Off the generation paths the guard retries connect errors only: the SDK's own retry of a 503, or of a
    connection the server dropped without answering, on /embeddings goes out, as without a guard, and its answer
    is the call's."""
    seen: list[httpx.Request] = []

    def embeddings(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1 and first == "dropped connection":
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        data = [{"object": "embedding", "index": 0, "embedding": [0.5]}]
        status = 503 if len(seen) == 1 else 200
        return httpx.Response(status, json={"object": "list", "data": data, "model": "m", "usage": {}})

    replica = httpx.MockTransport(embeddings)
    async with Guard(["http://r.test"], retry=RETRY, instrumentation=None, transport_factory=lambda _: replica) as g:
        client = openai.AsyncOpenAI(base_url="http://r.test/v1", api_key="k", http_client=g.http_client())
        result = await client.embeddings.create(model="m", input="hi")
    assert result.data[0].embedding == [0.5]
    assert [request.headers["x-stainless-retry-count"] for request in seen] == ["0", "1"]


async def test_a_new_call_with_the_same_body_is_sent(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(hang_before_headers=5.0)
    async with guard_over(servers[:1], "auto") as guard:
        client = openai.AsyncOpenAI(
            base_url=servers[0].url + "/v1",
            api_key="k",
            max_retries=0,
            http_client=guard.http_client_for(openai.AsyncOpenAI),
        )
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(model="m", messages=MESSAGES)
        servers[0].script = Script()
        done = await client.chat.completions.create(model="m", messages=MESSAGES)  # retry count 0: a new call
    assert done.choices[0].message.content
    assert sent(servers[:1], 2) == 2


async def test_the_memory_is_bounded_in_size_and_time() -> None:
    def request(i: int, count: str = "1", **headers: str) -> httpx.Request:
        return httpx.Request(
            "POST",
            "http://a/v1/chat/completions",
            content=b'{"n": %d}' % i,
            headers={"x-stainless-retry-count": count, **headers},
        )

    memory = GivenUp(size=2, window=10.0)
    for i in range(3):
        memory.remember(request(i), request(i).read(), AllAttemptsFailed(f"call {i}"), now=0.0)
    assert len(memory) == 2 and await recall(memory, request(0), now=1.0) is None  # the oldest was forgotten
    again = await recall(memory, request(2), now=1.0)
    assert isinstance(again, AllAttemptsFailed) and "call 2" in again.message
    assert await recall(memory, request(2, count="0"), now=1.0) is None  # an SDK's first request is never a retry
    assert await recall(memory, request(2), now=10.0) is None and len(memory) == 0  # the window has passed
    keyed = request(7, count="0", **{"idempotency-key": "k1"})
    memory.remember(keyed, keyed.read(), AllAttemptsFailed("keyed"), now=20.0)
    other_body = httpx.Request("POST", "http://a/v1/chat/completions", content=b"{}", headers={"idempotency-key": "k1"})
    assert await recall(memory, other_body, now=21.0) is not None  # the same key is the same call


async def test_a_remembered_call_keeps_neither_its_request_nor_its_traceback() -> None:
    """A thousand remembered calls with large prompts must not hold their bodies for the window: what is kept
    is a copy of the error, without the request, the raised traceback (the call's frames) or its cause's."""
    body = b"x" * 1_000_000
    request = httpx.Request("POST", "http://a/v1/chat/completions", content=body)
    retry = httpx.Request(
        "POST", "http://a/v1/chat/completions", content=body, headers={"x-stainless-retry-count": "1"}
    )
    sent_request = weakref.ref(request)

    def fail(request: httpx.Request) -> AllAttemptsFailed:
        try:
            try:
                raise httpx.ConnectError("connection refused", request=request)
            except httpx.ConnectError as refused:
                raise AllAttemptsFailed("every attempt failed", request=request) from refused
        except AllAttemptsFailed as error:
            return error  # raised, so its traceback holds this frame (and ``request``)

    memory = GivenUp()
    memory.remember(request, body, fail(request), now=0.0)
    del request
    gc.collect()
    assert sent_request() is None
    again = await recall(memory, retry, now=1.0)
    assert isinstance(again, AllAttemptsFailed) and "every attempt failed" in again.message
    assert isinstance(again.__cause__, httpx.ConnectError) and str(again.__cause__) == "connection refused"


async def test_a_later_call_of_the_same_body_that_may_be_retried_clears_the_memory() -> None:
    """Two calls with the same body: the first was given up on; the second failed in a way its SDK may retry
    (e.g. a full bulkhead, nothing sent): that retry must not get the first call's error."""
    request = httpx.Request(
        "POST", "http://a/v1/chat/completions", content=b"{}", headers={"x-stainless-retry-count": "1"}
    )
    memory = GivenUp()
    memory.remember(request, b"{}", AllAttemptsFailed("the first call"), now=0.0)
    memory.forget(request, b"{}")
    assert await recall(memory, request, now=1.0) is None


async def test_an_upload_is_known_without_its_body() -> None:
    """A multipart upload the guard sends as it reads it is not held, and each SDK request of it draws a new
    boundary: it is known by its method, URL, caller, media type and length. A first request of it forgets what
    an earlier upload left; a request without a retry count is never taken for a retry."""

    def upload(count: str | None, boundary: str, length: str = "1000", **headers: str) -> httpx.Request:
        sdk = {} if count is None else {"x-stainless-retry-count": count}
        kind = {"content-type": f"multipart/form-data; boundary={boundary}", "content-length": length}
        return httpx.Request("POST", "http://a/v1/files", headers={**kind, **sdk, **headers})

    memory = GivenUp()
    memory.remember(upload("0", "b0"), None, AllAttemptsFailed("the upload"), now=0.0)
    again = await recall(memory, upload("1", "b1"), now=1.0, held=False)  # another boundary: the same call
    assert isinstance(again, AllAttemptsFailed) and "the upload" in again.message
    assert await recall(memory, upload("1", "b1", length="999"), now=1.0, held=False) is None  # another size
    assert await recall(memory, upload(None, "b1", **OPENAI_1_40_HEADERS), now=1.0, held=False) is None  # uncounted
    assert await recall(memory, upload("0", "b2"), now=2.0, held=False) is None  # a new upload from this task...
    assert await recall(memory, upload("1", "b3"), now=3.0, held=False) is None  # ...whose retry is its own
    assert len(memory) == 0


OPENAI_1_40_HEADERS = {
    "x-stainless-lang": "python",
    "x-stainless-package-version": "1.40.0",
    "x-stainless-os": "Linux",
    "x-stainless-arch": "x64",
    "x-stainless-runtime": "CPython",
    "x-stainless-runtime-version": "3.11.7",
    "x-stainless-async": "async:asyncio",
}
"""What openai 1.40 sends with each request, its retries included: no ``x-stainless-retry-count`` (1.47+)."""


async def test_a_retry_from_an_sdk_that_sends_no_retry_count_sends_nothing(servers: list[LoopbackServer]) -> None:
    """openai before 1.47 retries a timed-out call with the same request and no retry count: within the SDK's
    backoff window it is the same call, and fails at once with the same error."""
    servers[0].script = Script(hang_before_headers=5.0)
    url = servers[0].url + "/v1/chat/completions"
    body = {"model": "m", "messages": MESSAGES}
    async with guard_over(servers[:1], "auto") as guard, guard.http_client() as client:
        with pytest.raises(httpx.TimeoutException) as first:
            await client.post(url, json=body, headers=OPENAI_1_40_HEADERS)
        with pytest.raises(httpx.TimeoutException) as again:
            await client.post(url, json=body, headers=OPENAI_1_40_HEADERS)
    assert guard_failure(first.value) == guard_failure(again.value) == "ttft_timeout"
    assert "a retry of a call the guard already gave up on" in str(again.value)
    assert sent(servers[:1], 1) == 1


async def test_an_uncounted_request_is_a_retry_only_within_the_sdks_backoff_window() -> None:
    def request(**headers: str) -> httpx.Request:
        return httpx.Request("POST", "http://a/v1/chat/completions", content=b"{}", headers=headers)

    memory = GivenUp()
    memory.remember(request(), b"{}", AllAttemptsFailed("the call"), now=0.0)
    assert await recall(memory, request(**OPENAI_1_40_HEADERS), now=8.5) is not None  # openai sleeps at most 8 s
    assert await recall(memory, request(), now=1.0) is None  # not an SDK: a first request, never a retry
    assert await recall(memory, request(**OPENAI_1_40_HEADERS), now=9.5) is None  # past the SDK's backoff
    counted = request(**OPENAI_1_40_HEADERS, **{"x-stainless-retry-count": "1"})
    assert await recall(memory, counted, now=20.0) is not None  # a counted retry: the whole window


UNCOUNTING_SDKS = {
    "cohere": {"user-agent": "cohere/7.3.1", "x-fern-language": "Python", "x-fern-sdk-name": "cohere"},
    "google-genai": {"user-agent": "google-genai-sdk/1.0 gl-python/3.11", "x-goog-api-client": "google-genai-sdk/1.0"},
    "mistralai": {"user-agent": "mistral-client-python/3.7.0"},
    "huggingface_hub": {"user-agent": "unknown/None; hf_hub/2.4.0; python/3.11.7"},
}


@pytest.mark.parametrize("headers", UNCOUNTING_SDKS.values(), ids=UNCOUNTING_SDKS.keys())
async def test_a_repeat_from_an_sdk_that_counts_no_retries_is_a_new_call(headers: dict[str, str]) -> None:
    """mistralai, huggingface_hub and google-genai do not retry on their own by default, cohere only some errors,
    and none of them sends a retry count: the same request again from one of them, within the window, is the
    caller's new call (a retry button, a prompt sampled twice), sent again, not failed at once with the error of
    the call given up on (it was, for 9 s, after the server had recovered)."""

    def request(**more: str) -> httpx.Request:
        return httpx.Request("POST", "http://a/v1/chat/completions", content=b"{}", headers=more)

    memory = GivenUp()
    memory.remember(request(), b"{}", AllAttemptsFailed("the call"), now=0.0)
    assert await recall(memory, request(**headers), now=1.0) is None


class Raising(httpx.AsyncBaseTransport):
    """A replica's transport that raises ``error`` for every request it is given, and counts them."""

    def __init__(self, error: BaseException) -> None:
        self.error, self.sent = error, 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        raise self.error


@pytest.mark.parametrize(
    "error",
    [ssl.SSLError(1, "[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC]"), anyio.EndOfStream()],
    ids=["tls_record_error", "end_of_stream"],
)
async def test_a_network_error_httpx_leaves_unmapped_is_given_up_on_once(error: BaseException) -> None:
    """Errors the pool lets through (openai counts both as connection errors, and retries them) are the guard's
    to retry; once it gave up, the SDK's two retries send nothing."""
    transport = Raising(error)
    async with Guard(["http://a.invalid"], retry=RETRY, transport_factory=lambda _: transport) as guard:
        client = openai.AsyncOpenAI(
            base_url="http://a.invalid/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI)
        )
        with pytest.raises(openai.APIConnectionError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES)
    assert guard_failure(caught.value) == "all_attempts_failed"
    assert transport.sent == 3  # the guard's three attempts; none for the SDK's two retries


async def test_an_error_of_the_callers_own_transport_is_neither_retried_nor_disguised() -> None:
    transport = Raising(OSError("local failure"))
    async with Guard(["http://a.invalid"], retry=RETRY, transport_factory=lambda _: transport) as guard:
        client = guard.http_client()
        with pytest.raises(OSError, match="local failure") as caught:
            await client.post("http://a.invalid/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
        await client.aclose()
    assert caught.value is transport.error and transport.sent == 1


@contextlib.asynccontextmanager
async def trickling(sent: list[bytes]) -> AsyncIterator[str]:
    """A server answering each request with a 200 ``text/plain`` body that never ends (a byte every 20 ms), as
    a gateway's error page might: no protocol reader claims it, so its first bytes are the first token."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            length = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
            sent.append(await reader.readexactly(int(length[0].split(b":")[1])))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n")
            while True:
                writer.write(b"1\r\nx\r\n")
                await writer.drain()
                await asyncio.sleep(0.02)
        writer.close()

    listener = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    finally:
        listener.close()


@pytest.mark.parametrize("factory", ["httpx2_client", "http_client_for"])
async def test_a_call_past_its_total_deadline_mid_body_is_not_sent_again_by_the_sdk(
    factory: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A call that asks for no stream has its body read by the SDK before create() returns, and the SDK retries
    what that read raises: after the tier's total deadline passed mid-body, its retry fails at once (or, given
    its own error through ``http_client_for``, openai sends none), so the call ends within its total deadline
    instead of one total per SDK request."""
    sent: list[bytes] = []
    async with trickling(sent) as url:
        tiers = {"t": Tier(ttft=1.0, total=1.0)}  # its first bytes come at once: a win
        async with Guard([url], tiers=tiers, retry=RETRY, instrumentation=None, transport_factory=pools) as guard:
            http = guard.httpx2_client() if factory == "httpx2_client" else guard.http_client_for(openai.AsyncOpenAI)
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=1, http_client=http)
            with caplog.at_level(logging.INFO), pytest.raises(openai.APITimeoutError) as caught:
                await client.chat.completions.create(model="m", messages=MESSAGES)
    assert guard_failure(caught.value) == "total_timeout" and len(sent) == 1
    assert sdk_retries(caplog) == (1 if factory == "httpx2_client" else 0)


async def test_another_callers_retry_of_the_same_body_is_not_taken_for_a_given_up_call(
    servers: list[LoopbackServer],
) -> None:
    """Two callers send the same prompt: the guard gave up on the first's call; the second's (a control call here,
    passed through as without a guard) gets its own SDK retry sent, as the plain SDK would. Before: its retry was
    taken for the first caller's and refused with that call's error (one request, not two)."""
    for server in servers:
        server.script = Script(hang_before_headers=5.0)
    async with guard_over(servers, "auto") as guard:

        def client(**options: Any) -> Any:
            http = guard.http_client_for(openai.AsyncOpenAI)
            return openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="k", http_client=http, **options)

        async def guarded() -> None:
            with pytest.raises(openai.APITimeoutError):
                await client().chat.completions.create(model="m", messages=MESSAGES)

        async def control() -> None:
            with pytest.raises(openai.APITimeoutError) as caught:
                await client(timeout=0.3, max_retries=1).chat.completions.create(
                    model="m", messages=MESSAGES, extra_headers={"x-llmguard-cohort": "control"}
                )
            assert guard_failure(caught.value) is None  # the SDK's own timeout, twice

        first = asyncio.create_task(guarded())
        await first
        assert sent(servers, 1) == 1
        second = asyncio.create_task(control())  # another caller: another task (the first is still referenced)
        await second
    assert sent(servers, 3) == 3  # the control call's request and its SDK retry
