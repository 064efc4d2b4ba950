"""The core request path against real loopback servers, through plain httpx and the real openai SDK."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, MutableMapping
from typing import Any, Literal

import anyio
import httpx
import openai
import pytest

from llmguard_client import (
    Bulkhead,
    BulkheadFull,
    Guard,
    GuardClosed,
    GuardFailure,
    PhaseRecord,
    Replica,
    RetryPolicy,
    StallTimeout,
    Tier,
    TotalTimeout,
    TTFTTimeout,
    UnknownTierError,
    guard_failure,
)
from llmguard_client._routing.router import Router
from llmguard_client._stream.body import GuardBody
from llmguard_client.telemetry.hooks import CallObservation, LiveAttempt, LiveCall
from tests.clients import plain_httpx
from tests.loopback import LoopbackCluster, LoopbackServer, Script
from tests.virtual import BACKENDS, ConnectsInANursery, FakeReplica, Plan, run_virtual, virtual_guard

CHAT = "/v1/chat/completions"
STREAM_BODY: dict[str, Any] = {
    "model": "test-model",
    "messages": [{"role": "user", "content": "secret prompt text"}],
    "stream": True,
    "stream_options": {"include_usage": True},
}
SERVER_PAUSE = 5.0
"""How long a server scripted to stall holds back. The deadlines that must fire here are 0.3-0.6 s, an order of
magnitude shorter, and these tests only tell apart "the deadline fired" (never early, and well before the
server's pause would have ended) from "the call waited for the server": a busy machine stretches the first by
seconds without confusing the two. The exact instants are asserted in virtual time (tests/layers/test_deadline.py)
and the real-time accuracy (within 3-4 ms of the limit) is measured by benchmarks/deadline_accuracy.py."""


def make_guard(servers: list[LoopbackServer], records: list[PhaseRecord], **kwargs: Any) -> Guard:
    # Limits no test here means to reach: a busy machine delaying a first token by seconds must not time a call out
    # (a 1 s ttft once turned an abandoned stream into a timeout under a full suite).
    kwargs.setdefault("tiers", {"interactive": Tier(ttft=10, total=30, stall=10), "batch": Tier(ttft=20, total=40)})
    kwargs.setdefault("instrumentation", None)
    kwargs.setdefault("hedge", None)
    return Guard(replicas=[s.url for s in servers], on_record=records.append, **kwargs)


async def direct_stream(url: str) -> bytes:
    async with plain_httpx() as client, client.stream("POST", url + CHAT, json=STREAM_BODY) as response:
        return b"".join([chunk async for chunk in response.aiter_raw()])


async def test_stream_is_replayed_byte_for_byte(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=20, gap=0.001)
    expected = await direct_stream(servers[0].url)
    servers[0].reset()
    servers[0].script = Script(tokens=20, gap=0.001)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        async with client.stream("POST", servers[0].url + CHAT, json=STREAM_BODY) as response:
            got = b"".join([chunk async for chunk in response.aiter_raw()])
    # Identical apart from the per-response "created" timestamp.
    assert got.replace(b'"created"', b"").count(b"data:") == expected.count(b"data:")
    assert [line[:60] for line in got.split(b"\n\n")] == [line[:60] for line in expected.split(b"\n\n")]
    assert records[0].status == "ok"


async def test_phase_record_fields_and_order(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=5, gap=0.005, stall_before_first=0.05)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        async with client.stream("POST", servers[0].url + CHAT, json=STREAM_BODY) as response:
            assert response.extensions["llmguard"].request_id
            await response.aread()
    (record,) = records
    assert record is response.extensions["llmguard"]
    assert record.tier == "interactive" and record.cohort == "guarded" and record.stream
    assert record.model == "test-model"
    assert record.start <= record.queued <= record.sent <= record.headers <= record.first_token <= record.finish  # type: ignore[operator]
    # The server holds the first token 50 ms after it got the request, so at least 50 ms after the call
    # started (the start is stamped before anything is sent; the sent and headers stamps can themselves run
    # late on a loaded machine, so neither is the reference here).
    assert record.first_token - record.start >= 0.049  # type: ignore[operator]
    assert (record.prompt_tokens, record.completion_tokens) == (7, 5)  # from the final usage chunk
    assert record.chunks == 7  # 5 content chunks, the finish chunk and the usage chunk
    assert record.status == "ok" and record.http_status == 200 and record.replica == servers[0].url
    assert record.finish_reasons == ("stop",) and record.response_id == "chatcmpl-test"
    assert len(record.attempts) == 1 and record.attempts[0].outcome == "won"


async def test_the_callers_trace_hook_sees_httpcores_events_and_the_attempt_is_stamped_sent(
    servers: list[LoopbackServer],
) -> None:
    events: list[str] = []

    async def trace(event: str, info: dict[str, Any]) -> None:
        events.append(event)

    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        response = await client.post(
            servers[0].url + CHAT, json={**STREAM_BODY, "stream": False}, extensions={"trace": trace}
        )
        assert response.status_code == 200
    (attempt,) = records[0].attempts
    assert attempt.start <= attempt.sent <= attempt.headers  # type: ignore[operator]
    assert "http11.send_request_body.complete" in events and "http11.receive_response_headers.complete" in events


async def test_usage_absent_when_not_requested(servers: list[LoopbackServer]) -> None:
    records: list[PhaseRecord] = []
    body = {**STREAM_BODY, "stream_options": {"include_usage": False}}
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        async with client.stream("POST", servers[0].url + CHAT, json=body) as response:
            await response.aread()
    assert records[0].prompt_tokens is None and records[0].completion_tokens is None


async def test_ttft_counts_content_not_bytes(servers: list[LoopbackServer]) -> None:
    """A role-only delta and keep-alive comments arrive at once, then the server stalls: ttft trips."""
    servers[0].script = Script(role_chunk=True, keepalives_before=3, stall_before_first=SERVER_PAUSE)
    records: list[PhaseRecord] = []
    tiers = {"fast": Tier(ttft=0.3, total=30.0, stall=10.0)}
    async with make_guard(servers[:1], records, tiers=tiers) as guard, guard.http_client() as client:
        started = time.monotonic()
        with pytest.raises(TTFTTimeout) as caught:
            await client.post(servers[0].url + CHAT, json=STREAM_BODY)
        elapsed = time.monotonic() - started
    assert isinstance(caught.value, httpx.TimeoutException)
    assert 0.3 <= elapsed < SERVER_PAUSE
    assert "ttft" in str(caught.value) and "'fast'" in str(caught.value)
    assert "asked for no stream" not in str(caught.value)
    assert records[0].status == "timeout" and records[0].cause == "ttft_timeout"
    assert records[0].attempts[0].headers is not None and records[0].attempts[0].first_token is None
    # The timed-out attempt's connection was closed: the server saw the disconnect.
    assert servers[0].wait_for(lambda: servers[0].disconnects == 1)


async def test_stall_deadline_after_first_token(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=5, stall_after_first=SERVER_PAUSE)
    records: list[PhaseRecord] = []
    tiers = {"t": Tier(ttft=10.0, total=30.0, stall=0.3)}
    async with make_guard(servers[:1], records, tiers=tiers) as guard, guard.http_client() as client:
        async with client.stream("POST", servers[0].url + CHAT, json=STREAM_BODY) as response:
            client_body: Any = getattr(response.stream, "_stream", None)  # httpx's wrapper around the client's
            body: Any = getattr(client_body, "_stream", None)  # the client's (its close ends it), around the guard's
            assert isinstance(body, GuardBody) and body._watchdog is not None  # asyncio, HTTP/1.1: one timer
            chunks: list[bytes] = []
            with pytest.raises(StallTimeout):
                async for chunk in response.aiter_raw():
                    chunks.append(chunk)
                    last = time.monotonic()
            stalled_for = time.monotonic() - last
    assert b" t0" in b"".join(chunks)
    assert 0.3 <= stalled_for < SERVER_PAUSE
    assert records[0].status == "timeout" and records[0].cause == "stall_timeout"
    assert servers[0].wait_for(lambda: servers[0].disconnects == 1)


async def test_total_deadline_mid_stream(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=600, gap=0.01)  # 6 s: six times the total deadline
    records: list[PhaseRecord] = []
    # ttft = total: a first token delayed by a busy machine still comes within ttft, and the cause stays "total".
    tiers = {"t": Tier(ttft=1.0, total=1.0, stall=1.0)}
    async with make_guard(servers[:1], records, tiers=tiers) as guard, guard.http_client() as client:
        started = time.monotonic()
        with pytest.raises(TotalTimeout) as caught:
            async with client.stream("POST", servers[0].url + CHAT, json=STREAM_BODY) as response:
                async for _ in response.aiter_raw():
                    pass
        elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 6.0
    assert "total deadline of tier 't' (1.0s" in str(caught.value)
    assert records[0].cause == "total_timeout"
    assert servers[0].wait_for(lambda: servers[0].disconnects == 1)


async def test_non_streaming_bounded_by_ttft(servers: list[LoopbackServer]) -> None:
    """An answer sent whole has its first token at its end: the ttft bounds it all, and the error says so."""
    servers[0].script = Script(hang_before_headers=SERVER_PAUSE)
    records: list[PhaseRecord] = []
    tiers = {"t": Tier(ttft=0.3, total=30.0)}
    async with make_guard(servers[:1], records, tiers=tiers) as guard, guard.http_client() as client:
        with pytest.raises(TTFTTimeout) as caught:
            await client.post(servers[0].url + CHAT, json={"model": "m", "messages": []})
    assert "asked for no stream, so its first token is its whole answer" in str(caught.value)
    assert servers[0].wait_for(lambda: servers[0].disconnects == 1)


async def test_tier_header_is_stripped_and_selects_the_tier(servers: list[LoopbackServer]) -> None:
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        response = await client.post(
            servers[0].url + CHAT, json={"model": "m", "messages": []}, headers={"x-llmguard-tier": "batch"}
        )
        assert response.status_code == 200
        with guard.tier("batch"):
            await client.post(servers[0].url + CHAT, json={"model": "m", "messages": []})
    assert [r.tier for r in records] == ["batch", "batch"]
    assert all("x-llmguard-tier" not in r.headers for r in servers[0].received)


async def test_unknown_tier_is_a_clear_error(servers: list[LoopbackServer]) -> None:
    async with make_guard(servers[:1], []) as guard, guard.http_client() as client:
        with pytest.raises(UnknownTierError, match="configured tiers: batch, interactive") as caught:
            await client.post(servers[0].url + CHAT, json={}, headers={"x-llmguard-tier": "gold"})
        with pytest.raises(UnknownTierError, match="'gold'"), guard.tier("gold"):
            pass
    assert isinstance(caught.value, GuardFailure) and guard_failure(caught.value) == "unknown_tier"
    assert servers[0].received == []


async def test_refused_calls_in_response_mode_are_answers_not_to_be_retried(servers: list[LoopbackServer]) -> None:
    guard = make_guard(servers[:1], [], failure_mode="response")
    async with guard.http_client() as client:  # a client handed out before the close
        async with guard:
            typo = await client.post(servers[0].url + CHAT, json={}, headers={"x-llmguard-tier": "gold"})
        closed = await client.post(servers[0].url + CHAT, json={})
    assert (typo.status_code, typo.headers["x-llmguard-cause"], typo.headers["x-should-retry"]) == (
        400,
        "unknown_tier",
        "false",
    )
    assert "'gold'" in typo.json()["error"]["message"] and typo.json()["error"]["code"] == "unknown_tier"
    assert (closed.status_code, closed.headers["x-llmguard-cause"], closed.headers["x-should-retry"]) == (
        503,
        "guard_closed",
        "false",
    )
    assert servers[0].received == []


async def test_routes_only_to_configured_replicas_with_their_own_headers(servers: list[LoopbackServer]) -> None:
    records: list[PhaseRecord] = []
    replicas = [Replica(servers[0].url, headers={"authorization": "Bearer key-A"}), servers[1].url]
    guard = Guard(replicas=replicas, hedge=None, instrumentation=None, on_record=records.append)
    async with guard, guard.http_client() as client:
        for _ in range(4):
            response = await client.post("http://llm.internal/v1/chat/completions", json={"model": "m"})
            assert response.status_code == 200
    assert len(servers[0].received) == 2 and len(servers[1].received) == 2
    assert all(r.headers["authorization"] == "Bearer key-A" for r in servers[0].received)
    assert all("authorization" not in r.headers for r in servers[1].received)
    assert all(r.headers["host"] == f"127.0.0.1:{servers[1].port}" for r in servers[1].received)
    assert "key-A" not in repr([r.to_dict() for r in records])


async def test_a_replica_setting_a_credential_drops_the_callers_others_carrying_the_same_key(
    servers: list[LoopbackServer],
) -> None:
    """openai 1.x's ``AzureOpenAI`` sends its key as ``api-key`` and as ``Authorization: Bearer``: a replica that
    sets its own ``api-key`` (as the Azure setup in the docs does) drops the caller's ``Authorization`` too when it
    carries the same key, and the reverse, so the client's key never reaches another resource (before: the Bearer
    header carried it there). A credential carrying another key (a gateway's user token beside the key) is kept, and
    a replica setting no credential gets the caller's."""
    replicas = [
        Replica(servers[0].url, headers={"api-key": "KEY-A"}),
        Replica(servers[1].url, headers={"Authorization": "Bearer KEY-B"}),
        servers[2].url,
    ]
    same = {"api-key": "KEY-C", "Authorization": "Bearer KEY-C", "x-api-key": "KEY-C"}
    gateway = {"api-key": "KEY-C", "Authorization": "Bearer USER-TOKEN"}
    for replica in replicas:  # each alone, so that each gets both callers' requests
        async with Guard(replicas=[replica], instrumentation=None) as guard, guard.http_client() as client:
            for kind, caller in (("same", same), ("gateway", gateway)):
                headers = {**caller, "x-kind": kind}
                response = await client.post(
                    "http://llm.internal/v1/chat/completions", json={"model": "m"}, headers=headers
                )
                assert response.status_code == 200
    expected = {  # (replica, the caller's kind): (api-key, authorization, x-api-key) it received
        (0, "same"): ("KEY-A", None, None),
        (0, "gateway"): ("KEY-A", "Bearer USER-TOKEN", None),
        (1, "same"): (None, "Bearer KEY-B", None),
        (1, "gateway"): ("KEY-C", "Bearer KEY-B", None),
        (2, "same"): ("KEY-C", "Bearer KEY-C", "KEY-C"),
        (2, "gateway"): ("KEY-C", "Bearer USER-TOKEN", None),
    }
    received = [(i, r) for i, server in enumerate(servers[:3]) for r in server.received]
    assert sorted((i, r.headers["x-kind"]) for i, r in received) == sorted(expected)
    for i, r in received:
        kind = r.headers["x-kind"]
        assert (r.headers.get("api-key"), r.headers.get("authorization"), r.headers.get("x-api-key")) == expected[
            i, kind
        ]


async def test_openai_streaming_and_non_streaming(servers: list[LoopbackServer]) -> None:
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard:
        oai = openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="sk-test", http_client=guard.http_client())
        stream = await oai.chat.completions.create(
            model="test-model",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == " t0 t1 t2 t3 t4"
        completion = await oai.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "x"}])
        assert completion.choices[0].message.content == "hello"
    assert [r.status for r in records] == ["ok", "ok"]
    assert records[0].completion_tokens == 5 and records[1].completion_tokens == 1


