"""The guard sends through the proxy the environment names, chosen as the SDKs' own httpx and httpx2 clients
choose it: directly wherever either would connect directly.

A stdlib HTTP server stands for the proxy: it records each request line (a proxied request names the whole URL)
and answers a short SSE stream itself. The replica's own address refuses connections, so a call answered at
all went through the proxy.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import ModuleType
from typing import Any

import httpx
import httpx2
import pytest

from llmguard_client import Guard, Tier
from llmguard_client._http.proxy import environment_proxy
from llmguard_client.errors import GuardConfigError

ANSWER = (
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"via proxy"}}]}\n\n'
    b"data: [DONE]\n\n"
)
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


class _Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[str]

    def do_POST(self) -> None:
        self.seen.append(self.requestline)
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def do_CONNECT(self) -> None:
        """A tunnel to an https replica: refused, this proxy wants credentials nobody gave."""
        self.seen.append(self.requestline)
        self.send_response(407, "Proxy Authentication Required")
        self.send_header("proxy-authenticate", 'Basic realm="proxy"')
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def proxy() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Proxy", (_Proxy,), {"seen": seen}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(autouse=True)
def _no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def proxied_replica(
    proxy: tuple[str, list[str]], refused_url: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> tuple[str, list[str]]:
    """A replica whose own port refuses connections, ``HTTP_PROXY`` naming the stand-in proxy; and what it saw."""
    proxy_url, seen = proxy
    monkeypatch.setenv("HTTP_PROXY", proxy_url)
    return refused_url(), seen


async def test_a_guarded_call_goes_through_the_environments_proxy(proxied_replica: tuple[str, list[str]]) -> None:
    replica, seen = proxied_replica
    async with Guard([replica], {"t": Tier(ttft=5, total=10)}) as guard, guard.http_client() as client:
        async with client.stream("POST", replica + "/v1/chat/completions", json=BODY) as response:
            body = await response.aread()
    assert response.status_code == 200 and b"via proxy" in body
    assert seen == [f"POST {replica}/v1/chat/completions HTTP/1.1"]  # the whole URL: a proxied request


@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "127.0.0.0/8", "[::1],*.example.com,127.0.0.0/8"])
async def test_no_proxy_keeps_a_replica_direct(
    no_proxy: str, proxied_replica: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A network and a bracketed IPv6 address are httpx2's forms (openai >= 3, anthropic): honoured too."""
    replica, seen = proxied_replica
    monkeypatch.setenv("NO_PROXY", no_proxy)
    tiers = {"t": Tier(ttft=5, total=10)}
    async with Guard([replica], tiers, failure_mode="raise", retry=None) as guard, guard.http_client() as client:
        with pytest.raises(httpx.TransportError, match="connect_error"):
            await client.post(replica + "/v1/chat/completions", json=BODY)
    assert seen == []  # connected directly, and refused


