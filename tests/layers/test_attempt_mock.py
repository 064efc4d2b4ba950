"""The request path with mocked upstreams: httpx.MockTransport as each replica's transport, and
respx patching httpcore below the guard's default transports.

No sockets, no sleeps: every replica answers at once, so these run in milliseconds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import pytest
import respx

from llmguard_client import (
    AllAttemptsFailed,
    AllAttemptsFailedToConnect,
    Bulkhead,
    BulkheadFull,
    Guard,
    GuardClosed,
    GuardConfigError,
    GuardRequestError,
    HedgePolicy,
    PhaseRecord,
    Replica,
    RetryPolicy,
    StallTimeout,
    Tier,
    TotalTimeout,
    UnknownTierError,
)
from llmguard_client._http.error_body import ERROR_BODY_LIMIT
from tests.virtual import BACKENDS, run_virtual

R1 = "http://r1.test:8000"
R2 = "http://r2.test:9000"
CHAT = "/v1/chat/completions"
BODY: dict[str, Any] = {"model": "m-1", "messages": [{"role": "user", "content": "secret prompt"}], "max_tokens": 16}
COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "m-1",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
TIERS = {"interactive": Tier(ttft=5.0, total=10.0, stall=5.0), "batch": Tier(ttft=20.0, total=60.0)}
FAST_RETRY = RetryPolicy(backoff_initial=0.001, backoff_max=0.005)

Responder = Callable[[str, httpx.Request, int], httpx.Response]


def ok(replica: str, request: httpx.Request, n: int) -> httpx.Response:
    return httpx.Response(200, json=COMPLETION)


class Upstream:
    """Replica transports backed by one handler; records every request each replica received."""

    def __init__(self, respond: Responder = ok) -> None:
        self.respond = respond
        self.seen: list[tuple[str, httpx.Request]] = []

    def factory(self, replica: Replica) -> httpx.AsyncBaseTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            self.seen.append((replica.name, request))
            return self.respond(replica.name, request, len(self.seen))

        return httpx.MockTransport(handler)

    def to(self, replica: str) -> list[httpx.Request]:
        return [r for name, r in self.seen if name == replica]


def make_guard(
    upstream: Upstream, replicas: list[str | Replica] | None = None, records: list[PhaseRecord] | None = None, **kw: Any
) -> Guard:
    kw.setdefault("tiers", TIERS)
    kw.setdefault("hedge", None)
    kw.setdefault("retry", FAST_RETRY)
    kw.setdefault("failure_mode", "raise")
    if records is not None:
        kw["on_record"] = records.append
    guard = Guard(replicas or [R1, R2], transport_factory=upstream.factory, instrumentation=None, **kw)
    # These tests count requests per replica: make every replica's cost a tie, so calls take turns
    # whatever the mock's sub-millisecond timing noise says about their speed.
    guard._replica_set.router.TIE_SECONDS = 60.0
    return guard


def record_of(response: httpx.Response) -> PhaseRecord:
    record = response.extensions["llmguard"]
    assert isinstance(record, PhaseRecord)
    return record


def refuse(replica: str, request: httpx.Request, n: int) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


# --- routing: origin, path, query, body, headers -------------------------------------------------------


async def test_origin_is_rewritten_to_a_configured_replica_keeping_path_query_and_body() -> None:
    upstream = Upstream()
    raw = json.dumps(BODY).encode()
    async with make_guard(upstream, [R1, R2 + "/prefix"]) as guard, guard.http_client() as client:
        for origin in ("http://api.example.com", R1, R2):
            for _ in range(2):  # round-robin: both replicas see the first two origins
                response = await client.post(
                    origin + CHAT + "?api-version=2024-06-01&x=a%26b",
                    content=raw,
                    headers={"content-type": "application/json", "x-trace": "t1"},
                )
                assert response.status_code == 200 and response.json() == COMPLETION
    assert len(upstream.seen) == 6
    for name, request in upstream.seen:
        assert request.url.host in ("r1.test", "r2.test")
        assert name.startswith(f"{request.url.scheme}://{request.url.host}:{request.url.port}")
        assert request.headers["host"] == f"{request.url.host}:{request.url.port}"
        assert request.url.query == b"api-version=2024-06-01&x=a%26b"
        assert request.content == raw and request.headers["content-length"] == str(len(raw))
        assert request.headers["x-trace"] == "t1"
    assert [r.url.path for r in upstream.to(R1)] == [CHAT, CHAT]
    # R2's base carries a prefix: a request under a replica's base or on another origin lands under it; one on
    # R2's own origin outside its base keeps its path, and goes to R2 only (it means nothing elsewhere).
    assert [r.url.path for r in upstream.to(R2 + "/prefix")] == ["/prefix" + CHAT] * 2 + [CHAT] * 2


async def test_a_request_under_a_replica_prefix_is_moved_under_the_other_prefix() -> None:
    upstream = Upstream()
    async with make_guard(upstream, [R1 + "/a/v1", R2 + "/b/v1"]) as guard, guard.http_client() as client:
        for _ in range(2):
            await client.post(R1 + "/a/v1/chat/completions", json=BODY)
    assert sorted(str(r.url) for _, r in upstream.seen) == [
        R1 + "/a/v1/chat/completions",
        R2 + "/b/v1/chat/completions",
    ]


async def test_per_replica_headers_go_only_to_that_replica_and_never_into_records() -> None:
    upstream = Upstream()
    records: list[PhaseRecord] = []
    replicas: list[str | Replica] = [
        Replica(R1),
        Replica(R2, headers={"authorization": "Bearer B", "x-replica-key": "key-for-b"}),
    ]
    async with make_guard(upstream, replicas, records) as guard, guard.http_client() as client:
        for _ in range(4):
            await client.post(R1 + CHAT, json=BODY, headers={"Authorization": "Bearer caller"})
    to_r1, to_r2 = upstream.to(R1), upstream.to(R2)
    assert len(to_r1) == len(to_r2) == 2
    for request in to_r1:
        assert request.headers.get_list("authorization") == ["Bearer caller"]
        assert "x-replica-key" not in request.headers
    for request in to_r2:
        assert request.headers.get_list("authorization") == ["Bearer B"]  # replaced, not duplicated
        assert request.headers["x-replica-key"] == "key-for-b"
    dumped = json.dumps([r.to_dict() for r in records], default=str)
    for secret in ("Bearer B", "key-for-b", "Bearer caller", "secret prompt"):
        assert secret not in dumped
    assert {r.replica for r in records} == {R1, R2}


async def test_per_replica_headers_follow_a_retry_to_the_other_replica() -> None:
    def respond(replica: str, request: httpx.Request, n: int) -> httpx.Response:
        return httpx.Response(500, json={"error": "boom"}) if n == 1 else httpx.Response(200, json=COMPLETION)

    upstream = Upstream(respond)
    replicas: list[str | Replica] = [Replica(R1, headers={"authorization": "Bearer A"}), Replica(R2)]
    async with make_guard(upstream, replicas) as guard, guard.http_client() as client:
        response = await client.post(R1 + CHAT, json=BODY, headers={"authorization": "Bearer caller"})
    assert response.status_code == 200
    (first_name, first), (second_name, second) = upstream.seen
    assert (first_name, first.headers["authorization"]) == (R1, "Bearer A")
    assert (second_name, second.headers["authorization"]) == (R2, "Bearer caller")


# --- tiers ------------------------------------------------------------------------------------------------


async def test_tier_header_is_stripped_and_selects_the_tier() -> None:
    upstream = Upstream()
    async with make_guard(upstream) as guard, guard.http_client() as client:
        batch = await client.post(R1 + CHAT, json=BODY, headers={"X-LLMGuard-Tier": " batch "})
        default = await client.post(R1 + CHAT, json=BODY)
    assert record_of(batch).tier == "batch"
    assert record_of(default).tier == "interactive"
    for _, request in upstream.seen:
        assert "x-llmguard-tier" not in request.headers


async def test_guard_tier_context_selects_the_tier_and_the_header_still_wins() -> None:
    upstream = Upstream()
    async with make_guard(upstream) as guard, guard.http_client() as client:
        with guard.tier("batch"):
            inside = await client.post(R1 + CHAT, json=BODY)
            overridden = await client.post(R1 + CHAT, json=BODY, headers={"x-llmguard-tier": "interactive"})
        after = await client.post(R1 + CHAT, json=BODY)
    assert [record_of(r).tier for r in (inside, overridden, after)] == ["batch", "interactive", "interactive"]


async def test_unknown_tier_header_raises_naming_the_configured_tiers() -> None:
    upstream = Upstream()
    async with make_guard(upstream) as guard, guard.http_client() as client:
        with pytest.raises(UnknownTierError) as info:
            await client.post(R1 + CHAT, json=BODY, headers={"x-llmguard-tier": "premium"})
    message = str(info.value)
    assert "'premium'" in message and "batch, interactive" in message
    assert isinstance(info.value, GuardConfigError)
    assert upstream.seen == []


# --- failure modes -------------------------------------------------------------------------------------


async def test_raise_mode_every_attempt_fails_without_an_answer() -> None:
    upstream = Upstream(refuse)
    records: list[PhaseRecord] = []
    async with make_guard(upstream, records=records, failure_mode="raise") as guard, guard.http_client() as client:
        with pytest.raises(AllAttemptsFailed) as info:
            await client.post(R1 + CHAT, json=BODY)
    error = info.value
    assert isinstance(error, AllAttemptsFailedToConnect) and isinstance(error, httpx.ConnectError)
    assert error.cause == "all_attempts_failed" and error.status_code == 502
    assert isinstance(error.__cause__, httpx.ConnectError)
    assert "tier 'interactive'" in error.message and "3 attempt(s)" in error.message
    assert error.record is records[0]
    assert [a.kind for a in records[0].attempts] == ["primary", "retry", "retry"]
    assert all(a.outcome == "failed" and a.error == "connect_error" for a in records[0].attempts)
    assert records[0].status == "error" and records[0].cause == "all_attempts_failed"
    assert len(upstream.seen) == 3


async def test_every_attempt_failing_to_connect_is_raised_in_response_mode_too() -> None:
    """What the attempts met is the caller's error in every mode: an SDK raises its connection error, as for a
    plain client whose server refuses the connection, not a 502 the server never sent."""
    upstream = Upstream(refuse)
    records: list[PhaseRecord] = []
    async with make_guard(upstream, records=records, failure_mode="response") as guard, guard.http_client() as c:
        with pytest.raises(AllAttemptsFailedToConnect) as info:
            await c.post(R1 + CHAT, json=BODY, headers={"x-llmguard-tier": "batch"})
    message = info.value.message
    assert "tier 'batch'" in message and "3 attempt(s)" in message and "connect_error" in message
    assert R1 in message and R2 in message
    assert records[0].http_status is None and records[0].cause == "all_attempts_failed"


async def test_attempts_failing_in_different_ways_are_no_connect_error() -> None:
    def refuse_then_reset(replica: str, request: httpx.Request, n: int) -> httpx.Response:
        if n == 1:
            raise httpx.ConnectError("connection refused", request=request)
        raise httpx.ReadError("connection reset", request=request)

    async with make_guard(Upstream(refuse_then_reset)) as guard, guard.http_client() as client:
        with pytest.raises(AllAttemptsFailed) as info:
            await client.post(R1 + CHAT, json=BODY)
    assert not isinstance(info.value, httpx.ConnectError) and isinstance(info.value, httpx.TransportError)
    assert isinstance(info.value.__cause__, httpx.ReadError)


async def call_while_the_only_slot_is_held(client: httpx.AsyncClient, headers: dict[str, str]) -> httpx.Response:
    """A second call of the tier while a first holds its only slot: refused before anything is sent."""
    async with client.stream("POST", R1 + CHAT, json=BODY) as first:
        try:
            with anyio.fail_after(2):
                return await client.post(R1 + CHAT, json=BODY, headers=headers)
        finally:
            await first.aread()


ONE_SLOT = {"interactive": Bulkhead(max_in_flight=1, max_waiting=0)}


@pytest.mark.parametrize(
    ("headers", "responds"),
    [
        ({"x-stainless-lang": "python", "x-stainless-retry-count": "0"}, True),
        ({"x-stainless-retry-count": "0"}, True),
        ({"X-Stainless-Lang": "python"}, True),
        ({"X-Fern-Language": "Python", "X-Fern-SDK-Name": "cohere"}, False),
        ({"x-goog-api-client": "google-genai-sdk/1.0 gl-python/3.11"}, True),
        ({"user-agent": "mistral-client-python/3.7.0"}, True),
        ({"user-agent": "unknown/None; hf_hub/2.4.0; python/3.11.7"}, True),
        ({}, False),
        ({"user-agent": "AsyncOpenAI/Python"}, False),
        ({"user-agent": "my-app/1.0 (mistral-client-python/3.7.0)"}, False),
    ],
    ids=[
        "stainless_headers",
        "one_stainless_header",
        "any_case",
        "cohere",
        "google_genai",
        "mistralai",
        "huggingface_hub",
        "plain",
        "openai_user_agent_only",
        "an_agent_naming_an_sdk_after_its_own",
    ],
)
async def test_auto_mode_answers_a_refusal_iff_the_request_comes_from_an_sdk_raising_its_own_errors(
    headers: dict[str, str], responds: bool
) -> None:
    """An SDK turns an HTTP answer into its own error (a 503 into mistralai's ``SDKError(503)``, huggingface_hub's
    ``HfHubHTTPError``), as it would the server's: raised as the guard's transport error, its caller's ``except``
    missed it. Plain httpx, whose caller may catch transport errors, gets the guard's, and so does cohere, which
    retries every 429 and 5xx answered to it (a full bulkhead's refusal took 3 s, not none)."""
    upstream = Upstream()
    async with make_guard(upstream, failure_mode="auto", bulkheads=ONE_SLOT) as guard, guard.http_client() as c:
        if responds:
            response = await call_while_the_only_slot_is_held(c, headers)
            assert response.status_code == 503
            assert response.headers["x-llmguard-cause"] == "bulkhead_full"
        else:
            with pytest.raises(BulkheadFull):
                await call_while_the_only_slot_is_held(c, headers)
    assert len(upstream.seen) == 1


async def test_a_server_answer_is_handed_back_marked_no_retry_even_in_raise_mode() -> None:
    def respond(replica: str, request: httpx.Request, n: int) -> httpx.Response:
        return httpx.Response(503, json={"error": {"message": f"overloaded {n}"}}, headers={"x-upstream": "yes"})

    upstream = Upstream(respond)
    retry = RetryPolicy(backoff_initial=0.001, backoff_max=0.005, overload_cooldown=0.005)  # not a 1 s wait per 503
    async with make_guard(upstream, failure_mode="raise", retry=retry) as guard, guard.http_client() as client:
        response = await client.post(R1 + CHAT, json=BODY)
    # A server answered: even in raise mode the caller gets that answer, not an exception.
    assert response.status_code == 503
    assert response.json() == {"error": {"message": "overloaded 3"}}
    assert response.headers["x-upstream"] == "yes"
    assert response.headers["x-should-retry"] == "false"
    assert len(upstream.seen) == 3


@pytest.mark.parametrize(
    ("path", "status"),
    [("/v1/embeddings", 500), ("/v1/embeddings", 503), ("/v1/embeddings", 429), (CHAT, 409), (CHAT, 522)],
    ids=["embeddings-500", "embeddings-503", "embeddings-429", "chat-409", "chat-522"],
)
async def test_an_answer_the_guard_does_not_retry_is_left_to_the_sdk(path: str, status: int) -> None:
    """Off the generation paths (embeddings, files, ...) the guard retries connect errors only, and on them it
    retries `RetryPolicy.retry_statuses`: any other answer an SDK retries (409, a gateway's 52x, a 5xx off the
    generation paths) is the SDK's to retry, as without a guard, so it is not marked ``x-should-retry: false``."""
    upstream = Upstream(lambda replica, request, n: httpx.Response(status, json={"error": {"message": "busy"}}))
    sdk = {"x-stainless-lang": "python", "x-stainless-retry-count": "0"}
    async with make_guard(upstream, failure_mode="auto") as guard, guard.http_client() as client:
        response = await client.post(R1 + path, json={"model": "m", "input": "hi"}, headers=sdk)
    assert response.status_code == status and len(upstream.seen) == 1  # the guard sent it once
    assert "x-should-retry" not in response.headers


# --- retries -------------------------------------------------------------------------------------------


async def test_a_400_is_returned_once_not_retried() -> None:
    def respond(replica: str, request: httpx.Request, n: int) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "bad request", "code": "invalid"}})

    upstream = Upstream(respond)
    records: list[PhaseRecord] = []
    async with make_guard(upstream, records=records) as guard, guard.http_client() as client:
        response = await client.post(R1 + CHAT, json=BODY)
    assert response.status_code == 400
    assert response.json() == {"error": {"message": "bad request", "code": "invalid"}}
    assert len(upstream.seen) == 1
    assert [(a.kind, a.outcome, a.error) for a in records[0].attempts] == [("primary", "failed", "http_400")]
    assert records[0].status == "http_error" and records[0].http_status == 400


