"""The guard sends through the proxy the environment names, chosen as the SDKs' own httpx clients choose it.

A stdlib HTTP server stands for the proxy: it records each request line (a proxied request names the whole URL)
and answers a short SSE stream itself. The replica's own address refuses connections, so a call answered at
all went through the proxy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
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


async def test_no_proxy_keeps_a_replica_direct(
    proxied_replica: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    replica, seen = proxied_replica
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
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
def test_the_proxy_chosen_is_the_one_an_httpx_client_chooses(
    environment: dict[str, str], url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    client = httpx.AsyncClient()  # trust_env: what the SDKs' default clients do
    chosen = client._transport_for_url(httpx.URL(url))
    proxy_url = getattr(getattr(chosen, "_pool", None), "_proxy_url", None)  # httpcore's, of a proxy's pool
    expected = None if proxy_url is None else (proxy_url.host.decode(), proxy_url.port)
    ours = environment_proxy(url)
    assert (None if ours is None else (ours.url.host, ours.url.port)) == expected


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
