"""A server's error answer reaches the caller as that answer: its whole body, however long, on every path that hands
one back (the last answer after the guard's retries, after the budget emptied, a 4xx it does not retry), streamed or
not, sync or async, through the openai and anthropic SDKs: each caller's error is the one it gets without a guard."""

from __future__ import annotations

from typing import Any

import pytest

from llmguard_client import BudgetPolicy, Guard, GuardClosed, RetryPolicy, Tier, guard_failure
from tests.edges.conftest import pools
from tests.loopback import LoopbackServer, Script

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

MESSAGES: Any = [{"role": "user", "content": "hi"}]
LONG_ERROR = {"error": {"message": "the server's own words " * 12_000, "type": "x", "code": "big", "param": None}}
"""About 300 KB of JSON: well past the 64 KiB of an error body the guard keeps."""
EMPTY = {"budget": BudgetPolicy(ratio=0.0, floor=0)}
SCENARIOS: dict[str, tuple[int, dict[str, Any], str | None, int]] = {
    # status, Guard options, x-llmguard-cause, the guarded call's attempts
    "a 500 retried until the attempts are spent": (500, {}, "upstream_status", 3),
    # A replica's own failure (a 500) is retried paced past an empty budget; a 429 asking for more rest than the
    # guard waits is not sent back there, and its retry elsewhere is refused.
    "a 429 not retried: the budget is empty": (429, EMPTY, "budget_exhausted", 1),
    "a 400 the guard does not retry": (400, {}, None, 1),
}


def guard_over(servers: list[LoopbackServer], status: int, options: dict[str, Any]) -> Guard:
    for server in servers:
        server.script = Script(status=status, body=LONG_ERROR, headers={"retry-after": "1000"} if status == 429 else {})
    retry = RetryPolicy(backoff_initial=0.001, backoff_max=0.002)
    return Guard(
        [s.url for s in servers],
        tiers={"t": Tier(ttft=10.0, total=20.0)},
        retry=retry,
        hedge=None,
        instrumentation=None,
        transport_factory=pools,
        **options,
    )


async def sdk_error(sdk: str, url: str, stream: bool, http_client: Any = None) -> Any:
    """The error an async SDK client raises for the call (``http_client`` None: the plain client's own)."""
    kwargs: dict[str, Any] = {} if http_client is None else {"http_client": http_client}
    if sdk == "openai":
        client: Any = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0, **kwargs)
        call = client.chat.completions.create(model="m", messages=MESSAGES, stream=stream)
    else:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0, **kwargs)
        call = client.messages.create(model="m", max_tokens=16, messages=MESSAGES, stream=stream)
    try:
        with pytest.raises(openai.APIStatusError if sdk == "openai" else anthropic.APIStatusError) as caught:
            await call
    finally:
        await client.close()
    return caught.value


def assert_same_answer(guarded: Any, plain: Any, status: int, cause: str | None) -> None:
    assert type(guarded) is type(plain) and guarded.status_code == plain.status_code == status
    assert guarded.response.content == plain.response.content  # the whole body, byte for byte
    assert guarded.body == plain.body and isinstance(guarded.body, dict)
    assert guarded.message == plain.message
    assert guarded.response.headers.get("x-llmguard-cause") == cause


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_an_async_caller_gets_a_long_error_answer_whole(
    servers: list[LoopbackServer], scenario: str, sdk: str, stream: bool
) -> None:
    status, options, cause, attempts = SCENARIOS[scenario]
    async with guard_over(servers, status, options) as guard:
        url = servers[0].url
        plain = await sdk_error(sdk, url, stream)
        guarded_client = guard.http_client_for(openai.AsyncOpenAI if sdk == "openai" else anthropic.AsyncAnthropic)
        guarded = await sdk_error(sdk, url, stream, guarded_client)
    assert_same_answer(guarded, plain, status, cause)
    assert sum(len(s.received) for s in servers) == 1 + attempts
    if sdk == "openai":
        assert guarded.type == "x" and guarded.code == "big"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_sync_caller_gets_a_long_error_answer_whole(
    servers: list[LoopbackServer], scenario: str, stream: bool
) -> None:
    status, options, cause, attempts = SCENARIOS[scenario]
    errors = []
    with guard_over(servers, status, options) as guard:
        for http_client in (None, guard.http_client_for(openai.OpenAI)):
            kwargs: dict[str, Any] = {} if http_client is None else {"http_client": http_client}
            with openai.OpenAI(base_url=servers[0].url + "/v1", api_key="k", max_retries=0, **kwargs) as client:
                with pytest.raises(openai.APIStatusError) as caught:
                    client.chat.completions.create(model="m", messages=MESSAGES, stream=stream)
            errors.append(caught.value)
    plain, guarded = errors
    assert_same_answer(guarded, plain, status, cause)
    assert sum(len(s.received) for s in servers) == 1 + attempts


async def test_closing_the_guard_while_a_caller_reads_a_long_error_answer_ends_the_read_with_guard_closed(
    servers: list[LoopbackServer],
) -> None:
    """The caller reads the rest of a long error answer from the server; `Guard.aclose()` meanwhile closes that
    connection, and the read ends in `GuardClosed`, as a stream's read does, not in a bare `httpx.ReadError`."""
    async with guard_over(servers, 400, {}) as guard, guard.http_client() as client:
        async with client.stream("POST", servers[0].url + "/v1/chat/completions", json={"model": "m"}) as response:
            assert response.status_code == 400
            await guard.aclose()
            with pytest.raises(GuardClosed) as caught:
                await response.aread()
    assert guard_failure(caught.value) == "guard_closed"