async def test_a_500_then_200_is_retried() -> None:
    def respond(replica: str, request: httpx.Request, n: int) -> httpx.Response:
        return httpx.Response(500, text="oops") if n == 1 else httpx.Response(200, json=COMPLETION)

    upstream = Upstream(respond)
    records: list[PhaseRecord] = []
    async with make_guard(upstream, records=records) as guard, guard.http_client() as client:
        response = await client.post(R1 + CHAT, json=BODY)
    assert response.status_code == 200 and response.json() == COMPLETION
    attempts = records[0].attempts
    assert [a.kind for a in attempts] == ["primary", "retry"]
    assert [(a.outcome, a.status_code) for a in attempts] == [("failed", 500), ("won", 200)]
    assert attempts[0].replica != attempts[1].replica  # the retry went to the other replica
    assert records[0].status == "ok" and records[0].retried
    assert (records[0].prompt_tokens, records[0].completion_tokens) == (3, 1)
    assert records[0].finish_reasons == ("stop",) and records[0].response_id == "chatcmpl-1"
    assert "x-should-retry" not in response.headers
    first, second = (request.content for _, request in upstream.seen)
    assert first == second and json.loads(first) == BODY


async def test_no_retry_when_retry_is_off() -> None:
    def respond(replica: str, request: httpx.Request, n: int) -> httpx.Response:
        return httpx.Response(500, text="oops")

    upstream = Upstream(respond)
    records: list[PhaseRecord] = []
    async with make_guard(upstream, records=records, retry=None) as guard, guard.http_client() as client:
        response = await client.post(R1 + CHAT, json=BODY)
    assert response.status_code == 500 and response.text == "oops"
    assert len(upstream.seen) == 1 and len(records[0].attempts) == 1
    # Retries off: the caller's own SDK may retry, so the answer is not marked no-retry.
    assert "x-should-retry" not in response.headers


