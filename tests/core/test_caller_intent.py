"""The caller's retry intent, seen and set: the retry count each attempt reports, and the most attempts.

The openai SDK (>= 3, through ``guard.httpx2_client()``) against real loopback servers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from llmguard_client import (
    BudgetPolicy,
    Guard,
    GuardConfigError,
    GuardRequestError,
    RetryPolicy,
    Tier,
    guard_failure,
)
from llmguard_client._core.caller_intent import read_timeout, with_retry_count, within_read_timeout
from tests.edges.conftest import pools
from tests.loopback import LoopbackServer, Script
from tests.virtual import run_virtual

openai = pytest.importorskip("openai")
pytest.importorskip("httpx2")

FAST_RETRY = RetryPolicy(backoff_initial=0.01, backoff_max=0.02)
MESSAGES: Any = [{"role": "user", "content": "req1 hi"}]


def fail_twice(index: int, attempt: int) -> Script | None:
    return Script(status=500) if attempt <= 2 else None


def guard_over(server: LoopbackServer, tier: Tier | None = None, **kwargs: Any) -> Guard:
    tiers = {"t": tier or Tier(ttft=10, total=20)}
    kwargs.setdefault("retry", FAST_RETRY)
    return Guard([server.url], tiers=tiers, instrumentation=None, transport_factory=pools, **kwargs)


def sent_counts(server: LoopbackServer) -> list[str | None]:
    return [r.headers.get("x-stainless-retry-count") for r in server.received]


async def test_each_retry_carries_its_attempt_number_in_the_sdks_retry_count(servers: list[LoopbackServer]) -> None:
    server = servers[0]
    server.scripter = fail_twice
    async with guard_over(server) as guard:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", http_client=guard.httpx2_client())
        done = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert done.choices[0].message.content
    assert sent_counts(server) == ["0", "1", "2"]  # the guard's retries, numbered as the SDK numbers its own


async def test_a_call_the_sdk_already_retried_counts_on_from_the_sdks_number(servers: list[LoopbackServer]) -> None:
    server = servers[0]
    server.scripter = fail_twice
    async with guard_over(server) as guard, httpx.AsyncClient(transport=guard.transport) as client:
        sdk_retry = {"x-stainless-retry-count": "1", "content-type": "application/json"}
        body = {"model": "m", "messages": MESSAGES}
        response = await client.post(server.url + "/v1/chat/completions", json=body, headers=sdk_retry)
    assert response.status_code == 200
    assert sent_counts(server) == ["1", "2", "3"]


async def test_a_retry_count_the_caller_omitted_stays_omitted(servers: list[LoopbackServer]) -> None:
    server = servers[0]
    server.scripter = fail_twice
    async with guard_over(server) as guard:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", http_client=guard.httpx2_client())
        omitted: Any = {"x-stainless-retry-count": openai.Omit()}
        await client.chat.completions.create(model="m", messages=MESSAGES, extra_headers=omitted)
    assert sent_counts(server) == [None, None, None]


@pytest.mark.parametrize(
    ("tier_attempts", "header", "sent"), [(None, "1", 1), (2, None, 2), (2, "4", 4), (None, None, 3)]
)
async def test_the_most_attempts_come_from_the_header_else_the_tier_else_the_policy(
    servers: list[LoopbackServer], tier_attempts: int | None, header: str | None, sent: int
) -> None:
    server = servers[0]
    server.script = Script(status=500)
    extra = {"x-llmguard-max-attempts": header} if header is not None else None
    async with guard_over(server, tier=Tier(ttft=10, total=20, max_attempts=tier_attempts)) as guard:
        client = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="k", max_retries=0, http_client=guard.httpx2_client()
        )
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="m", messages=MESSAGES, extra_headers=extra)
    assert len(server.received) == sent
    assert all("x-llmguard-max-attempts" not in r.headers for r in server.received)  # the guard's, not forwarded


@pytest.mark.parametrize("header", ["0", "11", "three"])
async def test_a_bad_max_attempts_header_is_refused_before_anything_is_sent(
    servers: list[LoopbackServer], header: str
) -> None:
    server = servers[0]
    async with guard_over(server) as guard:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", http_client=guard.httpx2_client())
        with pytest.raises(openai.BadRequestError, match="x-llmguard-max-attempts must be an integer from 1 to 10"):
            await client.chat.completions.create(
                model="m", messages=MESSAGES, extra_headers={"x-llmguard-max-attempts": header}
            )
        async with httpx.AsyncClient(transport=guard.transport) as plain:  # raise mode for a plain client
            with pytest.raises(GuardRequestError):
                await plain.post(server.url + "/v1/chat/completions", headers={"x-llmguard-max-attempts": header})
    assert server.received == []


@pytest.mark.parametrize(
    ("bad", "named"),
    [(-1.0, "connect"), (float("nan"), "connect"), (0, "connect"), (httpx.Timeout(5.0, read=0), "read")],
)
async def test_a_timeout_no_request_could_meet_is_refused_before_anything_is_sent(
    servers: list[LoopbackServer], bad: Any, named: str
) -> None:
    """Before: -1 and NaN timed out after three attempts (the plain SDK raises ValueError), 0 after 1.5 s."""
    server = servers[0]
    async with guard_over(server) as guard:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", http_client=guard.httpx2_client())
        with pytest.raises(openai.BadRequestError, match=f"the request's {named} timeout must be a number of seconds"):
            await client.chat.completions.create(model="m", messages=MESSAGES, timeout=bad)
        async with httpx.AsyncClient(transport=guard.transport, timeout=bad) as plain:  # raise mode
            with pytest.raises(GuardRequestError, match=f"{named} timeout"):
                await plain.post(server.url + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert server.received == []


async def test_a_pool_timeout_of_zero_is_honoured_not_refused(servers: list[LoopbackServer]) -> None:
    """httpx reads ``pool=0`` as "no waiting for a free connection": a call that finds one is served."""
    server = servers[0]
    async with guard_over(server) as guard:
        async with httpx.AsyncClient(transport=guard.transport, timeout=httpx.Timeout(5.0, pool=0)) as client:
            response = await client.post(server.url + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert response.status_code == 200


@pytest.mark.parametrize("bad", [0, 11, 2.0, True])
def test_tier_max_attempts_is_checked(bad: Any) -> None:
    with pytest.raises(GuardConfigError, match=r"Tier\.max_attempts must be an integer from 1 to 10"):
        Tier(ttft=1, total=2, max_attempts=bad)


def test_with_retry_count_raises_only_a_numeric_count() -> None:
    headers = [(b"X-Stainless-Retry-Count", b"1"), (b"a", b"b")]
    assert with_retry_count(headers, 2) == [(b"X-Stainless-Retry-Count", b"3"), (b"a", b"b")]
    assert with_retry_count([(b"x-stainless-retry-count", b"x")], 2) == [(b"x-stainless-retry-count", b"x")]


def test_read_timeout_is_the_sdks_read_component() -> None:
    assert read_timeout({"timeout": {"connect": 5.0, "read": 1.5, "write": 5.0, "pool": 5.0}}) == 1.5
    assert read_timeout({"timeout": {"connect": 5.0, "read": None}}) is None
    assert read_timeout({}) is None


def test_the_sdks_read_timeout_before_the_first_token_is_not_retried_by_the_guard(
    servers: list[LoopbackServer],
) -> None:
    """openai.OpenAI(timeout=1.0, max_retries=0), a server that answers after 3 s, Tier(ttft=5): one request,
    given up at the SDK's 1 s read timeout, a timeout (it used to be three read timeouts, three generations on the
    server, and a 502): the SDK's max_retries decides, as without a guard."""
    server = servers[0]
    server.script = Script(hang_before_headers=3.0)
    with guard_over(server, tier=Tier(ttft=5, total=10), failure_mode="raise") as guard:
        client = openai.OpenAI(
            base_url=server.url + "/v1", api_key="k", timeout=1.0, max_retries=0, http_client=guard.sync_httpx2_client()
        )
        with guard.capture() as calls, pytest.raises(openai.APITimeoutError) as caught:
            client.chat.completions.create(model="m", messages=MESSAGES)
    assert guard_failure(caught.value) == "all_attempts_timed_out"
    assert type(caught.value.__cause__.__cause__).__name__ == "ReadTimeout"  # the SDK's own, from the pool
    assert len(calls[0].attempts) == 1
    assert server.wait_for(lambda: len(server.received) == 1)
    assert len(server.received) == 1


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("create", ["chat", "embeddings"])
def test_a_request_that_outlasts_the_sdks_timeout_is_the_sdks_to_retry(
    servers: list[LoopbackServer], kind: str, create: str
) -> None:
    """openai.OpenAI(timeout=1.0) with its default max_retries=2, a server whose first answer takes 3 s and the
    next comes at once: served on the SDK's retry, as without a guard (2 requests), not failed at 1 s. The
    timeout was the SDK's own deadline, shorter than the tier's, so its max_retries decides."""
    server = servers[0]
    server.scripter = lambda index, attempt: Script(hang_before_headers=3.0) if attempt == 1 else None
    if create == "embeddings":
        vector = {"object": "embedding", "index": 0, "embedding": [0.5]}
        server.script = Script(body={"object": "list", "data": [vector], "model": "e", "usage": {"prompt_tokens": 1}})

    async def call(client: Any) -> object:
        if create == "chat":
            return await client.chat.completions.create(model="m", messages=MESSAGES)
        return await client.embeddings.create(model="m", input="req1 hi")

    def sync_call(client: Any) -> object:
        if create == "chat":
            return client.chat.completions.create(model="m", messages=MESSAGES)
        return client.embeddings.create(model="m", input="req1 hi")

    with guard_over(server, tier=Tier(ttft=10, total=20)) as guard, guard.capture() as calls:
        if kind == "sync":
            client = openai.OpenAI(
                base_url=server.url + "/v1", api_key="k", timeout=1.0, http_client=guard.http_client_for(openai.OpenAI)
            )
            sync_call(client)
        else:

            async def main() -> None:
                async with openai.AsyncOpenAI(
                    base_url=server.url + "/v1",
                    api_key="k",
                    timeout=1.0,
                    http_client=guard.http_client_for(openai.AsyncOpenAI),
                ) as client:
                    await call(client)

            anyio.run(main)
    assert [(c.status, c.cause) for c in calls] == [("timeout", "all_attempts_timed_out"), ("ok", None)]
    assert server.wait_for(lambda: len(server.received) == 2)