async def test_openai_does_not_stack_retries_on_a_guard_timeout(servers: list[LoopbackServer]) -> None:
    """openai's default max_retries=2 must not turn one 0.5 s deadline into 3 x 0.5 s plus sleeps."""
    for server in servers[:2]:
        server.script = Script(stall_before_first=SERVER_PAUSE)
    records: list[PhaseRecord] = []
    tiers = {"t": Tier(ttft=0.5, total=30.0)}
    async with make_guard(servers[:2], records, tiers=tiers) as guard:
        oai = openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="sk", http_client=guard.http_client())
        assert oai.max_retries == 2
        started = time.monotonic()
        with pytest.raises(openai.APITimeoutError) as caught:  # a deadline is a timeout, in every mode
            await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
        elapsed = time.monotonic() - started
    assert guard_failure(caught.value) == "ttft_timeout"
    timeout = caught.value.__cause__
    assert isinstance(timeout, TTFTTimeout) and "tier 't'" in str(timeout) and "0.5s" in str(timeout)
    assert elapsed >= 0.5  # the deadline, never early (no upper bound: a busy machine stretches any call)
    assert len(records) == 1  # one call: the SDK's retries of it failed at once (each call is a record)
    # The guard gave up before the server answered; on a busy machine before its handler ran, too.
    assert servers[0].wait_for(lambda: sum(len(s.received) for s in servers) >= 1)
    assert sum(len(s.received) for s in servers) == 1