class EndlessErrorBody(httpx.AsyncByteStream):
    """An error answer's body that never ends: what the guard read of it, and whether it was closed."""

    CHUNK = 16 * 1024

    def __init__(self) -> None:
        self.read = 0
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            self.read += self.CHUNK
            yield b"x" * self.CHUNK

    async def aclose(self) -> None:
        self.closed = True


async def test_a_retried_error_answer_is_read_to_its_limit_and_closed_before_the_retry() -> None:
    bodies: list[EndlessErrorBody] = []

    def respond(replica: str, request: httpx.Request, n: int) -> httpx.Response:
        if n > 1:
            return httpx.Response(200, json=COMPLETION)
        bodies.append(EndlessErrorBody())
        return httpx.Response(500, stream=bodies[-1])

    async with make_guard(Upstream(respond)) as guard, guard.http_client() as client:
        async with client.stream("POST", R1 + CHAT, json=BODY) as response:  # the call is live until it is closed
            assert response.status_code == 200
            assert bodies[0].closed and bodies[0].read <= ERROR_BODY_LIMIT + EndlessErrorBody.CHUNK


async def test_the_last_error_answer_is_read_on_by_the_caller_and_closed_when_the_caller_closes_it() -> None:
    bodies: list[EndlessErrorBody] = []

    def respond(replica: str, request: httpx.Request, n: int) -> httpx.Response:
        bodies.append(EndlessErrorBody())
        return httpx.Response(500, stream=bodies[-1])

    async with make_guard(Upstream(respond)) as guard, guard.http_client() as client:
        async with client.stream("POST", R1 + CHAT, json=BODY) as response:
            assert response.status_code == 500 and len(bodies) == 3  # three attempts: the last one's answer
            assert [b.closed for b in bodies] == [True, True, False]
            assert all(b.read <= ERROR_BODY_LIMIT + EndlessErrorBody.CHUNK for b in bodies)
            read = 0
            async for chunk in response.aiter_raw():
                read += len(chunk)
                if read > 4 * ERROR_BODY_LIMIT:
                    break
        assert bodies[-1].closed and bodies[-1].read >= read


