"""Spans and metrics of a continued stream (`ContinuationPolicy`): a real `Guard`, real loopback servers and
the OTel SDK's in-memory exporter and reader (the ``otel`` fixture)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from opentelemetry.trace import StatusCode

from llmguard_client import BudgetPolicy, ContinuationPolicy, Guard, PhaseRecord, Tier
from llmguard_client.telemetry import semconv as sc
from tests.core.test_transport import CHAT, STREAM_BODY
from tests.loopback import LoopbackServer, Script
from tests.telemetry.otel_harness import Otel, by_name, points

BODY: dict[str, Any] = {**STREAM_BODY, "max_tokens": 10}
FIRST5 = "".join(f" t{i}" for i in range(5))


def guard(otel: Otel, servers: list[LoopbackServer], policy: ContinuationPolicy, **kw: Any) -> Guard:
    return Guard(
        replicas=[s.url for s in servers],
        tiers={"interactive": Tier(ttft=2.0, total=10.0, stall=2.0)},
        hedge=None,
        continuation=policy,
        instrumentation=otel.instrumentation(),
        **kw,
    )


async def test_a_continued_stream_shows_its_continuation_attempt(otel: Otel, servers: list[LoopbackServer]) -> None:
    for s in servers[:2]:
        s.script = Script(tokens=10, reset_after_tokens=5, continued=Script(tokens=None))
    async with guard(otel, servers[:2], ContinuationPolicy()) as g, g.http_client() as client:
        async with client.stream("POST", servers[0].url + CHAT, json=BODY) as response:
            await response.aread()
    logical, (broken, continued) = by_name(otel.finished())
    la, ba, ca = logical.attributes or {}, broken.attributes or {}, continued.attributes or {}
    assert la["llmguard.status"] == "ok" and la[sc.LLMGUARD_CONTINUED] is True
    assert sc.LLMGUARD_NOT_CONTINUED not in la and "error.type" not in la
    assert logical.status.status_code is StatusCode.UNSET
    assert la["llmguard.attempts"] == 2 and la["gen_ai.usage.output_tokens"] == 10

    assert (ba["llmguard.attempt.kind"], ba["llmguard.attempt.outcome"]) == ("primary", "failed")
    assert broken.status.status_code is StatusCode.ERROR
    cause = ba["error.type"]
    assert cause in ("read_error", "remote_protocol_error", "stream_truncated")
    assert sc.LLMGUARD_RESUMED_AT not in ba

    assert (ca["llmguard.attempt.kind"], ca["llmguard.attempt.outcome"]) == ("continuation", "won")
    assert ca[sc.LLMGUARD_RESUMED_AT] == len(FIRST5)
    assert ca[sc.LLMGUARD_RESUMED_TOKENS] == 5
    assert ca[sc.LLMGUARD_BREAK_CAUSE] == cause
    assert ca["http.request.resend_count"] == 1 and ca["server.port"] != ba["server.port"]
    assert continued.status.status_code is StatusCode.UNSET
    assert continued.parent is not None and continued.parent.span_id == logical.context.span_id

    kinds = {(p.attributes["llmguard.attempt.kind"], p.attributes["llmguard.attempt.outcome"]): p.value
             for p in points(otel.metrics()[sc.LLMGUARD_CLIENT_ATTEMPTS])}  # fmt: skip
    assert kinds == {("primary", "failed"): 1, ("continuation", "won"): 1}


async def test_a_continued_call_names_the_replica_it_ended_on(otel: Otel, servers: list[LoopbackServer]) -> None:
    """The record's replica and the call's ``server.*`` are the winner's: the continuation's, not the broken one's."""
    for s in servers[:2]:
        s.script = Script(tokens=10, reset_after_tokens=5, continued=Script(tokens=None))
    records: list[PhaseRecord] = []
    async with guard(otel, servers[:2], ContinuationPolicy(), on_record=records.append) as g, g.http_client() as client:
        async with client.stream("POST", servers[0].url + CHAT, json=BODY) as response:
            await response.aread()
    (record,) = records
    broken, continued = record.attempts
    assert (broken.outcome, continued.kind, continued.outcome) == ("failed", "continuation", "won")
    assert record.replica == continued.replica != broken.replica
    port = int(continued.replica.rsplit(":", 1)[1])
    logical, _ = by_name(otel.finished())
    assert (logical.attributes or {})["server.port"] == port
    (call_point,) = points(otel.metrics()[sc.GEN_AI_CLIENT_OPERATION_DURATION])
    assert call_point.attributes["server.port"] == port


async def test_a_break_not_continued_says_why(otel: Otel, servers: list[LoopbackServer]) -> None:
    for s in servers[:2]:
        s.script = Script(tokens=10, reset_after_tokens=5, continued=Script(tokens=None))
    policy = ContinuationPolicy(budget=BudgetPolicy(ratio=0.0, floor=0))
    async with guard(otel, servers[:2], policy) as g, g.http_client() as client:
        with pytest.raises(httpx.HTTPError):
            async with client.stream("POST", servers[0].url + CHAT, json=BODY) as response:
                await response.aread()
    logical, (attempt,) = by_name(otel.finished())
    la = logical.attributes or {}
    assert la[sc.LLMGUARD_NOT_CONTINUED] == "budget" and sc.LLMGUARD_CONTINUED not in la
    assert la["llmguard.status"] == "error" and la["llmguard.budget_refusals"] == 1
    assert (attempt.attributes or {})["llmguard.attempt.kind"] == "primary"