async def test_caller_cancel_closes_the_attempt(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(stall_before_first=5.0)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        with anyio.move_on_after(0.2):
            await client.post(servers[0].url + CHAT, json=STREAM_BODY)
        assert guard.snapshot().idle
    assert records[0].status == "cancelled"
    assert records[0].attempts[0].outcome == "cancelled"
    assert servers[0].wait_for(lambda: servers[0].disconnects == 1)


async def test_abandoned_stream_is_closed_and_recorded(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=100, gap=0.01)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records) as guard, guard.http_client() as client:
        async with client.stream("POST", servers[0].url + CHAT, json=STREAM_BODY) as response:
            async for _ in response.aiter_raw():
                break
        assert guard.snapshot().replicas[0].in_flight == 0
    assert records[0].status == "abandoned"
    assert servers[0].wait_for(lambda: servers[0].disconnects == 1)


async def test_control_cohort_is_one_plain_measured_attempt(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(status=500)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records, rollout=0.0) as guard, guard.http_client() as client:
        response = await client.post(servers[0].url + CHAT, json={"model": "m"})
    assert response.status_code == 500 and "x-should-retry" not in response.headers
    assert records[0].cohort == "control" and len(records[0].attempts) == 1
    assert len(servers[0].received) == 1


async def test_waiting_for_a_bulkhead_slot_counts_against_ttft(servers: list[LoopbackServer]) -> None:
    from llmguard_client import Bulkhead

    servers[0].script = Script(tokens=30, gap=0.02)  # its stream holds the only slot until it is read below
    records: list[PhaseRecord] = []
    # ttft 1 s: room for the first call's own first token on a busy machine; total 30 s: a wait bounded by the
    # total instead of the ttft would last ten times longer than the bound below.
    tiers = {"t": Tier(ttft=1.0, total=30.0, stall=10.0)}
    bulkheads = {"t": Bulkhead(max_in_flight=1, max_waiting=1)}
    async with make_guard(servers[:1], records, tiers=tiers, bulkheads=bulkheads) as guard, guard.http_client() as c:
        async with c.stream("POST", servers[0].url + CHAT, json=STREAM_BODY) as first:
            started = time.monotonic()
            with pytest.raises(TTFTTimeout, match="bulkhead slot"):
                await c.post(servers[0].url + CHAT, json=STREAM_BODY)
            assert 1.0 <= time.monotonic() - started < 3.0
            await first.aread()
        assert (await c.post(servers[0].url + CHAT, json=STREAM_BODY)).status_code == 200  # the slot came back
    assert [r.status for r in records] == ["timeout", "ok", "ok"]
    assert records[0].attempts == () and len(servers[0].received) == 2


