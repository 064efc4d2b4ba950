"""`OpenTelemetryInstrumentation` end to end: a real `Guard` and loopback servers (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from opentelemetry.trace import StatusCode

from llmguard_client import GuardConfigError, OpenTelemetryInstrumentation
from llmguard_client.telemetry import semconv as sc
from llmguard_client.telemetry.record import PhaseRecord
from tests.loopback import LoopbackServer, Script
from tests.telemetry.otel_harness import SECRETS, Otel, all_strings, by_name, end_call, new_record, points


def test_provider_name_and_operations(otel: Otel) -> None:
    inst = otel.instrumentation(provider_name="azure.ai.openai")
    for path, model, name in [
        ("/v1/embeddings", "text-embedding-3-small", "embeddings text-embedding-3-small"),
        ("/v1/completions", "gpt-3.5-turbo-instruct", "text_completion gpt-3.5-turbo-instruct"),
        ("/v1/chat/completions", None, "chat"),
    ]:
        record = new_record(path=path, model=model, stream=False, max_tokens=None)
        obs = inst.call_started(record)
        obs.call_finished(end_call(record, "ok", finish=0.01))
        span = otel.finished()[-1]
        assert span.name == name
        attrs = span.attributes or {}
        assert attrs["gen_ai.provider.name"] == "azure.ai.openai"
        assert "gen_ai.request.max_tokens" not in attrs


# -------------------------------------------------------------------------------------------
# End to end: a real Guard, real loopback servers (tests/conftest.py, tests/loopback.py)
# -------------------------------------------------------------------------------------------
CHAT = "/v1/chat/completions"
PROMPT = "SECRET PROMPT do not log"
STREAM_BODY: dict[str, Any] = {
    "model": "test-model",
    "messages": [{"role": "user", "content": PROMPT}],
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_tokens": 50,
}


def e2e_guard(otel: Otel, replicas: Sequence[Any], **kw: Any) -> Any:
    from llmguard_client import Guard, Tier

    kw.setdefault("tiers", {"interactive": Tier(ttft=2.0, total=10.0, stall=2.0)})
    kw.setdefault("hedge", None)
    return Guard(replicas=list(replicas), instrumentation=otel.instrumentation(), **kw)


def traceparent_of(server: LoopbackServer, i: int = 0) -> tuple[int, int]:
    """(trace id, span id) of the traceparent the server received with its i-th request."""
    _, trace_id, span_id, _ = server.received[i].headers["traceparent"].split("-")
    return int(trace_id, 16), int(span_id, 16)


async def test_e2e_streamed_call(otel: Otel, servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=5, gap=0.002, stall_before_first=0.03)
    async with (
        e2e_guard(otel, [servers[0].url]) as guard,
        guard.http_client() as client,
        client.stream("POST", servers[0].url + CHAT, json=STREAM_BODY) as response,
    ):
        await response.aread()
        record = response.extensions["llmguard"]
    logical, (attempt,) = by_name(otel.finished())
    assert logical.name == "chat test-model"
    la = logical.attributes or {}
    assert la["gen_ai.request.model"] == "test-model" and la["gen_ai.request.max_tokens"] == 50
    assert la["gen_ai.request.stream"] is True
    assert (la["gen_ai.usage.input_tokens"], la["gen_ai.usage.output_tokens"]) == (7, 5)
    assert la["gen_ai.response.id"] == "chatcmpl-test" and la["gen_ai.response.model"] == "test-model"
    assert la["gen_ai.response.finish_reasons"] == ("stop",)
    ttfc = la["gen_ai.response.time_to_first_chunk"]
    assert isinstance(ttfc, float) and ttfc >= 0.03
    assert (la["server.address"], la["server.port"]) == ("127.0.0.1", servers[0].port)
    assert la["llmguard.request_id"] == record.request_id
    assert logical.status.status_code is StatusCode.UNSET
    assert logical.end_time == ns_of(record, record.finish)
    aa = attempt.attributes or {}
    assert aa["url.full"] == servers[0].url + CHAT
    assert aa["llmguard.attempt.outcome"] == "won" and aa["http.response.status_code"] == 200
    # The server can join the trace: it received the attempt span's context.
    assert traceparent_of(servers[0]) == (logical.context.trace_id, attempt.context.span_id)
    m = otel.metrics()
    for name in (sc.GEN_AI_CLIENT_OPERATION_DURATION, sc.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK):
        assert sum(p.count for p in points(m[name])) == 1
    tpoc = points(m[sc.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK])
    assert sum(p.count for p in tpoc) == 1
    assert {p.attributes["gen_ai.token.type"]: p.sum for p in points(m[sc.GEN_AI_CLIENT_TOKEN_USAGE])} == {
        "input": 7,
        "output": 5,
    }


@pytest.mark.parametrize("attempt_spans", [True, False])
async def test_without_propagation_the_request_carries_only_the_callers_own_trace_context(
    otel: Otel, servers: list[LoopbackServer], attempt_spans: bool
) -> None:
    """``propagate=False`` (a caller whose SDK was told not to send trace context, e.g. anthropic's
    ``open_telemetry={"propagation": False}``): the guard adds none, and leaves the caller's own as it was."""
    from llmguard_client import Guard

    servers[0].script = Script(tokens=2)
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    instrumentation = otel.instrumentation(propagate=False, attempt_spans=attempt_spans)
    async with (
        Guard([servers[0].url], hedge=None, instrumentation=instrumentation) as guard,
        guard.http_client() as client,
    ):
        for headers in ({}, {"traceparent": own}):
            response = await client.post(servers[0].url + CHAT, json=STREAM_BODY, headers=headers)
            await response.aread()
    sent = [r.headers for r in servers[0].received]
    assert "traceparent" not in sent[0] and "baggage" not in sent[0]
    assert sent[1]["traceparent"] == own
    attempts = [span for span in otel.finished() if span.parent is not None]
    assert len(attempts) == (2 if attempt_spans else 0)  # the spans are made as before


