"""The off state and the control cohort: the caller's request byte for byte, once, and still measured."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmguard_client import (
    Guard,
    GuardRequestError,
    OpenTelemetryInstrumentation,
    PhaseRecord,
    Tier,
    UnknownTierError,
    guard_failure,
)
from llmguard_client._rollout.rollout import key_position
from llmguard_client.telemetry import semconv as sc
from llmguard_tools.compare.load import read_records
from tests.clients import plain_httpx
from tests.loopback import LoopbackServer, Script
from tests.recording import RecordingServer

TIERS = {"interactive": Tier(ttft=0.05, total=0.2, stall=0.05), "batch": Tier(ttft=5.0, total=10.0)}
GUARD_HEADERS = {"x-llmguard-tier": "interactive", "x-llmguard-cohort": "guarded", "X-LLMGuard-Key": "user-7"}
"""Valid guard headers (a pin to guarded included): while off, they are stripped and ignored."""


@pytest.fixture
def recorders() -> Iterator[list[RecordingServer]]:
    servers = [RecordingServer() for _ in range(3)]
    for server in servers:
        server.__enter__()
    yield servers
    for server in servers:
        server.__exit__(None, None, None)


async def upload() -> AsyncIterator[bytes]:
    yield b'{"model": "m", '
    yield b'"stream": true}'


async def send(client: httpx.AsyncClient, base: str, kind: str, extra: dict[str, str]) -> httpx.Response:
    headers = {"Authorization": "Bearer sk-test", "X-Custom-Trace": "AbC", **extra}
    if kind == "json":
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        return await client.post(f"{base}/v1/chat/completions?api-version=2024-06-01", json=body, headers=headers)
    if kind == "get":
        return await client.get(f"{base}/v1/models?limit=2&after=x%20y", headers=headers)
    return await client.post(f"{base}/v1/chat/completions", content=upload(), headers=headers)  # chunked


def guard_off(mode: str, replicas: list[str], monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Guard:
    if mode == "env":
        monkeypatch.setenv("LLMGUARD_DISABLED", "1")
        guard = Guard(replicas, tiers=TIERS, rollout=1.0, **kw)
        monkeypatch.delenv("LLMGUARD_DISABLED")
        return guard
    guard = Guard(replicas, tiers=TIERS, rollout=0.0 if mode == "rollout=0" else 1.0, **kw)
    if mode == "set_rollout(0)":
        guard.set_rollout(0.0)
    return guard


@pytest.mark.parametrize("mode", ["env", "rollout=0", "set_rollout(0)"])
@pytest.mark.parametrize("target", ["replica", "other"])
@pytest.mark.parametrize("kind", ["json", "get", "upload"])
async def test_off_is_a_byte_for_byte_pass_through(
    recorders: list[RecordingServer], monkeypatch: pytest.MonkeyPatch, mode: str, target: str, kind: str
) -> None:
    first, second, outside = recorders
    dest = first if target == "replica" else outside
    async with plain_httpx() as plain:
        expected = await send(plain, dest.url, kind, {})
    records: list[PhaseRecord] = []
    guard = guard_off(mode, [first.url, second.url], monkeypatch, on_record=records.append)
    async with guard, guard.http_client() as client:
        got = await send(client, dest.url, kind, GUARD_HEADERS)
    assert len(dest.requests) == 2 and second.requests == [] and (target == "other" or outside.requests == [])
    assert dest.requests[1] == dest.requests[0]  # request line, headers (case, order), body: identical
    assert b"llmguard" not in dest.requests[1].lower() and b"traceparent" not in dest.requests[1]
    assert got.status_code == expected.status_code
    assert got.headers.raw == expected.headers.raw and got.content == expected.content
    (record,) = records
    assert (record.cohort, record.rollout_fraction, record.tier, record.status) == ("control", 0.0, "interactive", "ok")
    assert len(record.attempts) == 1 and record.replica == dest.url
    assert record.ttft is not None and record.http_status == 200
    assert got.extensions["llmguard"] is record


@pytest.mark.parametrize("mode", ["env", "rollout=0", "set_rollout(0)", "pinned control", "control key"])
async def test_a_tier_typo_fails_in_the_control_cohort_as_it_would_guarded(
    recorders: list[RecordingServer], monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    first, second, _ = recorders
    headers = {"x-llmguard-tier": "interactve"}
    records: list[PhaseRecord] = []
    if mode == "pinned control":
        guard = Guard([first.url, second.url], tiers=TIERS, rollout=1.0, on_record=records.append)
        headers["x-llmguard-cohort"] = "control"
    elif mode == "control key":
        guard = Guard([first.url, second.url], tiers=TIERS, rollout=0.1, on_record=records.append)
        headers["x-llmguard-key"] = next(k for k in (f"user-{i}" for i in range(100)) if key_position(k) >= 0.1)
    else:
        guard = guard_off(mode, [first.url, second.url], monkeypatch, on_record=records.append)
    async with guard, guard.http_client() as client:
        with pytest.raises(UnknownTierError, match=r"'interactve'.*configured tiers: batch, interactive") as caught:
            await send(client, first.url, "json", headers)
    assert guard_failure(caught.value) == "unknown_tier" and caught.value.status_code == 400
    assert first.requests == [] and second.requests == [] and records == []


@pytest.mark.parametrize("rollout", [1.0, 0.0], ids=["guarded", "control"])
async def test_a_misspelt_guard_header_is_refused_in_either_cohort_before_anything_is_sent(
    recorders: list[RecordingServer], rollout: float
) -> None:
    """Before: silently ignored (the call took the default tier), and forwarded to the server by guarded calls."""
    first, second, _ = recorders
    records: list[PhaseRecord] = []
    guard = Guard([first.url, second.url], tiers=TIERS, rollout=rollout, on_record=records.append)
    async with guard, guard.http_client() as client:
        with pytest.raises(GuardRequestError, match=r"unknown header 'x-llmguard-teir'.*x-llmguard-tier") as caught:
            await send(client, first.url, "json", {"X-LLMGuard-Teir": "batch"})
    assert guard_failure(caught.value) == "bad_request" and caught.value.status_code == 400
    assert first.requests == [] and second.requests == [] and records == []


@pytest.mark.parametrize("rollout", [1.0, 0.0], ids=["guarded", "control"])
async def test_the_guards_answer_headers_copied_onto_a_request_are_dropped_not_refused(
    recorders: list[RecordingServer], rollout: float
) -> None:
    """A proxy or client that copies an answer's headers onto its next request sends the guard's own answer
    headers back: they are dropped, as the guard's request headers are, not refused as misspelt ones."""
    first, second, _ = recorders
    guard = Guard([first.url, second.url], tiers=TIERS, rollout=rollout)
    copied = {"x-llmguard-cause": "budget_exhausted", "x-llmguard-stream-failure": "error_event"}
    async with guard, guard.http_client() as client:
        await send(client, first.url, "json", {**copied, "x-llmguard-chaos": "status_503"})
    (sent,) = first.requests + second.requests  # the raw request
    assert b"x-llmguard-" not in sent.lower()


