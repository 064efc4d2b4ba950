"""The logical span says when the guard gave a call one attempt only (a body it cannot send twice): a real
`Guard`, real loopback servers and the OTel SDK's in-memory exporter (the ``otel`` fixture)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from llmguard_client import Guard, Tier
from llmguard_client.telemetry import semconv as sc
from tests.core.test_transport import CHAT
from tests.loopback import LoopbackServer
from tests.telemetry.otel_harness import Otel

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).encode()


async def chunks() -> AsyncIterator[bytes]:
    yield BODY[:10]
    yield BODY[10:]


async def test_a_streamed_body_is_marked_on_the_logical_span(otel: Otel, servers: list[LoopbackServer]) -> None:
    guard = Guard(
        replicas=[s.url for s in servers[:2]],
        tiers={"interactive": Tier(ttft=5.0, total=10.0)},
        instrumentation=otel.instrumentation(),
    )
    headers = {"content-type": "application/json"}
    async with guard, guard.http_client() as client:
        streamed = await client.post(servers[0].url + CHAT, content=chunks(), headers=headers)
        in_memory = await client.post(servers[0].url + CHAT, content=BODY, headers=headers)
    assert streamed.status_code == in_memory.status_code == 200
    logical = sorted((s for s in otel.finished() if s.parent is None), key=lambda s: s.start_time or 0)
    first, second = (span.attributes or {} for span in logical)
    assert first[sc.LLMGUARD_ONE_ATTEMPT] == "streamed_body" and first["llmguard.attempts"] == 1
    assert sc.LLMGUARD_ONE_ATTEMPT not in second