@pytest.mark.parametrize(
    ("attributes", "metrics", "opt_in"),
    [
        (False, False, ""),  # opentelemetry-instrumentation-openai-v2: its span and its metrics
        (False, False, "gen_ai_latest_experimental"),
        (False, True, ""),  # logfire's instrument_openai, anthropic's open_telemetry: a span, no metric
        (True, False, ""),
    ],
    ids=["none", "none_latest_names", "metrics_only", "attributes_only"],
)
async def test_gen_ai_telemetry_left_to_the_sdks_instrumentation(
    otel: Otel,
    servers: list[LoopbackServer],
    monkeypatch: pytest.MonkeyPatch,
    attributes: bool,
    metrics: bool,
    opt_in: str,
) -> None:
    """An instrumentation of the SDK (opentelemetry-instrumentation-openai-v2) makes a ``chat <model>`` span around
    the call and records the GenAI metrics itself; the guard's span under it carried ``gen_ai.usage.*`` too and the
    guard recorded the GenAI metrics again, so each call counted twice. ``gen_ai_attributes=False`` and
    ``gen_ai_metrics=False`` leave them to it: the guard's span, its attempts and its own metrics stay."""
    from llmguard_client import Guard

    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", opt_in)
    servers[0].script = Script(tokens=3)
    sdk_tracer = otel.tracer_provider.get_tracer("an-sdk-instrumentation")
    instrumentation = otel.instrumentation(gen_ai_attributes=attributes, gen_ai_metrics=metrics)
    async with (
        Guard([servers[0].url], hedge=None, instrumentation=instrumentation) as guard,
        guard.http_client() as client,
    ):
        with sdk_tracer.start_as_current_span("chat test-model", attributes={sc.GEN_AI_OPERATION_NAME: "chat"}):
            response = await client.post(servers[0].url + CHAT, json=STREAM_BODY)
            await response.aread()
        record = response.extensions["llmguard"]
    assert (record.status, record.prompt_tokens) == ("ok", 7)
    spans = otel.finished()
    (sdk_span,) = [s for s in spans if s.instrumentation_scope.name == "an-sdk-instrumentation"]
    (logical,) = [s for s in spans if s.parent is not None and s.parent.span_id == sdk_span.context.span_id]
    (attempt,) = [s for s in spans if s.parent is not None and s.parent.span_id == logical.context.span_id]
    la = logical.attributes or {}
    assert logical.name == "chat test-model"
    assert (la["llmguard.status"], la["llmguard.attempts"], la["http.response.status_code"]) == ("ok", 1, 200)
    gen_ai_attributes = {k: v for k, v in la.items() if k.startswith("gen_ai.")}
    if attributes:
        assert gen_ai_attributes["gen_ai.usage.input_tokens"] == 7
    else:
        assert gen_ai_attributes == {}
    assert not any(k.startswith("gen_ai.") for k in (attempt.attributes or {}))
    assert (attempt.attributes or {})["llmguard.attempt.outcome"] == "won"
    assert traceparent_of(servers[0]) == (sdk_span.context.trace_id, attempt.context.span_id)
    m = otel.metrics()
    gen_ai_metrics = {name for name in m if name.startswith("gen_ai.")}
    assert bool(gen_ai_metrics) == metrics
    (calls,) = points(m[sc.LLMGUARD_CLIENT_CALLS])
    assert (calls.value, calls.attributes["llmguard.status"]) == (1, "ok")
    assert sum(p.count for p in points(m[sc.HTTP_CLIENT_REQUEST_DURATION])) == 1


