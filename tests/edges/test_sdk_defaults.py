"""The clients the guard hands out keep the defaults of the SDKs' own clients: timeout, redirects, pool limits;
and an SDK given one behaves as with its own (it follows a redirect, it sends ``x-stainless-read-timeout``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from llmguard_client import Guard, Tier
from tests.edges.conftest import pools
from tests.loopback import LoopbackServer, Script

openai = pytest.importorskip("openai")
pytest.importorskip("httpx2")


def sdk_anthropic() -> Any:
    """The anthropic SDK, imported by the first test that uses it, not when the module is collected: the import
    takes ~1.7 s of CPU, and every xdist worker collects every module (the module's tests share one worker,
    tests/scheduling.py)."""
    return pytest.importorskip("anthropic")


GuardFactory = Callable[[Guard], Any]
PAIRS: list[tuple[str, GuardFactory, Callable[[], Any]]] = [
    ("http_client / openai async httpx", lambda g: g.http_client(), lambda: openai.DefaultAsyncHttpxClient()),
    ("sync_http_client / openai sync httpx", lambda g: g.sync_http_client(), lambda: openai.DefaultHttpxClient()),
    ("httpx2_client / openai async", lambda g: g.httpx2_client(), lambda: openai.DefaultAsyncHttpx2Client()),
    ("sync_httpx2_client / openai sync", lambda g: g.sync_httpx2_client(), lambda: openai.DefaultHttpx2Client()),
    ("httpx2_client / anthropic async", lambda g: g.httpx2_client(), lambda: sdk_anthropic().DefaultAsyncHttpxClient()),
    (
        "sync_httpx2_client / anthropic sync",
        lambda g: g.sync_httpx2_client(),
        lambda: sdk_anthropic().DefaultHttpxClient(),
    ),
    (
        "http_client_for(AsyncOpenAI)",
        lambda g: g.http_client_for(openai.AsyncOpenAI),
        lambda: openai.DefaultAsyncHttpx2Client(),
    ),
    ("http_client_for(OpenAI)", lambda g: g.http_client_for(openai.OpenAI), lambda: openai.DefaultHttpx2Client()),
    (
        "http_client_for(AsyncAnthropic)",
        lambda g: g.http_client_for(sdk_anthropic().AsyncAnthropic),
        lambda: sdk_anthropic().DefaultAsyncHttpxClient(),
    ),
    (
        "http_client_for(Anthropic)",
        lambda g: g.http_client_for(sdk_anthropic().Anthropic),
        lambda: sdk_anthropic().DefaultHttpxClient(),
    ),
]


def timeouts(timeout: Any) -> tuple[object, ...]:
    return (timeout.connect, timeout.read, timeout.write, timeout.pool)


@pytest.fixture
def guard() -> Iterator[Guard]:
    with Guard(["http://127.0.0.1:9"], instrumentation=None) as built:  # the default pools: what is compared
        yield built


@pytest.mark.parametrize(("name", "ours", "theirs"), PAIRS, ids=[p[0] for p in PAIRS])
def test_a_guarded_client_has_the_sdks_default_timeout_redirects_and_pool_limits(
    guard: Guard, name: str, ours: GuardFactory, theirs: Callable[[], Any]
) -> None:
    guarded, default = ours(guard), theirs()
    try:
        assert timeouts(guarded.timeout) == timeouts(default.timeout)
        assert guarded.follow_redirects is default.follow_redirects is True
        pool = guard._replica_set.states[0].transport._pool  # type: ignore[attr-defined]
        sdk_pool = default._transport._pool
        assert (pool._max_connections, pool._max_keepalive_connections) == (
            sdk_pool._max_connections,
            sdk_pool._max_keepalive_connections,
        )
    finally:
        if not hasattr(default, "aclose"):
            default.close()


def redirect_once(server: LoopbackServer, path: str) -> Callable[[int, int], Script | None]:
    def script(index: int, attempt: int) -> Script | None:
        return Script(status=307, body={}, headers={"location": server.url + path}) if attempt == 1 else None

    return script


MESSAGES: Any = [{"role": "user", "content": "req1 hi"}]


async def test_openai_through_the_guard_follows_a_redirect_as_with_its_own_client(
    servers: list[LoopbackServer],
) -> None:
    server = servers[0]
    server.scripter = redirect_once(server, "/v1/chat/completions")
    async with Guard([server.url], tiers={"t": Tier(10, 20)}, instrumentation=None, transport_factory=pools) as g:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", http_client=g.httpx2_client())
        done = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert done.choices[0].message.content
    assert len(server.received) == 2


async def test_anthropic_through_the_guard_follows_a_redirect_as_with_its_own_client(
    servers: list[LoopbackServer],
) -> None:
    server = servers[0]
    server.scripter = redirect_once(server, "/v1/messages")
    anthropic = sdk_anthropic()
    async with Guard([server.url], tiers={"t": Tier(10, 20)}, instrumentation=None, transport_factory=pools) as g:
        client = anthropic.AsyncAnthropic(base_url=server.url, api_key="k", http_client=g.httpx2_client())
        done = await client.messages.create(model="m", max_tokens=5, messages=MESSAGES)
    assert done.content
    assert len(server.received) == 2


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_the_sdk_sends_its_read_timeout_through_a_guarded_client_as_through_its_own(
    servers: list[LoopbackServer], sdk: str
) -> None:
    server = servers[0]
    with Guard([server.url], tiers={"t": Tier(10, 20)}, instrumentation=None, transport_factory=pools) as g:
        if sdk == "openai":
            oai = openai.OpenAI(base_url=server.url + "/v1", api_key="k", http_client=g.sync_httpx2_client())
            oai.chat.completions.create(model="m", messages=MESSAGES)
            plain = openai.OpenAI(base_url=server.url + "/v1", api_key="k")
            plain.chat.completions.create(model="m", messages=MESSAGES)
        else:
            anthropic = sdk_anthropic()
            ant = anthropic.Anthropic(base_url=server.url, api_key="k", http_client=g.sync_httpx2_client())
            ant.messages.create(model="m", max_tokens=5, messages=MESSAGES)
            plain_ant = anthropic.Anthropic(base_url=server.url, api_key="k")
            plain_ant.messages.create(model="m", max_tokens=5, messages=MESSAGES)
    guarded, own = (r.headers.get("x-stainless-read-timeout") for r in server.received)
    assert guarded == own == "600"


async def test_a_deadline_mid_stream_is_raised_as_the_sdk_raises_its_own_read_timeout(
    servers: list[LoopbackServer],
) -> None:
    """openai >= 3.57 wraps an error raised while a stream is read (`APITimeoutError`); earlier 3.x releases
    (3.3, which the frameworks resolve) let the HTTP client's own exception through. Either way the guard's
    stall deadline reaches the caller as the SDK's own read timeout does: the same kind of exception."""
    import httpx2

    server = servers[0]
    server.script = Script(tokens=5, stall_after_first=3.0)

    async def read(client: Any) -> BaseException:
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        with pytest.raises((openai.APIError, httpx2.HTTPError)) as caught:
            async for _ in stream:
                pass
        return caught.value

    own = await read(openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", timeout=0.5, max_retries=0))
    tier = {"t": Tier(ttft=10, total=20, stall=0.5)}
    async with Guard([server.url], tiers=tier, instrumentation=None, transport_factory=pools) as g:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", http_client=g.httpx2_client())
        guarded = await read(client)
    kind = openai.APITimeoutError if isinstance(own, openai.APIError) else httpx2.TimeoutException
    assert isinstance(own, kind)
    assert isinstance(guarded, kind)