async def test_a_proxys_407_is_not_sent_again_to_the_same_replica(
    proxy: tuple[str, list[str]], refused_url: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tunnel to that replica would be refused alike: the error comes at once, as the plain SDK's (with
    ``max_retries=0``) does, and another replica (here one the proxy does not stand before) serves the call."""
    proxy_url, seen = proxy
    monkeypatch.setenv("HTTPS_PROXY", proxy_url)
    tunnelled = "https://127.0.0.1:9"  # reached only through the proxy's tunnel, which is refused
    tiers = {"t": Tier(ttft=5, total=10)}
    async with Guard([tunnelled], tiers, failure_mode="raise") as guard, guard.http_client() as client:
        with pytest.raises(httpx.ProxyError, match=r"1 attempt\(s\).*proxy_error") as raised:
            await client.post(tunnelled + "/v1/chat/completions", json=BODY)
    assert "407" in str(raised.value.__cause__)
    assert seen == ["CONNECT 127.0.0.1:9 HTTP/1.1"]

    seen.clear()
    monkeypatch.setenv("HTTP_PROXY", proxy_url)  # the http replica's requests go through the proxy, which answers
    direct = refused_url()
    async with Guard([tunnelled, direct], tiers, failure_mode="raise") as guard, guard.http_client() as client:
        for _ in range(3):
            async with client.stream("POST", tunnelled + "/v1/chat/completions", json=BODY) as response:
                assert b"via proxy" in await response.aread()
    assert sum(line.startswith("POST") for line in seen) == 3  # each call served once, by the other replica


def _choices(library: ModuleType, urls: list[str]) -> list[tuple[str, int] | None] | None:
    """For each URL, the proxy (host, port) a default client of ``library`` (httpx or httpx2) sends it through
    (None: directly); None when that client cannot be built from the environment."""
    try:
        client = library.AsyncClient(verify=False)  # trust_env: what the SDKs' default clients do (no CA load)
    except Exception:
        return None
    choices: list[tuple[str, int] | None] = []
    for url in urls:
        chosen = client._transport_for_url(library.URL(url))
        proxy_url = getattr(getattr(chosen, "_pool", None), "_proxy_url", None)  # httpcore's, of a proxy's pool
        choices.append(None if proxy_url is None else (proxy_url.host.decode(), proxy_url.port))
    return choices


def _ours(url: str) -> tuple[str, int] | None:
    proxy = environment_proxy(url)
    return None if proxy is None else (proxy.url.host, proxy.url.port)


@pytest.mark.parametrize(
    "environment",
    [
        {"HTTPS_PROXY": "http://p:3128"},
        {"HTTP_PROXY": "http://p:3128"},
        {"ALL_PROXY": "http://p:3128", "NO_PROXY": ".internal,10.0.0.0/8"},
        {"HTTPS_PROXY": "http://user:secret@p:3128", "NO_PROXY": "api.example.com"},
        {"ALL_PROXY": "http://p:1", "HTTPS_PROXY": "http://p:2"},
        {"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "*"},
    ],
)
@pytest.mark.parametrize(
    "url",
    ["https://api.example.com/v1", "http://vllm.internal:8000/v1", "http://10.1.2.3:8000", "https://other.org"],
)
def test_the_proxy_chosen_is_the_one_the_sdks_clients_choose(
    environment: dict[str, str], url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    by_httpx, by_httpx2 = _choices(httpx, [url]), _choices(httpx2, [url])
    assert by_httpx is not None and by_httpx2 is not None  # both libraries read these environments
    assert _ours(url) == (None if by_httpx2[0] is None else by_httpx[0])  # httpx2 alone reads 10.0.0.0/8 as a net


NO_PROXY_URLS = [
    "http://127.0.0.1:8000/v1",
    "http://10.1.2.3:8000/v1",
    "http://[::1]:8000/v1",
    "http://[fd00::5]/v1",
    "https://api.example.com/v1",
    "http://example.com/v1",
    "http://localhost:8000/v1",
    "http://api.xn--mnchen-3ya.de/v1",
]


@pytest.mark.parametrize(
    "no_proxy",
    [
        "127.0.0.0/8",
        "10.0.0.0/8,fd00::/8",
        "::1",
        "[::1]",
        "[::1]:8000",
        "[fd00::]/8",
        "*.example.com",
        ".example.com",
        "example.com",
        "localhost",
        "10.1.2.3:8000",
        "*",
        "example.com/v1",  # httpx: example.com; httpx2: skipped
        "10.0.0.0/33",  # httpx: 10.0.0.0; httpx2: skipped
        "[::1,a:b:c,localhost:x",  # nobody reads these
        "xn--mnchen-3ya.de",  # httpx2 raises reading it, httpx reads it
        "10.0.0.0/8,xn--mnchen-3ya.de",
    ],
)
def test_no_proxy_sends_directly_where_an_httpx_or_httpx2_client_would(
    no_proxy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each form, for each URL: direct if either library's client goes direct; an entry a library cannot read
    counts for nothing (its own client raises), and never makes the guard raise."""
    monkeypatch.setenv("HTTP_PROXY", "http://p:3128")
    monkeypatch.setenv("HTTPS_PROXY", "http://p:3128")
    monkeypatch.setenv("NO_PROXY", no_proxy)
    proxied = ("p", 3128)
    by_httpx = _choices(httpx, NO_PROXY_URLS) or [proxied] * len(NO_PROXY_URLS)
    by_httpx2 = _choices(httpx2, NO_PROXY_URLS) or [proxied] * len(NO_PROXY_URLS)
    for url, one, other in zip(NO_PROXY_URLS, by_httpx, by_httpx2, strict=True):
        assert _ours(url) == (None if None in (one, other) else proxied), url


@pytest.mark.parametrize(
    ("no_proxy", "url", "direct"),
    [
        ("127.0.0.0/8", "http://127.0.0.1:8000/v1", False),  # httpx's client reads no networks
        ("*.example.com", "https://api.example.com/v1", False),  # nor *.domain
        ("[::1],127.0.0.1", "http://127.0.0.1:8000/v1", True),
        ("fd00::/8,.example.com", "https://api.example.com/v1", True),
    ],
)
def test_without_httpx2_no_proxy_is_read_as_httpx_reads_it(
    no_proxy: str, url: str, direct: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only SDKs on httpx can be served then; an entry httpx cannot read (its own client raises) is skipped."""
    monkeypatch.setitem(sys.modules, "httpx2", None)  # as in an install without it: `import httpx2` fails
    monkeypatch.setenv("HTTP_PROXY", "http://p:3128")
    monkeypatch.setenv("HTTPS_PROXY", "http://p:3128")
    monkeypatch.setenv("NO_PROXY", no_proxy)
    assert _ours(url) == (None if direct else ("p", 3128))


def test_a_guarded_client_takes_no_argument_for_connections_it_does_not_open() -> None:
    guard = Guard(["http://127.0.0.1:9"])
    try:
        for argument in ("verify", "cert", "http2", "limits"):
            with pytest.raises(GuardConfigError, match=f"takes no {argument}=.*transport_factory"):
                guard.http_client(**{argument: False})
            with pytest.raises(GuardConfigError, match=f"takes no {argument}="):
                guard.sync_http_client(**{argument: False})
    finally:
        guard.close()


def test_a_guarded_client_refuses_trust_env_false_which_its_connections_would_not_follow() -> None:
    guard = Guard(["http://127.0.0.1:9"])
    try:
        with pytest.raises(GuardConfigError, match=r"trust_env=False.*HTTPS_PROXY.*transport_factory"):
            guard.http_client(trust_env=False)
        with pytest.raises(GuardConfigError, match=r"trust_env=False"):
            guard.sync_http_client(trust_env=False)
        guard.http_client(trust_env=True)  # what the guard's connections do: accepted
    finally:
        guard.close()


def test_a_guarded_client_takes_no_argument_that_would_route_around_the_guard() -> None:
    guard = Guard(["http://127.0.0.1:9"])
    try:
        arguments: list[dict[str, Any]] = [{"mounts": {}}, {"proxy": "http://p:1"}, {"transport": None}]
        for argument in arguments:
            with pytest.raises(GuardConfigError, match=f"takes no {next(iter(argument))}="):
                guard.http_client(**argument)
    finally:
        guard.close()