def test_a_sync_client_given_the_guards_transport_is_told_what_to_use(servers: list[LoopbackServer]) -> None:
    """``httpx.Client(transport=guard.transport)`` (what a framework's ``http_client_kwargs={"transport": ...}``
    leads to) raised ``AttributeError: ... no attribute 'handle_request'``: a TypeError naming the fix, and nothing
    is sent."""
    guard = make_guard(servers, [])
    client = httpx.Client(transport=guard.transport)
    with pytest.raises(TypeError) as caught:
        client.post(servers[0].url + CHAT, json=STREAM_BODY)
    client.close()
    with pytest.raises(TypeError) as entered, httpx.Client(transport=guard.transport):
        pass
    for message in (str(caught.value), str(entered.value)):
        assert "sync client" in message and "guard.sync_http_client()" in message
        assert "http_client_for(openai.OpenAI)" in message
    assert sum(len(s.received) for s in servers) == 0
    guard.close()


@BACKENDS
def test_calls_the_guard_aborts_as_it_closes_count_against_no_replica(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``Guard.aclose()`` with streams being read and calls still waiting for their first token: the guard's
    own abort, like a caller closing a stream early, is no replica's failure. Before, each stream cut counted
    as a failure after the first token, and one replica was drained (logged: "failures 57%")."""
    plans = [Plan(tokens=50, gap=0.1), Plan(first_token_after=5.0)] * 3  # streams, and calls with no token yet
    fakes = {"http://a.test": FakeReplica("a", plans), "http://b.test": FakeReplica("b", plans)}
    records: list[PhaseRecord] = []
    ended: list[BaseException] = []

    async def main() -> None:
        # At panic_threshold 1.0 the snapshot's `panic` says whether any replica is unhealthy (degraded or open).
        guard = virtual_guard(fakes, records, retry=RetryPolicy(panic_threshold=1.0))
        async with guard.http_client() as client:

            async def call() -> None:
                try:
                    async with client.stream("POST", "http://a.test" + CHAT, json=STREAM_BODY) as response:
                        await response.aread()
                except GuardClosed as closed:
                    ended.append(closed)

            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(call)
                await anyio.sleep(0.3)
                await guard.aclose()
        assert not guard.snapshot().panic

    run_virtual(main, backend)
    assert len(ended) == 6
    assert sum(r.ttft is not None for r in records) >= 2  # some were cut mid-stream
    assert {(r.status, r.cause) for r in records} == {("error", "guard_closed")}
    assert not [r.getMessage() for r in caplog.records if "degraded" in r.getMessage()]


@BACKENDS
def test_a_replica_whose_streamed_calls_time_out_before_their_first_token_is_judged_by_it(backend: str) -> None:
    """No hedging, a 2 s ttft, b's first token after 6 s (a long queue), a's after 15 ms, in virtual time. Each
    attempt the ttft deadline ends waited 2 s for nothing: a lower bound on b's TTFT, as a lost race is. Before,
    it taught the router nothing: b stayed "unknown" and every other call timed out; now b is drained after
    `Router.MIN_SAMPLES` of them and the calls after go to a."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(first_token_after=0.015)]),
        "http://b.test": FakeReplica("b", [Plan(first_token_after=6.0)]),
    }
    records: list[PhaseRecord] = []

    async def main() -> None:
        guard = virtual_guard(fakes, records, hedge=None, tiers={"t": Tier(ttft=2.0, total=20.0)})
        async with guard, guard.http_client() as client:
            for _ in range(12):
                try:
                    async with client.stream("POST", "http://a.test" + CHAT, json=STREAM_BODY) as response:
                        await response.aread()
                except TTFTTimeout:
                    pass
            assert guard._replica_set.router.degraded("http://b.test")

    run_virtual(main, backend)
    timed_out = [r for r in records if r.status == "timeout"]
    assert len(timed_out) == Router.MIN_SAMPLES
    assert {r.attempts[0].replica for r in timed_out} == {"http://b.test"}
    assert [r.status for r in records[-6:]] == ["ok"] * 6