class DrippingErrorBody(EndlessErrorBody):
    """An error answer's body past the guard's limit at once, then a byte every ``gap`` seconds."""

    def __init__(self, gap: float) -> None:
        super().__init__()
        self.gap = gap

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.read <= ERROR_BODY_LIMIT:
            self.read += self.CHUNK
            yield b"x" * self.CHUNK
        while True:
            await anyio.sleep(self.gap)
            self.read += 1
            yield b"x"


@BACKENDS
@pytest.mark.parametrize(("gap", "error"), [(0.1, TotalTimeout), (20.0, StallTimeout)])
def test_the_rest_of_a_dripped_error_answer_is_read_within_the_calls_deadlines(
    backend: str, gap: float, error: type[Exception]
) -> None:
    """The caller reads the rest of a long error answer from the server: a server that drips it ends in the call's
    total deadline (10 s; a byte every 0.1 s is no stall) or its stall limit (5 s), as a dripping stream does,
    with the connection closed; not in the client's read timeout, minutes later."""
    bodies: list[DrippingErrorBody] = []

    def respond(replica: str, request: httpx.Request, n: int) -> httpx.Response:
        bodies.append(DrippingErrorBody(gap))
        return httpx.Response(400, stream=bodies[-1])  # not retried: the caller gets this answer

    async def main() -> None:
        async with make_guard(Upstream(respond)) as guard, guard.http_client() as client:
            start = anyio.current_time()
            async with client.stream("POST", R1 + CHAT, json=BODY) as response:
                assert response.status_code == 400
                with pytest.raises(error):
                    await response.aread()
            assert anyio.current_time() - start == pytest.approx(10.0 if error is TotalTimeout else 5.0, abs=0.2)
        assert len(bodies) == 1 and bodies[0].closed

    run_virtual(main, backend)