HANG = Script(hang_before_headers=3.0)
FAILING = Script(status=500, body={"error": {"message": "boom", "type": "server_error"}})
CONFLICT = Script(status=409, body={"error": {"message": "busy", "type": "conflict"}})
HANDED_BACK_PATTERNS = {
    "timeout_first": [HANG],
    "timeout_twice": [HANG, HANG],
    "500_then_timeout": [FAILING, HANG],
    "409_first": [CONFLICT],
}
"""What the server answers the call's first requests (every later one: a 500), under the SDK's timeout=1.0."""


@pytest.mark.parametrize("pattern", sorted(HANDED_BACK_PATTERNS))
@pytest.mark.parametrize("kind", ["plain", "guarded"])
async def test_the_sdks_retry_of_a_request_handed_back_to_it_gets_the_attempts_its_call_has_left(
    servers: list[LoopbackServer], kind: str, pattern: str
) -> None:
    """openai.AsyncOpenAI(timeout=1.0) with its default max_retries=2. A read timeout, or a 409 (which the guard
    does not retry), is the SDK's to retry, as without a guard; on that retry the guard retries the 500s itself,
    within the attempts its call has left (the guard's earlier requests of the call count): 3 requests in all, as
    through the plain SDK. The guard used to give each SDK retry a whole new round of 3: 4 requests after one
    timeout or a 409, 5 after a 500 and a timeout."""
    server = servers[0]
    scripts = HANDED_BACK_PATTERNS[pattern]
    server.scripter = lambda index, attempt: scripts[attempt - 1] if attempt <= len(scripts) else FAILING
    kwargs: dict[str, Any] = {"base_url": server.url + "/v1", "api_key": "k", "timeout": 1.0}
    if kind == "plain":
        async with openai.AsyncOpenAI(**kwargs) as client:
            with pytest.raises(openai.InternalServerError):
                await client.chat.completions.create(model="m", messages=MESSAGES)
    else:
        async with guard_over(server, tier=Tier(ttft=10, total=20)) as guard:
            async with openai.AsyncOpenAI(**kwargs, http_client=guard.http_client_for(openai.AsyncOpenAI)) as client:
                with pytest.raises(openai.InternalServerError):
                    await client.chat.completions.create(model="m", messages=MESSAGES)
    assert len(server.received) == 3  # each request was received before the call ended