@BACKENDS
@pytest.mark.parametrize("failure_mode", ["raise", "response"])
def test_a_caller_retrying_a_refusal_at_once_lets_the_call_holding_the_slot_finish(
    backend: str, failure_mode: Literal["raise", "response"]
) -> None:
    """A bulkhead of one slot, held by a stream being read; another task tries again at once each time it is
    refused. A refusal passes through the event loop, as the plain SDK's network call does, so the holder reads on,
    frees the slot, and the other call is served after a few refusals. (A refusal that never yielded would spin
    that loop for good: it is bounded by a count of refusals, since no timeout can fire in a loop that never
    yields.)"""
    fakes = {"http://a.test": FakeReplica("a")}
    records: list[PhaseRecord] = []
    bound = 1000
    refused: list[int] = []

    async def main() -> None:
        guard = virtual_guard(
            fakes,
            records,
            tiers={"i": Tier(ttft=5.0, total=10.0)},
            bulkheads={"i": Bulkhead(max_in_flight=1, max_waiting=0)},
            failure_mode=failure_mode,
        )
        async with guard, guard.http_client() as client:
            holding = anyio.Event()

            async def hold() -> None:
                async with client.stream("POST", "http://a.test" + CHAT, json=STREAM_BODY) as response:
                    holding.set()
                    for _ in range(10):  # its chunks come as the loop turns, without the clock moving
                        await anyio.lowlevel.checkpoint()
                    await response.aread()

            async def retry_at_once() -> None:
                for refusals in range(bound):
                    try:
                        response = await client.post("http://a.test" + CHAT, json=STREAM_BODY)
                    except BulkheadFull:
                        continue
                    if response.status_code != 503:
                        refused.append(refusals)
                        return
                raise AssertionError(f"refused {bound} times in a row: the call holding the slot never read on")

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(hold)
                await holding.wait()
                await retry_at_once()

    run_virtual(main, backend)
    assert refused and refused[0] > 0  # it did wait for the slot
    assert [r.status for r in records] == ["rejected"] * refused[0] + ["ok", "ok"]  # the holder, then the retry