async def test_a_hedge_round_closes_a_failed_attempts_long_error_answer_when_another_attempt_wins() -> None:
    failed = anyio.Event()
    body = EndlessErrorBody()
    seen: list[httpx.Request] = []

    async def respond(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:  # the primary: its answer waits until the hedge has failed
            await failed.wait()
            data = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=data)
        failed.set()
        return httpx.Response(500, stream=body)

    def factory(replica: Replica) -> httpx.AsyncBaseTransport:
        return httpx.MockTransport(respond)

    records: list[PhaseRecord] = []
    hedge = HedgePolicy(delay=0.01, min_delay=0.01)
    async with (
        Guard(
            [R1, R2],
            tiers=TIERS,
            hedge=hedge,
            transport_factory=factory,
            instrumentation=None,
            on_record=records.append,
        ) as guard,
        guard.http_client() as client,
        client.stream("POST", R1 + CHAT, json={**BODY, "stream": True}) as response,
    ):
        assert response.status_code == 200 and len(seen) == 2
        assert body.closed and body.read <= ERROR_BODY_LIMIT + EndlessErrorBody.CHUNK
    assert [(a.kind, a.outcome) for a in records[0].attempts] == [("primary", "won"), ("hedge", "failed")]


# --- rollout and cohorts ------------------------------------------------------------------------------------