SPENT_PATTERNS: dict[str, tuple[list[Script], type[Exception]]] = {
    "500_500_409": ([FAILING, FAILING, CONFLICT], openai.ConflictError),
    "500_500_timeout": ([FAILING, FAILING, HANG], openai.APITimeoutError),
}
"""The call's first requests (every later one: a 409) and what the plain SDK raises after its 3 requests."""


@pytest.mark.parametrize("pattern", sorted(SPENT_PATTERNS))
@pytest.mark.parametrize("kind", ["plain", "guarded"])
async def test_a_failure_after_the_guards_own_retries_spent_the_attempts_is_final(
    servers: list[LoopbackServer], kind: str, pattern: str
) -> None:
    """openai.AsyncOpenAI(timeout=1.0), default max_retries=2; the guard retries two 500s itself, then meets a 409
    or the SDK's read timeout (both the SDK's to retry, as without a guard) with no attempt left: the caller gets
    that failure, its type as through the plain SDK, after 3 requests. Each SDK retry used to get one request
    more ("at least one"): 5 requests, max_attempts + max_retries."""
    server = servers[0]
    scripts, raised = SPENT_PATTERNS[pattern]
    server.scripter = lambda index, attempt: scripts[attempt - 1] if attempt <= len(scripts) else CONFLICT
    kwargs: dict[str, Any] = {"base_url": server.url + "/v1", "api_key": "k", "timeout": 1.0}
    if kind == "plain":
        async with openai.AsyncOpenAI(**kwargs) as client:
            with pytest.raises(raised):
                await client.chat.completions.create(model="m", messages=MESSAGES)
    else:
        async with guard_over(server, tier=Tier(ttft=10, total=20)) as guard:
            async with openai.AsyncOpenAI(**kwargs, http_client=guard.http_client_for(openai.AsyncOpenAI)) as client:
                with pytest.raises(raised) as caught:
                    await client.chat.completions.create(model="m", messages=MESSAGES)
        assert guard_failure(caught.value) == (
            "upstream_status" if pattern.endswith("409") else "all_attempts_timed_out"
        )
    assert len(server.received) == 3  # each request was received before the call ended