def ns_of(record: PhaseRecord, t: float | None) -> int:
    assert t is not None
    return round(record.start_unix * 1e9) + round((t - record.start) * 1e9)


async def test_e2e_failed_call(otel: Otel, servers: list[LoopbackServer]) -> None:
    for server in servers[:2]:
        server.script = Script(status=503, body={"error": {"message": "overloaded", "type": "x"}})
    from llmguard_client import RetryPolicy

    retry = RetryPolicy(overload_cooldown=0.05)  # both replicas cool after a 503: not a 1 s wait for the retry
    async with e2e_guard(otel, [s.url for s in servers[:2]], retry=retry) as guard, guard.http_client() as client:
        response = await client.post(servers[0].url + CHAT, json=STREAM_BODY)
    assert response.status_code == 503
    logical, attempts = by_name(otel.finished())
    assert logical.status.status_code is StatusCode.ERROR
    la = logical.attributes or {}
    assert la["error.type"] == "503" and la["llmguard.status"] == "http_error"
    assert la["llmguard.retried"] is True and la["llmguard.attempts"] == len(attempts) >= 2
    assert all((a.attributes or {})["error.type"] == "503" for a in attempts)
    assert all(a.status.status_code is StatusCode.ERROR for a in attempts)
    assert [(a.attributes or {}).get("http.request.resend_count") for a in attempts] == [None, *range(1, len(attempts))]
    (dur,) = points(otel.metrics()[sc.GEN_AI_CLIENT_OPERATION_DURATION])
    assert dur.count == 1 and dur.attributes["error.type"] == "503"


async def test_e2e_stream_broken_after_the_first_token(otel: Otel, servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=10, reset_after_tokens=3)
    async with e2e_guard(otel, [servers[0].url]) as guard, guard.http_client() as client:
        with pytest.raises(httpx.HTTPError):
            async with client.stream("POST", servers[0].url + CHAT, json=STREAM_BODY) as response:
                await response.aread()
    logical, (attempt,) = by_name(otel.finished())
    la, aa = logical.attributes or {}, attempt.attributes or {}
    assert la["llmguard.status"] == "error" and la["error.type"] == aa["error.type"] == la["llmguard.cause"]
    assert "gen_ai.response.time_to_first_chunk" in la  # it did get a first chunk
    assert aa["llmguard.attempt.outcome"] == "won" and attempt.status.status_code is StatusCode.ERROR