def server_error(replica: str, request: httpx.Request, n: int) -> httpx.Response:
    return httpx.Response(500, json={"error": {"message": "upstream boom"}}, headers={"x-upstream": "1"})


async def test_rollout_zero_is_the_control_cohort_one_attempt_answer_untouched() -> None:
    upstream = Upstream(server_error)
    records: list[PhaseRecord] = []
    async with make_guard(upstream, records=records, rollout=0.0) as guard, guard.http_client() as client:
        response = await client.post(R1 + CHAT, json=BODY, headers={"x-stainless-lang": "python"})
    assert records[0].cohort == "control"
    assert len(upstream.seen) == 1 and len(records[0].attempts) == 1
    assert response.status_code == 500
    assert response.json() == {"error": {"message": "upstream boom"}}
    assert response.headers["x-upstream"] == "1"
    assert "x-should-retry" not in response.headers


async def test_control_cohort_success_is_passed_through() -> None:
    upstream = Upstream()
    records: list[PhaseRecord] = []
    async with make_guard(upstream, records=records, rollout=0.0) as guard, guard.http_client() as client:
        response = await client.post(R1 + CHAT, json=BODY)
    assert response.status_code == 200 and response.json() == COMPLETION
    assert records[0].cohort == "control" and records[0].status == "ok"


async def test_control_cohort_transport_error_is_raised_as_is() -> None:
    upstream = Upstream(refuse)
    async with make_guard(upstream, rollout=0.0, failure_mode="response") as guard, guard.http_client() as client:
        with pytest.raises(httpx.ConnectError) as info:
            await client.post(R1 + CHAT, json=BODY)
    assert not isinstance(info.value, AllAttemptsFailed)
    assert len(upstream.seen) == 1


async def test_control_cohort_error_answer_carries_no_guard_header() -> None:
    upstream = Upstream(server_error)
    async with make_guard(upstream, rollout=0.0) as guard, guard.http_client() as client:
        response = await client.post(R1 + CHAT, json=BODY)
    assert "x-llmguard-cause" not in response.headers


async def test_cohort_header_pins_the_guarded_cohort() -> None:
    upstream = Upstream(server_error)
    records: list[PhaseRecord] = []
    # rollout=0.0 is "off" (the pin is ignored then: tests/rollout/test_rollout.py); any fraction > 0 honours it.
    async with make_guard(upstream, records=records, rollout=0.001) as guard, guard.http_client() as client:
        response = await client.post(R1 + CHAT, json=BODY, headers={"x-llmguard-cohort": "guarded"})
    assert records[0].cohort == "guarded"
    assert len(records[0].attempts) == 3  # guarded: retried
    assert response.headers["x-should-retry"] == "false"
    assert all("x-llmguard-cohort" not in request.headers for _, request in upstream.seen)


async def test_cohort_header_pins_the_control_cohort() -> None:
    upstream = Upstream(server_error)
    records: list[PhaseRecord] = []
    async with make_guard(upstream, records=records, rollout=1.0) as guard, guard.http_client() as client:
        await client.post(R1 + CHAT, json=BODY, headers={"X-LLMGuard-Cohort": " Control "})
    assert records[0].cohort == "control" and len(records[0].attempts) == 1
    assert "x-llmguard-cohort" not in upstream.seen[0][1].headers


async def test_bad_cohort_header_is_a_request_error() -> None:
    upstream = Upstream()
    async with make_guard(upstream) as guard, guard.http_client() as client:
        with pytest.raises(GuardRequestError, match="guarded, control"):
            await client.post(R1 + CHAT, json=BODY, headers={"x-llmguard-cohort": "treatment"})
    assert upstream.seen == []


# --- bulkhead -----------------------------------------------------------------------------------------------