@BACKENDS
@pytest.mark.parametrize("rollout", [1.0, 0.0], ids=["guarded", "control"])
def test_a_call_cancelled_while_its_connect_raises_the_cancellation_in_a_group_is_recorded_cancelled(
    backend: str, rollout: float
) -> None:
    """trio's connect raises a cancellation from inside its own nursery, in an exception group: the caller who
    gave up on the call still finds it recorded as cancelled by the caller, guarded or passed through."""
    fakes = {"http://a.test": ConnectsInANursery("a")}
    records: list[PhaseRecord] = []

    async def main() -> None:
        guard = virtual_guard(fakes, records, tiers={"i": Tier(ttft=5.0, total=10.0)}, rollout=rollout)
        async with guard, guard.http_client() as client:
            with anyio.move_on_after(0.1) as scope:
                await client.post("http://a.test" + CHAT, json=STREAM_BODY)
            assert scope.cancelled_caught and guard.snapshot().idle

    run_virtual(main, backend)
    (record,) = records
    assert (record.cohort, record.status, record.cause) == (
        "guarded" if rollout else "control",
        "cancelled",
        "cancelled_by_caller",
    )
    assert [a.outcome for a in record.attempts] == ["cancelled"]


async def test_a_callers_credential_carrying_another_replicas_key_is_not_sent_to_this_one(
    servers: list[LoopbackServer],
) -> None:
    """Each replica sets its own ``x-api-key``; the anthropic SDK sends its key (the first replica's) as
    ``Authorization: Bearer``, a header no replica sets. A request the guard sends to the second replica drops it:
    that key is the first replica's, whatever the header's name (before: it reached the second replica beside its
    own key). A credential carrying a key no replica is configured with (a gateway's user token) is sent on."""
    east, west = servers[0], servers[1]
    replicas = [Replica(east.url, headers={"x-api-key": "KEY-E"}), Replica(west.url, headers={"x-api-key": "KEY-W"})]
    async with Guard(replicas=replicas, hedge=None, instrumentation=None) as guard, guard.http_client() as client:
        for token in ("KEY-E", "USER-TOKEN"):
            headers = {"Authorization": f"Bearer {token}"}
            for server in (east, west):  # a request on a replica's origin goes to that replica
                response = await client.post(server.url + "/v1/messages", json={"model": "m"}, headers=headers)
                assert response.status_code == 200
    got = [[(r.headers["x-api-key"], r.headers.get("authorization")) for r in s.received] for s in (east, west)]
    assert got[0] == [("KEY-E", "Bearer KEY-E"), ("KEY-E", "Bearer USER-TOKEN")]
    assert got[1] == [("KEY-W", None), ("KEY-W", "Bearer USER-TOKEN")]


