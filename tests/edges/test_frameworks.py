"""LangChain, instructor, pydantic-ai and litellm through a Guard (``-m frameworks``; docs/integrations.md).

For each: the injection point puts the guard in the path (the guard records the call), the per-call tier
header reaches the guard (and is not forwarded), and a missed deadline reaches the framework's caller as the
error docs/integrations.md names. Real frameworks over the openai SDK, against a real loopback server.
Needs ``pip install langchain-openai instructor pydantic-ai-slim[openai] litellm``.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from llmguard_client import Guard, Tier, guard_failure
from tests.edges.conftest import pools
from tests.loopback import LoopbackServer, Script

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm fetches a price list from GitHub otherwise
pytestmark = [pytest.mark.frameworks, pytest.mark.filterwarnings("ignore::UserWarning:pydantic")]  # litellm's models
openai = pytest.importorskip("openai")
pytest.importorskip("httpx2")

TIERS = {"interactive": Tier(ttft=10, total=20), "fast": Tier(ttft=0.3, total=10)}
CITY = {"name": "Paris", "population": 2}


def completion(content: str) -> dict[str, Any]:
    """A chat completion whose message is ``content`` (the answer every framework parses)."""
    return {
        "id": "c1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


@pytest.fixture
async def guard(servers: list[LoopbackServer]) -> AsyncIterator[Guard]:
    async with Guard([servers[0].url], tiers=TIERS, instrumentation=None, transport_factory=pools) as built:
        yield built


def async_openai(guard: Guard, server: LoopbackServer) -> Any:
    return openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI)
    )


# --- each framework: one call, with an optional per-call tier ----------------------------------------------


async def langchain_call(guard: Guard, server: LoopbackServer, tier: str | None) -> str:
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(
        model="m",
        base_url=server.url + "/v1",
        api_key="k",
        http_client=guard.http_client_for(openai.OpenAI),
        http_async_client=guard.http_client_for(openai.AsyncOpenAI),
        default_headers={"x-llmguard-tier": tier} if tier else None,
    )
    reply = await llm.ainvoke("hi")
    return str(reply.content)


async def instructor_call(guard: Guard, server: LoopbackServer, tier: str | None) -> str:
    instructor = pytest.importorskip("instructor")
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        population: int

    client = instructor.from_openai(async_openai(guard, server), mode=instructor.Mode.JSON)
    city = await client.chat.completions.create(
        model="m",
        response_model=City,
        messages=[{"role": "user", "content": "hi"}],
        max_retries=0,
        extra_headers={"x-llmguard-tier": tier} if tier else None,
    )
    return city.name


async def pydantic_ai_call(guard: Guard, server: LoopbackServer, tier: str | None) -> str:
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("m", provider=OpenAIProvider(openai_client=async_openai(guard, server)))
    settings: Any = {"extra_headers": {"x-llmguard-tier": tier}} if tier else None
    result = await pydantic_ai.Agent(model).run("hi", model_settings=settings)
    return str(result.output)


async def litellm_call(guard: Guard, server: LoopbackServer, tier: str | None) -> str:
    litellm = pytest.importorskip("litellm")
    reply = await litellm.acompletion(
        model="openai/m",
        messages=[{"role": "user", "content": "hi"}],
        api_base=server.url + "/v1",
        api_key="k",
        client=async_openai(guard, server),
        num_retries=0,
        extra_headers={"x-llmguard-tier": tier} if tier else None,
    )
    return str(reply.choices[0].message.content)


Caller = Callable[[Guard, LoopbackServer, "str | None"], Awaitable[str]]
FRAMEWORKS: dict[str, Caller] = {
    "langchain-openai": langchain_call,
    "instructor": instructor_call,
    "pydantic-ai": pydantic_ai_call,
    "litellm": litellm_call,
}
DEADLINE_ERRORS = {
    # the error (class name, status code) a missed deadline reaches each framework's caller as, in the default
    # failure mode (docs/integrations.md): the guard raises its timeout, the SDK makes it an APITimeoutError
    "langchain-openai": ("OpenAITimeoutError", None),  # an openai.APITimeoutError and langchain's ModelTimeoutError
    "instructor": ("InstructorRetryException", None),  # from the openai.APITimeoutError
    "pydantic-ai": ("ModelAPIError", None),  # pydantic-ai's error for a request that got no answer
    "litellm": ("Timeout", 408),  # litellm.Timeout
}


@pytest.mark.parametrize("name", FRAMEWORKS)
async def test_the_framework_calls_through_the_guard_with_its_tier(
    servers: list[LoopbackServer], guard: Guard, name: str
) -> None:
    server = servers[0]
    server.script = Script(body=completion(json.dumps(CITY)))
    with guard.capture() as calls:
        answer = await FRAMEWORKS[name](guard, server, "fast")
    assert "Paris" in answer
    assert [(r.tier, r.status) for r in calls] == [("fast", "ok")]
    assert all("x-llmguard-tier" not in r.headers for r in server.received)


@pytest.mark.parametrize("name", FRAMEWORKS)
async def test_a_missed_deadline_reaches_the_frameworks_caller_as_documented(
    servers: list[LoopbackServer], guard: Guard, name: str
) -> None:
    server = servers[0]
    server.script = Script(hang_before_headers=5.0)
    with pytest.raises(Exception) as caught:
        await FRAMEWORKS[name](guard, server, "fast")
    assert (type(caught.value).__name__, getattr(caught.value, "status_code", None)) == DEADLINE_ERRORS[name]
    assert guard_failure(caught.value) == "ttft_timeout"  # read through the framework's wrapping
    assert server.wait_for(lambda: len(server.received) == 1)
    assert len(server.received) == 1  # no retry stacked on top by the framework or the SDK


async def test_chatopenai_without_an_async_client_goes_around_the_guard_on_ainvoke(
    servers: list[LoopbackServer], guard: Guard
) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    server = servers[0]
    llm = langchain_openai.ChatOpenAI(
        model="m", base_url=server.url + "/v1", api_key="k", http_client=guard.http_client_for(openai.OpenAI)
    )
    with guard.capture() as calls:
        await llm.ainvoke("hi")
    assert len(server.received) == 1
    assert calls == []  # sent by the SDK's own client: no deadline, no retry budget, no record


async def test_chatopenai_without_a_sync_client_goes_around_the_guard_on_invoke(
    servers: list[LoopbackServer], guard: Guard
) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    server = servers[0]
    llm = langchain_openai.ChatOpenAI(
        model="m",
        base_url=server.url + "/v1",
        api_key="k",
        http_async_client=guard.http_client_for(openai.AsyncOpenAI),
    )
    with guard.capture() as calls:
        llm.invoke("hi")  # the SDK's own sync client, on this thread
    assert len(server.received) == 1
    assert calls == []


async def test_litellms_sdk_retries_no_deadline_a_raise_mode_guard_gave_up_on(servers: list[LoopbackServer]) -> None:
    """litellm sets the openai client's ``max_retries`` to its own default (2) on every call (the plain SDK sends 3
    requests here). The guard gives the SDK a deadline it gave up on as openai's own ``APITimeoutError``, which the
    SDK passes on without a retry: one request reaches the guard, and it sends only its own attempts."""
    litellm = pytest.importorskip("litellm")
    server = servers[0]
    server.script = Script(hang_before_headers=5.0)
    reached_guard: list[str | None] = []

    async def count(request: Any) -> None:
        reached_guard.append(request.headers.get("x-stainless-retry-count"))

    async with Guard(
        [server.url], tiers=TIERS, instrumentation=None, transport_factory=pools, failure_mode="raise"
    ) as guard:
        http = guard.http_client_for(openai.AsyncOpenAI, event_hooks={"request": [count]})
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", http_client=http)
        with guard.capture() as calls, pytest.raises(litellm.Timeout) as caught:
            await litellm.acompletion(
                model="openai/m",
                messages=[{"role": "user", "content": "hi"}],
                api_base=server.url + "/v1",
                api_key="k",
                client=client,
                extra_headers={"x-llmguard-tier": "fast"},
            )
    assert reached_guard == ["0"]  # no retry of litellm's SDK on top of the guard
    assert guard_failure(caught.value) == "ttft_timeout"
    (call,) = calls  # one call, its attempts the guard's own
    assert server.wait_for(lambda: len(server.received) >= len(call.attempts))
    assert len(server.received) == len(call.attempts)