async def test_bulkhead_rejects_a_second_concurrent_call_and_frees_the_slot_after_the_body() -> None:
    upstream = Upstream()
    records: list[PhaseRecord] = []
    bulkheads = {"interactive": Bulkhead(max_in_flight=1, max_waiting=0)}
    async with make_guard(upstream, records=records, bulkheads=bulkheads) as guard, guard.http_client() as client:
        first = await client.send(client.build_request("POST", R1 + CHAT, json=BODY), stream=True)
        assert first.status_code == 200  # headers in hand, body not read: the slot is still held
        with anyio.fail_after(2), pytest.raises(BulkheadFull) as info:  # at once, not queued
            await client.post(R1 + CHAT, json=BODY)
        assert isinstance(info.value, httpx.TransportError)
        assert "'interactive'" in info.value.message and "1 call(s) in flight" in info.value.message
        assert len(upstream.seen) == 1  # rejected before any attempt
        other_tier = await client.post(R1 + CHAT, json=BODY, headers={"x-llmguard-tier": "batch"})
        assert other_tier.status_code == 200  # the bulkhead is per tier
        await first.aread()
        third = await client.post(R1 + CHAT, json=BODY)
        assert third.status_code == 200
    statuses = [(r.tier, r.status, r.cause) for r in records]
    assert ("interactive", "rejected", "bulkhead_full") in statuses
    assert statuses.count(("interactive", "ok", None)) == 2


async def test_bulkhead_full_is_a_503_in_response_mode() -> None:
    upstream = Upstream()
    async with make_guard(upstream, bulkheads=ONE_SLOT, failure_mode="response") as guard, guard.http_client() as c:
        second = await call_while_the_only_slot_is_held(c, {})
        assert (await c.post(R1 + CHAT, json=BODY)).status_code == 200
    assert second.status_code == 503
    assert second.headers["x-llmguard-cause"] == "bulkhead_full"
    assert second.headers["x-should-retry"] == "false"
    assert second.headers["content-type"] == "application/json"
    error = second.json()["error"]
    assert {"message", "type", "code"} <= set(error)
    assert error["code"] == "bulkhead_full" and error["type"] == "llmguard_error"
    assert "'interactive'" in error["message"]
    assert record_of(second).http_status == 503


async def test_bulkhead_slot_is_freed_when_a_streamed_body_is_closed_early() -> None:
    def sse(replica: str, request: httpx.Request, n: int) -> httpx.Response:
        events = [{"choices": [{"delta": {"content": f"t{i}"}}]} for i in range(3)]
        body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    upstream = Upstream(sse)
    records: list[PhaseRecord] = []
    bulkheads = {"interactive": Bulkhead(max_in_flight=1)}
    async with make_guard(upstream, records=records, bulkheads=bulkheads) as guard, guard.http_client() as client:
        async with client.stream("POST", R1 + CHAT, json={**BODY, "stream": True}) as first:
            assert first.status_code == 200
        second = await client.post(R1 + CHAT, json={**BODY, "stream": True})
        assert b"data: [DONE]" in second.content
    assert (records[0].status, records[0].cause) == ("abandoned", "closed_by_caller")
    assert records[1].status == "ok" and records[1].stream and records[1].first_token is not None


# --- lifecycle and callbacks -------------------------------------------------------------------------------


async def test_a_closed_guard_refuses_requests() -> None:
    upstream = Upstream()
    guard = make_guard(upstream)
    async with guard.http_client() as client:
        assert (await client.post(R1 + CHAT, json=BODY)).status_code == 200
        await guard.aclose()
        with pytest.raises(GuardClosed, match="Guard is closed"):
            await client.post(R1 + CHAT, json=BODY)
        await guard.aclose()  # idempotent
    assert len(upstream.seen) == 1