@pytest.mark.parametrize("kind", ["plain", "guarded"])
async def test_an_answer_the_guard_never_retried_stays_the_sdks_to_retry_past_max_attempts(
    servers: list[LoopbackServer], kind: str
) -> None:
    """409, 409, 409, then 200, with max_retries=3: every request was the SDK's own (the guard retries no 409), so
    its max_retries decides, as without a guard: served on the fourth request, one more than max_attempts."""
    server = servers[0]
    server.scripter = lambda index, attempt: CONFLICT if attempt <= 3 else None
    kwargs: dict[str, Any] = {"base_url": server.url + "/v1", "api_key": "k", "max_retries": 3}
    async with guard_over(server, tier=Tier(ttft=10, total=20)) as guard:
        http_client = guard.http_client_for(openai.AsyncOpenAI) if kind == "guarded" else None
        async with openai.AsyncOpenAI(**kwargs, http_client=http_client) as client:
            completion = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert completion.choices[0].message.content and len(server.received) == 4


AFTER_THE_HEADERS = {
    "read_timeout": (Script(tokens=3, stall_before_first=1.5), {"timeout": 0.3}, BudgetPolicy(), "timeout"),
    "cut": (Script(tokens=3, reset_after_tokens=0), {}, BudgetPolicy(ratio=0.0, floor=0), "error"),
}
"""Per error after a stream's headers, before its first token: the server's script, the SDK client's options, the
guard's retry budget and the call's record status."""