async def test_a_control_key_at_ten_percent_is_passed_through_and_a_guarded_key_is_not(
    recorders: list[RecordingServer],
) -> None:
    first, second, _ = recorders
    control_key = next(k for k in (f"user-{i}" for i in range(100)) if key_position(k) >= 0.1)
    guarded_key = next(k for k in (f"user-{i}" for i in range(100)) if key_position(k) < 0.1)
    async with plain_httpx() as plain:
        await send(plain, first.url, "json", {})
    records: list[PhaseRecord] = []
    guard = Guard([first.url, second.url], tiers=TIERS, default_tier="batch", rollout=0.1, on_record=records.append)
    async with guard, guard.http_client() as client:
        await send(client, first.url, "json", {"x-llmguard-key": control_key})
        await send(client, first.url, "json", {"x-llmguard-key": guarded_key})
    assert [r.cohort for r in records] == ["control", "guarded"]
    assert [r.rollout_fraction for r in records] == [0.1, 0.1]
    assert first.requests[1] == first.requests[0]
    guarded_sent = (first.requests + second.requests)[2]
    assert b"x-llmguard-key" not in guarded_sent.lower()  # stripped on the guarded path too


async def test_the_span_says_control_and_the_fraction_and_nothing_is_injected(
    recorders: list[RecordingServer],
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    guard = Guard([recorders[0].url], tiers=TIERS, rollout=0.0, instrumentation=OpenTelemetryInstrumentation(provider))
    async with guard, guard.http_client() as client:
        await send(client, recorders[0].url, "json", {})
    provider.shutdown()
    assert b"traceparent" not in recorders[0].requests[0]
    call_span = next(s for s in exporter.get_finished_spans() if s.attributes and "llmguard.cohort" in s.attributes)
    assert call_span.attributes is not None
    assert call_span.attributes["llmguard.cohort"] == "control"
    assert call_span.attributes["llmguard.rollout.fraction"] == 0.0


# --- measured like the guarded path, on the starlette loopback servers --------------------------------------

CHAT = "/v1/chat/completions"
STREAM = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}