@pytest.mark.parametrize("rollout", [1.0, 0.0], ids=["guarded", "control"])
async def test_on_record_raising_does_not_break_the_call_and_is_logged_once(
    caplog: pytest.LogCaptureFixture, rollout: float
) -> None:
    """A callback with a bug is called at the end of every call: its traceback is logged the first time only (an
    app that configures no logging would otherwise print one to stderr per call)."""
    calls: list[PhaseRecord] = []

    def broken(record: PhaseRecord) -> None:
        calls.append(record)
        raise ValueError("callback bug")

    upstream = Upstream()
    caplog.set_level(logging.ERROR, logger="llmguard_client")
    async with make_guard(upstream, on_record=broken, rollout=rollout) as guard, guard.http_client() as client:
        responses = [await client.post(R1 + CHAT, json=BODY) for _ in range(3)]
    assert [r.status_code for r in responses] == [200] * 3
    assert responses[0].json() == COMPLETION
    assert len(calls) == 3 and calls[0].status == "ok"
    logged = [r for r in caplog.records if "on_record" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None


async def test_record_facts_from_the_request_and_response() -> None:
    upstream = Upstream()
    records: list[PhaseRecord] = []
    async with make_guard(upstream, records=records) as guard, guard.http_client() as client:
        response = await client.post(R1 + CHAT, json=BODY)
    (record,) = records
    assert record is record_of(response)
    assert (record.model, record.stream, record.max_tokens, record.method, record.path) == (
        "m-1",
        False,
        16,
        "POST",
        CHAT,
    )
    assert record.start <= record.queued <= record.first_token <= record.finish  # type: ignore[operator]


# --- respx: mocking below the guard's own transports -------------------------------------------------------


@pytest.fixture
def respx_guard() -> Callable[..., Guard]:
    def build(replicas: list[str | Replica] | None = None, **kw: Any) -> Guard:
        kw.setdefault("tiers", TIERS)
        kw.setdefault("hedge", None)
        kw.setdefault("retry", FAST_RETRY)
        kw.setdefault("failure_mode", "raise")
        return Guard(replicas or [R1, R2], instrumentation=None, **kw)  # default transports: real httpx pools

    return build


async def test_respx_routes_by_replica_and_the_retry_layer_runs(respx_guard: Callable[..., Guard]) -> None:
    records: list[PhaseRecord] = []
    replicas: list[str | Replica] = [Replica(R1), Replica(R2, headers={"authorization": "Bearer B"})]
    async with respx.mock(assert_all_called=False) as router:
        r1 = router.post(R1 + CHAT).mock(return_value=httpx.Response(500, text="r1 down"))
        r2 = router.post(R2 + CHAT).mock(return_value=httpx.Response(200, json=COMPLETION))
        async with respx_guard(replicas, on_record=records.append) as guard, guard.http_client() as client:
            response = await client.post(
                "http://api.example.com" + CHAT + "?v=1", json=BODY, headers={"x-llmguard-tier": "batch"}
            )
        # router.calls is reset when the mock exits: inspect it inside.
        assert len(router.calls) == 2
        for call in router.calls:
            assert call.request.url.host in ("r1.test", "r2.test")
            assert call.request.url.query == b"v=1"
            assert "x-llmguard-tier" not in call.request.headers
            assert json.loads(call.request.content) == BODY
        assert r2.calls.last.request.headers["authorization"] == "Bearer B"
        assert "authorization" not in r1.calls.last.request.headers
    assert response.status_code == 200 and response.json() == COMPLETION
    assert r1.call_count == 1 and r2.call_count == 1
    assert [a.kind for a in records[0].attempts] == ["primary", "retry"]
    assert records[0].tier == "batch"


async def test_respx_connect_errors_on_every_replica_in_response_mode(respx_guard: Callable[..., Guard]) -> None:
    async with respx.mock() as router:
        r1 = router.post(R1 + CHAT).mock(side_effect=httpx.ConnectError)
        r2 = router.post(R2 + CHAT).mock(side_effect=httpx.ConnectError)
        async with respx_guard(failure_mode="response") as guard, guard.http_client() as client:
            with pytest.raises(AllAttemptsFailedToConnect) as info:
                await client.post(R1 + CHAT, json=BODY)
    assert info.value.cause == "all_attempts_failed"
    assert r1.call_count + r2.call_count == 3 and r1.call_count >= 1 and r2.call_count >= 1
    assert "tier 'interactive'" in info.value.message


async def test_respx_a_400_is_not_retried(respx_guard: Callable[..., Guard]) -> None:
    async with respx.mock() as router:
        route = router.post(R1 + CHAT).mock(return_value=httpx.Response(400, json={"error": {"message": "no"}}))
        async with respx_guard([R1]) as guard, guard.http_client() as client:
            response = await client.post(R1 + CHAT, json=BODY)
    assert response.status_code == 400 and route.call_count == 1


async def test_respx_streaming_first_token_and_usage(respx_guard: Callable[..., Guard]) -> None:
    chunks = [
        {"id": "c1", "model": "m-1", "choices": [{"delta": {"role": "assistant"}, "finish_reason": None}]},
        {"id": "c1", "model": "m-1", "choices": [{"delta": {"content": "Hi"}, "finish_reason": None}]},
        {"id": "c1", "model": "m-1", "choices": [{"delta": {}, "finish_reason": "stop"}]},
        {"id": "c1", "model": "m-1", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}},
    ]
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    records: list[PhaseRecord] = []
    async with respx.mock() as router:
        router.post(R1 + CHAT).mock(
            return_value=httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)
        )
        async with (
            respx_guard([R1], on_record=records.append) as guard,
            guard.http_client() as client,
            client.stream("POST", R1 + CHAT, json={**BODY, "stream": True}) as response,
        ):
            got = await response.aread()
    assert got == body  # replayed byte for byte
    (record,) = records
    assert record.status == "ok" and record.stream and record.first_token is not None
    assert (record.prompt_tokens, record.completion_tokens) == (9, 2)
    assert record.finish_reasons == ("stop",) and record.response_id == "c1"