async def test_a_replicas_own_host_header_replaces_the_one_its_url_gives(servers: list[LoopbackServer]) -> None:
    """An ingress reached by IP that routes on ``Host``: the replica's ``Host`` is the one sent, on each attempt and on
    the request that follows a redirect on its origin (before: two Host headers, every call a local protocol error)."""
    server = servers[0]
    server.scripter = lambda index, attempt: (
        Script(status=307, body={}, headers={"location": "/v1/chat/completions?moved=1"}) if attempt == 1 else None
    )
    replica = Replica(server.url, headers={"Host": "llm.internal"})
    async with Guard([replica], hedge=None, instrumentation=None) as guard, guard.http_client() as client:
        body = {**STREAM_BODY, "messages": [{"role": "user", "content": "req1 hi"}]}
        async with client.stream("POST", "http://virtual.test" + CHAT, json=body) as response:
            assert response.status_code == 200 and len(response.history) == 1
            await response.aread()
    assert [(r.path, r.headers["host"]) for r in server.received] == [(CHAT, "llm.internal")] * 2


async def test_a_host_the_caller_sets_is_forwarded_to_every_replica_unless_the_replica_sets_its_own(
    cluster: LoopbackCluster,
) -> None:
    """``default_headers={"Host": ...}`` reaches each replica as any other header of the caller's (before: replaced
    by the replica's host and port); a replica's own ``Host`` wins; the one httpx writes from the client's URL is
    replaced by the replica's. Each call's first attempt fails, so its retry goes to the other replica."""
    first, second = cluster.servers
    cluster.set_scripter(lambda index, attempt: Script(status=500) if attempt == 1 else None)
    replicas = [Replica(first.url), Replica(second.url, headers={"Host": "ingress.internal"})]
    async with Guard(replicas, hedge=None, instrumentation=None) as guard, guard.http_client() as client:
        for index, host in enumerate(("llm.internal", None)):
            body = {"model": "m", "messages": [{"role": "user", "content": f"req{index} hi"}]}
            headers = {} if host is None else {"Host": host}
            response = await client.post("http://virtual.test" + CHAT, json=body, headers=headers)
            assert response.status_code == 200
    hosts = [[r.headers["host"] for r in server.received] for server in (first, second)]
    assert hosts == [["llm.internal", first.url.removeprefix("http://")], ["ingress.internal"] * 2]