@pytest.mark.parametrize("failure", list(AFTER_THE_HEADERS))
@pytest.mark.parametrize("mode", ["guard", "cooperative"])
@pytest.mark.parametrize("api", ["sync", "async"])
def test_an_error_after_a_streams_headers_meets_the_caller_reading_the_stream(
    servers: list[LoopbackServer], api: str, mode: str, failure: str
) -> None:
    """The server sends its headers and a role-only event at once, then, before the first token, either stalls
    past ``timeout=0.3`` (its first token comes after 1.5 s: an engine still queueing the call) or cuts the
    connection (a gateway's idle timeout shorter than the model's first token); default ``max_retries=2``. Without a
    guard the SDK has returned the stream by then and the error meets the caller reading it (the SDK's timeout or
    connection error), not retried: one request. Through the guard the call ends as it does without one, in
    cooperative mode too (where the SDK sends the retries): the stream comes back and raises the same error as it is
    read, after one request. The SDK's read timeout is never the guard's to retry; a cut is, within the retry budget,
    here empty. (Before, the SDK took the timeout for one before the answer and retried it, then it was raised by
    ``create()`` after the SDK's backoff sleeps; a cut went on as a paced retry past the empty budget, as if the
    plain SDK retried it: three requests, the error raised by ``create()``.)"""
    server = servers[0]
    script, options, budget, status = AFTER_THE_HEADERS[failure]
    server.scripter = lambda index, attempt: script
    kwargs: dict[str, Any] = {"base_url": server.url + "/v1", "api_key": "k", **options}

    def sync_call(http_client: Any) -> None:
        stream = openai.OpenAI(**kwargs, http_client=http_client).chat.completions.create(
            model="m", messages=MESSAGES, stream=True
        )
        created.append(stream)
        for _ in stream:
            pass

    async def async_call(http_client: Any) -> None:
        async with openai.AsyncOpenAI(**kwargs, http_client=http_client) as client:
            stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            created.append(stream)
            async for _ in stream:
                pass

    met: list[tuple[type[BaseException], type[BaseException] | None]] = []
    retry = RetryPolicy(mode=mode, backoff_initial=0.01, backoff_max=0.02)
    with guard_over(server, retry=retry, budget=budget) as guard, guard.capture() as calls:
        for kind in ("plain", "guarded"):
            created: list[object] = []
            sdk = openai.OpenAI if api == "sync" else openai.AsyncOpenAI
            http_client = guard.http_client_for(sdk) if kind == "guarded" else None
            with pytest.raises((openai.APITimeoutError, openai.APIConnectionError, httpx.TransportError)) as caught:
                sync_call(http_client) if api == "sync" else anyio.run(async_call, http_client)
            cause = caught.value.__cause__
            met.append((type(caught.value), None if cause is None else type(cause)))
            assert len(created) == 1, kind  # create() returned the stream: the error came from reading it
            assert server.wait_for(lambda: len(server.received) == 1), kind
            assert len(server.received) == 1, kind
            server.received.clear()
    assert met[0] == met[1]
    assert [(c.status, len(c.attempts)) for c in calls] == [(status, 1)]
    assert guard.snapshot().budget.paced == 0