async def test_e2e_ttft_timeout(otel: Otel, servers: list[LoopbackServer]) -> None:
    from llmguard_client import Tier, TTFTTimeout

    servers[0].script = Script(stall_before_first=3.0)
    tiers = {"fast": Tier(ttft=0.2, total=5.0, stall=1.0)}
    async with e2e_guard(otel, [servers[0].url], tiers=tiers, retry=None) as guard, guard.http_client() as client:
        with pytest.raises(TTFTTimeout):
            await client.post(servers[0].url + CHAT, json=STREAM_BODY)
    logical, (attempt,) = by_name(otel.finished())
    assert (logical.attributes or {})["error.type"] == "ttft_timeout"
    assert logical.status.status_code is StatusCode.ERROR
    assert (logical.attributes or {})["llmguard.tier"] == "fast"
    assert "gen_ai.response.time_to_first_chunk" not in (logical.attributes or {})
    assert (attempt.attributes or {})["llmguard.attempt.outcome"] == "cancelled"
    assert attempt.status.status_code is StatusCode.UNSET  # the call's deadline ended it


async def test_e2e_hedged_call(otel: Otel, servers: list[LoopbackServer]) -> None:
    from llmguard_client import HedgePolicy

    servers[0].script = Script(stall_before_first=3.0)
    servers[1].script = Script(tokens=4)
    guard = e2e_guard(otel, [s.url for s in servers[:2]], hedge=HedgePolicy(delay=0.1))
    async with (
        guard,
        guard.http_client() as client,
        client.stream("POST", servers[0].url + CHAT, json=STREAM_BODY) as response,
    ):
        await response.aread()
    logical, (primary, hedge) = by_name(otel.finished())
    la = logical.attributes or {}
    assert la["llmguard.hedged"] is True and la["llmguard.attempts"] == 2
    assert la["server.port"] == servers[1].port  # the winner
    assert (primary.attributes or {})["llmguard.attempt.outcome"] == "lost"
    assert primary.status.status_code is StatusCode.UNSET
    assert (hedge.attributes or {})["llmguard.attempt.outcome"] == "won"
    assert (hedge.attributes or {})["llmguard.attempt.kind"] == "hedge"
    assert traceparent_of(servers[0])[1] == primary.context.span_id
    assert traceparent_of(servers[1])[1] == hedge.context.span_id


async def test_e2e_retried_call(otel: Otel, servers: list[LoopbackServer]) -> None:
    # A 429 reporting its limit spent for every caller: it cools the replica at once (one without such headers
    # would at the third in a row).
    spent = {"retry-after": "5", "x-ratelimit-remaining-requests": "0"}
    servers[0].script = Script(status=429, headers=spent)
    async with e2e_guard(otel, [s.url for s in servers[:2]]) as guard, guard.http_client() as client:
        response = await client.post(servers[0].url + CHAT, json=STREAM_BODY)
        assert response.status_code == 200
    logical, (first, retry) = by_name(otel.finished())
    assert logical.status.status_code is StatusCode.UNSET and "error.type" not in (logical.attributes or {})
    fa, ra = first.attributes or {}, retry.attributes or {}
    assert (fa["error.type"], fa["llmguard.retry_after_s"], fa["http.response.status_code"]) == ("429", 5.0, 429)
    assert (ra["http.request.resend_count"], ra["llmguard.attempt.kind"]) == (1, "retry")
    (cool,) = points(otel.metrics()[sc.LLMGUARD_CLIENT_REPLICA_COOLDOWNS])
    assert cool.attributes["llmguard.cooldown.reason"] == "retry_after"
    assert cool.attributes["server.port"] == servers[0].port