async def test_a_host_the_caller_sets_is_kept_after_a_redirect_on_the_same_origin_only(
    servers: list[LoopbackServer],
) -> None:
    """Following a redirect, httpx keeps the request's ``Host`` on its origin and writes the new URL's elsewhere: the
    caller's stays explicit and is forwarded, the new origin gets its own, as without a guard."""
    replica, elsewhere = servers[0], servers[1]
    replica.scripter = lambda index, attempt: (
        Script(status=307, body={}, headers={"location": "/v1/chat/completions?moved=1"})
        if attempt == 1
        else Script(status=307, body={}, headers={"location": elsewhere.url + CHAT})
        if attempt == 2
        else None
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "req1 hi"}]}
    async with Guard([replica.url], hedge=None, instrumentation=None) as guard, guard.http_client() as client:
        response = await client.post(replica.url + CHAT, json=body, headers={"Host": "llm.internal"})
        assert response.status_code == 200 and len(response.history) == 2
    assert [r.headers["host"] for r in replica.received] == ["llm.internal"] * 2
    assert [r.headers["host"] for r in elsewhere.received] == [elsewhere.url.removeprefix("http://")]


async def test_a_replica_urls_userinfo_is_its_own_credential_sent_to_it_alone(cluster: LoopbackCluster) -> None:
    """``http://ua:pa@A`` and ``http://ub:pb@B``: each replica gets its own ``Authorization: Basic``, as if given in
    its headers. A client at A's URL (httpx builds Basic from its userinfo) no longer carries A's to B, and a client
    without userinfo gets each replica its own (before: B got A's, and neither replica ever got its own). Each call's
    first attempt fails, so its retry goes to the other replica. The records name the replicas without userinfo."""
    first, second = cluster.servers
    cluster.set_scripter(lambda index, attempt: Script(status=500) if attempt == 1 else None)
    a, b = first.url.replace("//", "//ua:pa@"), second.url.replace("//", "//ub:pb@")
    urls = AttemptUrls()
    records: list[PhaseRecord] = []
    async with (
        Guard([a, b], hedge=None, instrumentation=urls, on_record=records.append) as guard,
        guard.http_client() as client,
    ):
        for index, url in enumerate((a, "http://virtual.test")):
            body = {"model": "m", "messages": [{"role": "user", "content": f"req{index} hi"}]}
            assert (await client.post(url + CHAT, json=body)).status_code == 200
    basic = {s: "Basic " + base64.b64encode(s.encode()).decode() for s in ("ua:pa", "ub:pb")}
    assert [first.auth(), second.auth()] == [[basic["ua:pa"]] * 2, [basic["ub:pb"]] * 2]
    assert len(urls.seen) == 4 and not any("@" in text for text in (*urls.seen, repr(records), repr(guard.snapshot())))


class AttemptUrls:
    """An `Instrumentation` keeping the URL each attempt is sent to, and nothing else."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def call_started(self, record: LiveCall) -> CallObservation:
        return self

    def attempt_started(self, attempt: LiveAttempt, url: str, headers: MutableMapping[str, str]) -> None:
        self.seen.append(url)

    def attempt_finished(self, attempt: LiveAttempt) -> None: ...

    def call_finished(self, record: PhaseRecord) -> None: ...

    def budget_refused(self, record: LiveCall) -> None: ...

    def replica_cooled(self, replica: str, seconds: float, reason: str) -> None: ...

    def bulkhead_rejected(self, tier: str) -> None: ...

    def register_budget(self, level: Callable[[], float]) -> None: ...


@pytest.mark.parametrize(("path", "requests"), [("/v1/threads/t1/messages", 1), ("/v1/messages", 3)])
async def test_a_message_stored_in_an_assistants_thread_is_no_generation_call(path: str, requests: int) -> None:
    """``POST /threads/{id}/messages`` ends like Anthropic's Messages call, and was taken for one: a 500 was sent
    3 times (the same message stored 3 times where the caller's SDK asked for no retry), and its 429s cooled the
    replica for the chat calls. It is retried as other calls that generate nothing: on a refused connection only."""
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        return httpx.Response(500, json={"error": {"message": "down"}})

    retry = RetryPolicy(backoff_initial=0.001, backoff_max=0.002, same_replica_backoff=0)
    async with Guard(
        ["http://a"], transport_factory=lambda r: httpx.MockTransport(answer), retry=retry, instrumentation=None
    ) as guard:
        async with guard.http_client() as client:
            response = await client.post("http://a" + path, json={"role": "user", "content": "hi"})
    assert (response.status_code, sent) == (500, [path] * requests)