async def test_control_ttft_counts_a_slow_first_token_and_no_deadline_cuts_it(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(stall_before_first=0.3, tokens=3)  # 6x the tier's ttft: control waits it out
    records: list[PhaseRecord] = []
    async with Guard([s.url for s in servers], tiers=TIERS, rollout=0.0, on_record=records.append) as guard:
        async with guard.http_client() as client, client.stream("POST", servers[0].url + CHAT, json=STREAM) as r:
            text = (await r.aread()).decode()
    assert text.count("data:") == 6 and text.endswith("data: [DONE]\n\n")
    (record,) = records
    assert record.status == "ok" and record.ttft is not None and record.ttft >= 0.3
    assert record.chunks == 4 and record.finish_reasons == ("stop",)  # 3 tokens + the finish event
    assert [s.received != [] for s in servers] == [True, False, False]


async def test_control_error_status_and_429_pass_through_measured(servers: list[LoopbackServer]) -> None:
    servers[1].script = Script(status=429, headers={"retry-after": "7"})
    records: list[PhaseRecord] = []
    async with Guard([s.url for s in servers], tiers=TIERS, rollout=0.0, on_record=records.append) as guard:
        async with guard.http_client() as client:
            response = await client.post(servers[1].url + CHAT, json=STREAM)
    assert response.status_code == 429 and response.headers["retry-after"] == "7"
    assert "x-llmguard-cause" not in response.headers and "x-should-retry" not in response.headers
    (record,) = records
    assert (record.status, record.cause, record.http_status) == ("http_error", "upstream_status", 429)
    assert record.ttft is None and record.attempts[0].error == "http_429"
    assert sum(len(s.received) for s in servers) == 1


@pytest.mark.parametrize("read", [False, True], ids=["closed_unread", "read"])
async def test_a_control_error_answer_is_an_http_error_however_its_body_ends(
    servers: list[LoopbackServer], read: bool
) -> None:
    """An SDK that retries a 503 closes its body unread: the call is still an error answer, as a guarded one is, on
    its record, its span and the calls metric the cohorts are compared on."""
    servers[0].script = Script(status=503)
    spans, metrics = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider, meter_provider = TracerProvider(), MeterProvider(metric_readers=[metrics])
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    records: list[PhaseRecord] = []
    instrumentation = OpenTelemetryInstrumentation(tracer_provider, meter_provider)
    guard = Guard([servers[0].url], tiers=TIERS, rollout=0.0, on_record=records.append, instrumentation=instrumentation)
    async with guard, guard.http_client() as client:
        async with client.stream("POST", servers[0].url + CHAT, json=STREAM) as response:
            assert response.status_code == 503
            if read:
                await response.aread()
    (record,) = records
    assert (record.status, record.cause, record.http_status) == ("http_error", "upstream_status", 503)
    assert (record.attempts[0].outcome, record.attempts[0].error) == ("failed", "http_503")
    call_span = next(s for s in spans.get_finished_spans() if s.attributes and "llmguard.cohort" in s.attributes)
    assert call_span.attributes is not None and call_span.attributes["error.type"] == "503"
    data = metrics.get_metrics_data()
    assert data is not None
    (calls,) = [m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                if m.name == sc.LLMGUARD_CLIENT_CALLS]  # fmt: skip
    (point,) = calls.data.data_points
    assert (point.attributes["llmguard.status"], point.attributes["error.type"]) == ("http_error", "503")
    tracer_provider.shutdown()
    meter_provider.shutdown()


async def test_control_transport_errors_are_raised_as_httpx_raised_them(refused_url: Callable[[], str]) -> None:
    closed = refused_url()
    records: list[PhaseRecord] = []
    async with Guard([closed], tiers=TIERS, rollout=0.0, on_record=records.append) as guard:
        async with guard.http_client() as client:
            with pytest.raises(httpx.ConnectError):
                await client.post(closed + CHAT, json=STREAM)
    assert (records[0].status, records[0].cause) == ("error", "connect_error")


async def test_the_callers_own_timeout_applies_and_is_recorded_as_a_timeout(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(hang_before_headers=2.0)
    records: list[PhaseRecord] = []
    async with Guard([servers[0].url], tiers=TIERS, rollout=0.0, on_record=records.append) as guard:
        async with guard.http_client(timeout=httpx.Timeout(5.0, read=0.2)) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post(servers[0].url + CHAT, json=STREAM)
    assert (records[0].status, records[0].cause) == ("timeout", "read_timeout")
    assert servers[0].wait_for(lambda: servers[0].disconnects == 1)


async def test_a_body_closed_early_is_abandoned_and_the_server_sees_the_disconnect(
    servers: list[LoopbackServer],
) -> None:
    servers[0].script = Script(tokens=50, gap=0.02)
    records: list[PhaseRecord] = []
    async with Guard([servers[0].url], tiers=TIERS, rollout=0.0, on_record=records.append) as guard:
        async with guard.http_client() as client, client.stream("POST", servers[0].url + CHAT, json=STREAM) as r:
            async for _ in r.aiter_bytes():
                break
    assert (records[0].status, records[0].cause) == ("abandoned", "closed_by_caller")
    assert servers[0].wait_for(lambda: servers[0].disconnects == 1)


async def test_aclose_closes_the_shared_pool_for_other_urls(recorders: list[RecordingServer]) -> None:
    guard = Guard([recorders[0].url], tiers=TIERS, rollout=0.0)
    async with guard.http_client() as client:
        await send(client, recorders[1].url, "get", {})
    pool = guard.transport.passthrough_pool
    shared = pool.for_url(httpx.URL(recorders[1].url))
    assert pool.for_url(httpx.URL(recorders[0].url)) is not shared  # a replica's origin uses its own pool
    await guard.aclose()
    assert isinstance(shared, httpx.AsyncHTTPTransport) and shared._pool.connections == []
    with pytest.raises(RuntimeError, match="closed"):
        pool.for_url(httpx.URL(recorders[1].url))


@pytest.mark.parametrize("rollout", [0.0, 1.0])
async def test_a_stream_closed_right_after_done_is_ok_in_both_cohorts(
    servers: list[LoopbackServer], rollout: float
) -> None:
    """openai 2.x and the bench stop reading at [DONE]; both cohorts must call that a success, or
    `llmguard compare` would compare two different definitions of success."""
    records: list[PhaseRecord] = []
    tiers = {"t": Tier(ttft=10.0, total=30.0)}  # not TIERS: a guarded call must not time out on a busy machine
    async with Guard([servers[0].url], tiers=tiers, rollout=rollout, on_record=records.append) as guard:
        async with guard.http_client() as client, client.stream("POST", servers[0].url + CHAT, json=STREAM) as r:
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    break
    (record,) = records
    assert (record.cohort, record.status, record.cause) == ("control" if rollout == 0 else "guarded", "ok", None)


def test_pass_through_under_trio(servers: list[LoopbackServer]) -> None:
    pytest.importorskip("trio")
    import anyio

    servers[0].script = Script(stall_before_first=0.1, tokens=2)
    records: list[PhaseRecord] = []

    async def main() -> None:
        async with Guard([servers[0].url], tiers=TIERS, rollout=0.0, on_record=records.append) as guard:
            async with guard.http_client() as client:
                async with client.stream("POST", servers[0].url + CHAT, json=STREAM) as response:
                    assert (await response.aread()).endswith(b"data: [DONE]\n\n")
                with pytest.raises(httpx.ReadTimeout):  # the caller's own timeout, cancelled the trio way
                    servers[0].script = Script(hang_before_headers=2.0)
                    await client.post(servers[0].url + CHAT, json=STREAM, timeout=httpx.Timeout(5.0, read=0.2))

    anyio.run(main, backend="trio")
    assert [(r.status, r.cohort) for r in records] == [("ok", "control"), ("timeout", "control")]
    assert records[0].ttft is not None and records[0].ttft >= 0.1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_control_record_through_the_httpx2_edge_has_the_requests_facts(
    servers: list[LoopbackServer], stream: bool
) -> None:
    """openai >= 3's client hands the guard its body as a stream of the bytes in memory: the control record still
    reads the model, ``stream`` and ``max_tokens`` from it (before: None, False, None)."""
    openai = pytest.importorskip("openai")
    records: list[PhaseRecord] = []
    async with Guard([servers[0].url], rollout=0.0, instrumentation=None, on_record=records.append) as guard:
        client = openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="k", http_client=guard.httpx2_client())
        answer = await client.chat.completions.create(
            model="gpt-x", messages=[{"role": "user", "content": "hi"}], max_tokens=7, stream=stream
        )
        if stream:
            async for _ in answer:
                pass
    (record,) = records
    assert (record.cohort, record.model, record.stream, record.max_tokens) == ("control", "gpt-x", stream, 7)


async def test_a_control_calls_sdk_retries_read_as_one_call_as_its_caller_saw_it(servers: list[LoopbackServer]) -> None:
    """Each control call meets a 429 (``Retry-After: 0``), and the SDK's retry of it is served: a record per request,
    the two sharing an ``sdk_call``, which `compare` reads as one successful call (before: two calls, half failed)."""
    openai = pytest.importorskip("openai")
    servers[0].scripter = lambda index, attempt: (
        Script(status=429, headers={"retry-after": "0"}, body={"error": {"message": "slow down"}})
        if attempt == 1
        else None
    )
    records: list[PhaseRecord] = []
    async with Guard([servers[0].url], rollout=0.0, instrumentation=None, on_record=records.append) as guard:
        client = openai.AsyncOpenAI(
            base_url=servers[0].url + "/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI)
        )
        for i in range(4):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"req{i} hi"}])
    assert [(r.http_status, r.sdk_retry) for r in records] == [(429, 0), (200, 1)] * 4
    assert len({r.sdk_call for r in records}) == 4 and None not in {r.sdk_call for r in records}
    calls = read_records(json.dumps(r.to_dict()) for r in records).calls
    assert [(c.cohort, c.status, c.attempts) for c in calls] == [("control", "ok", 2)] * 4