async def test_e2e_no_secret_or_prompt_anywhere(otel: Otel, servers: list[LoopbackServer]) -> None:
    from llmguard_client import Replica

    completion = {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "model": "test-model",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "SECRET COMPLETION"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    servers[0].script = Script(body=completion)
    replica = Replica(f"http://alice:hunter2@127.0.0.1:{servers[0].port}", headers={"api-key": "sk-live-SECRET"})
    body = {**STREAM_BODY, "stream": False}
    async with e2e_guard(otel, [replica]) as guard, guard.http_client() as client:
        url = servers[0].url + CHAT + "?key=tok-QUERY"
        response = await client.post(url, json=body, headers={"authorization": "Bearer sk-live-SECRET"})
    assert "SECRET COMPLETION" in response.text
    assert servers[0].received[0].headers["api-key"] == "sk-live-SECRET"  # sent, but never recorded
    assert servers[0].received[0].headers["authorization"] == "Basic YWxpY2U6aHVudGVyMg=="  # alice:hunter2, the same
    (_, (attempt,)) = by_name(otel.finished())
    # The attempt's URL carries no userinfo (the replica's credential goes in its Authorization header), the caller's
    # query values are redacted.
    assert (attempt.attributes or {})["url.full"] == f"http://127.0.0.1:{servers[0].port}{CHAT}?key=REDACTED"
    texts = all_strings(otel)
    for secret in (*SECRETS, "YWxpY2U6aHVudGVyMg"):
        assert not any(secret in text for text in texts), secret


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"attempt_spans": "no"}, ("attempt_spans must be True or False", "'no'")),
        ({"propagate": None}, ("propagate must be True or False", "None")),
        ({"gen_ai_attributes": 0}, ("gen_ai_attributes must be True or False", "0")),
        ({"gen_ai_metrics": "off"}, ("gen_ai_metrics must be True or False", "'off'")),
        ({"provider_name": 123}, ("provider_name must be a non-empty str", "'openai'", "123")),
        ({"provider_name": ""}, ("provider_name must be a non-empty str", "''")),
        ({"tracer_provider": "x"}, ("tracer_provider must be an OpenTelemetry TracerProvider", "or None", "'x'")),
        ({"meter_provider": 1}, ("meter_provider must be an OpenTelemetry MeterProvider", "or None", "1")),
    ],
    ids=[
        "attempt_spans",
        "propagate",
        "gen_ai_attributes",
        "gen_ai_metrics",
        "provider_name_int",
        "provider_name_empty",
        "tracer_provider",
        "meter_provider",
    ],
)
def test_a_bad_argument_is_refused_when_built(kwargs: dict[str, Any], fragments: tuple[str, ...]) -> None:
    """``attempt_spans="no"`` (truthy: on) and ``provider_name=123`` were accepted, ``tracer_provider="x"`` a raw
    AttributeError: each is a GuardConfigError naming the argument, its value and what is accepted."""
    with pytest.raises(GuardConfigError) as info:
        OpenTelemetryInstrumentation(**kwargs)
    message = str(info.value)
    assert message.startswith("OpenTelemetryInstrumentation.")
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


@pytest.mark.parametrize("stream", [False, True])
def test_a_sync_calls_logical_span_is_a_child_of_the_callers_current_span(
    otel: Otel, servers: list[LoopbackServer], stream: bool
) -> None:
    """The call runs on the Guard's own loop thread, but its span still joins the caller's trace."""
    servers[0].script = Script(tokens=3, gap=0.001)
    guard = e2e_guard(otel, [servers[0].url])
    tracer = otel.tracer_provider.get_tracer("app")
    try:
        with tracer.start_as_current_span("handler") as handler, guard.sync_http_client() as client:
            response = client.post(servers[0].url + CHAT, json={**STREAM_BODY, "stream": stream})
            assert response.status_code == 200
    finally:
        guard.close()
    (logical,) = [span for span in otel.finished() if span.name == "chat test-model"]
    assert logical.parent is not None and logical.parent.span_id == handler.get_span_context().span_id
    assert logical.context.trace_id == handler.get_span_context().trace_id
