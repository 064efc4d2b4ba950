"""Calls the guard refuses before they start, as an openai caller sees them: one attempt, one clear error.

After ``Guard.aclose()``, or with an ``x-llmguard-tier`` / ``x-llmguard-cohort`` header naming nothing the
guard has, the default ``failure_mode="auto"`` answers the SDK with a proxy-style error response carrying
``x-should-retry: false``: the SDK raises at once instead of retrying a "connection error" with backoff.
Attempts are counted at the SDK's HTTP client, so a retry shows up as a second attempt.
"""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from llmguard_client import Guard, Tier, guard_failure
from llmguard_client.edges.httpx2_async import Httpx2GuardTransport
from llmguard_client.edges.httpx2_sync import SyncHttpx2GuardTransport
from tests.edges.conftest import pools
from tests.loopback import LoopbackServer

openai = pytest.importorskip("openai")
MESSAGES: Any = [{"role": "user", "content": "hi"}]
TIERS = {"interactive": Tier(ttft=2.0, total=10.0), "batch": Tier(ttft=5.0, total=20.0)}


class CountingAsync(httpx2.AsyncBaseTransport):
    """The guard's async httpx2 edge, counting the requests the SDK sends through it."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner
        self.attempts = 0

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.attempts += 1
        return await self.inner.handle_async_request(request)


class CountingSync(httpx2.BaseTransport):
    """The guard's sync httpx2 edge, counting the requests the SDK sends through it."""

    def __init__(self, inner: httpx2.BaseTransport) -> None:
        self.inner = inner
        self.attempts = 0

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        self.attempts += 1
        return self.inner.handle_request(request)


def guard_over(servers: list[LoopbackServer], **kwargs: Any) -> Guard:
    return Guard([s.url for s in servers], tiers=TIERS, instrumentation=None, transport_factory=pools, **kwargs)


async def test_a_call_after_aclose_fails_once_and_is_not_retried(servers: list[LoopbackServer]) -> None:
    guard = guard_over(servers)
    counting = CountingAsync(Httpx2GuardTransport(guard.transport))
    async with httpx2.AsyncClient(transport=counting) as http:
        client = openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="k", http_client=http)  # max_retries=2
        await client.chat.completions.create(model="m", messages=MESSAGES)
        await guard.aclose()
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES)
    assert counting.attempts == 2  # the call before the close, and exactly one after it
    assert (caught.value.status_code, guard_failure(caught.value)) == (503, "guard_closed")
    assert "closed" in caught.value.message and caught.value.response.headers["x-should-retry"] == "false"
    assert sum(len(s.received) for s in servers) == 1


def test_a_sync_call_after_close_fails_once_and_is_not_retried(servers: list[LoopbackServer]) -> None:
    guard = guard_over(servers)
    counting = CountingSync(SyncHttpx2GuardTransport(guard))
    with httpx2.Client(transport=counting) as http:
        client = openai.OpenAI(base_url=servers[0].url + "/v1", api_key="k", http_client=http)
        client.chat.completions.create(model="m", messages=MESSAGES)
        guard.close()
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="m", messages=MESSAGES)
    assert counting.attempts == 2
    assert (caught.value.status_code, guard_failure(caught.value)) == (503, "guard_closed")
    assert caught.value.response.headers["x-should-retry"] == "false"


@pytest.mark.parametrize("rollout", [1.0, 0.0], ids=["guarded", "off"])
@pytest.mark.parametrize(
    ("header", "value", "cause", "named"),
    [
        ("x-llmguard-tier", "interactve", "unknown_tier", "batch, interactive"),
        ("x-llmguard-cohort", "treatment", "unknown_cohort", "guarded, control"),
    ],
    ids=["tier", "cohort"],
)
async def test_a_bad_guard_header_is_a_400_that_is_not_retried(
    servers: list[LoopbackServer], rollout: float, header: str, value: str, cause: str, named: str
) -> None:
    async with guard_over(servers, rollout=rollout) as guard:
        counting = CountingAsync(Httpx2GuardTransport(guard.transport))
        async with httpx2.AsyncClient(transport=counting) as http:
            client = openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="k", http_client=http)
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model="m", messages=MESSAGES, extra_headers={header: value})
    assert counting.attempts == 1
    assert guard_failure(caught.value) == cause
    assert repr(value) in caught.value.message and named in caught.value.message and header in caught.value.message
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert sum(len(s.received) for s in servers) == 0