class _TimesOutInTheBody(httpx.AsyncByteStream):
    """A JSON body whose read times out after its first bytes (the pool's read timeout, the caller's own)."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'{"id": "chatcmpl-1", '
        raise httpx.ReadTimeout("scripted: the body's next bytes came later than the read timeout")


@pytest.mark.parametrize("mode", ["guard", "cooperative"])
def test_a_whole_bodys_read_timeout_after_its_headers_is_the_sdks_to_retry(mode: str) -> None:
    """A call that is not streamed, whose body's read times out after its headers: the SDK reads a whole body inside
    its request and retries the timeout, as without a guard (``max_retries=2``: three requests, then
    ``APITimeoutError``); in cooperative mode too. (There it was final after one request: the guard kept that answer
    as one its caller had been handed, as it keeps a stream's.)"""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, headers={"content-type": "application/json"}, stream=_TimesOutInTheBody())

    replica = httpx.MockTransport(answer)

    async def main() -> None:
        retry = RetryPolicy(mode=mode)
        async with Guard(
            ["http://r.test"], retry=retry, instrumentation=None, transport_factory=lambda _: replica
        ) as g:
            client = openai.AsyncOpenAI(
                base_url="http://r.test/v1", api_key="k", http_client=g.http_client_for(openai.AsyncOpenAI)
            )
            with pytest.raises(openai.APITimeoutError):
                await client.chat.completions.create(model="m", messages=MESSAGES)
            await client.close()

    run_virtual(main, "asyncio")
    assert [request.headers["x-stainless-retry-count"] for request in seen] == ["0", "1", "2"]


@pytest.mark.parametrize("kind", ["plain", "guarded"])
async def test_keep_alives_before_the_first_token_keep_a_call_within_the_sdks_read_timeout(
    servers: list[LoopbackServer], kind: str
) -> None:
    """A read timeout bounds each read: a server that sends keep-alives while it thinks (Anthropic's pings, an SSE
    comment) is served after 2 s under ``timeout=1.0``, with one request, through the guard as without it (before,
    the guard took the read timeout for the first-token deadline: a timeout at 1 s, and the SDK's two retries)."""
    server = servers[0]
    server.script = Script(tokens=3, stall_before_first=2.0, keepalive_every=0.25)
    async with guard_over(server, tier=Tier(ttft=10, total=20)) as guard:
        http_client = guard.http_client_for(openai.AsyncOpenAI) if kind == "guarded" else None
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="k", timeout=1.0, http_client=http_client
        ) as client:
            stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == " t0 t1 t2" and len(server.received) == 1


async def test_the_sdks_timeout_bounds_each_silence_of_a_stream(servers: list[LoopbackServer]) -> None:
    server = servers[0]
    server.script = Script(tokens=5, stall_after_first=3.0)
    async with guard_over(server, tier=Tier(ttft=5, total=10)) as guard:
        client = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="k", max_retries=0, http_client=guard.httpx2_client()
        )
        stream = await client.with_options(timeout=1.0).chat.completions.create(
            model="m", messages=MESSAGES, stream=True
        )
        with pytest.raises(openai.APITimeoutError) as caught:
            async for _ in stream:
                pass
    assert guard_failure(caught.value) == "stall_timeout"


async def test_a_timeout_longer_than_the_tier_changes_nothing(servers: list[LoopbackServer]) -> None:
    server = servers[0]
    server.script = Script(hang_before_headers=3.0)
    async with guard_over(server, tier=Tier(ttft=0.3, total=10)) as guard:
        client = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="k", max_retries=0, timeout=600, http_client=guard.httpx2_client()
        )
        with pytest.raises(openai.APITimeoutError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES)
    assert guard_failure(caught.value) == "ttft_timeout"
    assert "(0.3s;" in str(caught.value.__cause__)  # the tier's deadline, not capped by the SDK's 600 s


def test_a_read_timeout_past_the_total_caps_a_tier_without_stall_at_its_total() -> None:
    """A tier with no stall limit, under the SDKs' 600 s read timeout: the stall it gets stays within its total
    (a Tier refuses a stall past its total), so the call is not refused for a limit it never set."""
    tier = Tier(ttft=1, total=30)
    capped = within_read_timeout(tier, {"timeout": {"connect": 5.0, "read": 600.0}})
    assert (capped.ttft, capped.total, capped.stall) == (1, 30, 30)
    assert within_read_timeout(Tier(ttft=1, total=30, stall=10), {"timeout": {"read": 600.0}}).stall == 10
    assert within_read_timeout(tier, {"timeout": {"read": 5.0}}).stall == 5.0
