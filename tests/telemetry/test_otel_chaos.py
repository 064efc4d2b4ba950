"""An attempt's span names the faults `Chaos` injected into it (``llmguard.chaos``): a real `Guard`, real loopback
servers and the OTel SDK's in-memory exporter (the ``otel`` fixture)."""

from __future__ import annotations

import pytest

from llmguard_client import Chaos, Guard, Tier
from llmguard_client._chaos import CHAOS_ENV
from llmguard_client.telemetry import semconv as sc
from tests.core.test_transport import CHAT, STREAM_BODY
from tests.loopback import LoopbackServer
from tests.telemetry.otel_harness import Otel, by_name


async def test_the_attempt_span_names_the_injected_fault(
    otel: Otel, servers: list[LoopbackServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CHAOS_ENV, "1")
    a = servers[0].url
    guard = Guard(
        replicas=[s.url for s in servers[:2]],
        tiers={"interactive": Tier(ttft=10.0, total=30.0)},
        hedge=None,
        instrumentation=otel.instrumentation(),
        chaos=Chaos(rate_limited=1.0, latency=1.0, latency_for=0.01, replicas=[a]),
    )
    async with guard, guard.http_client() as client:
        response = await client.post(a + CHAT, json=STREAM_BODY)
    assert response.status_code == 200
    _, (injected, clean) = by_name(otel.finished())
    ia, ca = injected.attributes or {}, clean.attributes or {}
    assert ia[sc.LLMGUARD_CHAOS] == ("latency", "status_429")
    assert ia["http.response.status_code"] == 429 and ia[sc.LLMGUARD_RETRY_AFTER] == 1.0
    assert sc.LLMGUARD_CHAOS not in ca and ca["llmguard.attempt.outcome"] == "won"
