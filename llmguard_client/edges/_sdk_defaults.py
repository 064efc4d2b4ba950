"""The defaults of the clients the guard hands out: those of the openai and anthropic SDKs' own clients.

``openai.DefaultHttpxClient`` / ``DefaultAsyncHttpxClient`` (and ``DefaultHttpx2Client``...) and anthropic's
follow redirects and time out after 5 s to connect and 600 s for each read, write and pool wait; their pools
hold 1000 connections, 100 kept alive (the Guard's per-replica pools, ``DEFAULT_POOL_LIMITS``, the same).
A guarded client keeps them, so an SDK given one behaves as with its own: it follows redirects, and it sends
``x-stainless-read-timeout: 600`` (the SDK sends it only when its client has a read timeout). Under a Guard
the SDK's read timeout caps the tier's ``ttft`` and ``stall`` (docs/usage.md, "The SDK's own settings").
"""

from __future__ import annotations

from typing import Any

from llmguard_client.errors import GuardConfigError

SDK_TIMEOUT = 600
"""Seconds for each read, write and pool wait: the SDKs' ``DEFAULT_TIMEOUT``."""
SDK_CONNECT_TIMEOUT = 5.0
"""Seconds to connect: the SDKs' ``DEFAULT_TIMEOUT.connect``."""


ROUTING_ARGUMENTS = ("transport", "mounts", "proxy", "proxies")
"""A client's arguments that would send its requests elsewhere than through the guard."""
CONNECTION_ARGUMENTS = ("verify", "cert", "http1", "http2", "limits")
"""A client's arguments for its own connections, which a guarded client has none of (httpx ignores them, silently,
for a client given a transport): the replicas' pools are the guard's."""


def with_sdk_defaults(kwargs: dict[str, Any], timeout_type: Any) -> dict[str, Any]:
    """``kwargs`` for an httpx/httpx2 client, with the SDKs' timeout and redirects where the caller set none;
    a `GuardConfigError` for an argument that would route requests around the guard or configure connections
    the client does not open (``trust_env=False`` among them: the environment's proxy and CAs are the pools')."""
    routing = [name for name in ROUTING_ARGUMENTS if name in kwargs]
    if routing:
        raise GuardConfigError(
            f"a guarded client's requests go through the guard, so it takes no {'/'.join(routing)}=: the guard "
            "sends through the proxy the environment names (HTTPS_PROXY, NO_PROXY, ... as the SDKs' own clients "
            "do); for another, build the replicas' transports with Guard(transport_factory=...)"
        )
    connection = [name for name in CONNECTION_ARGUMENTS if name in kwargs]
    if connection:
        raise GuardConfigError(
            f"a guarded client opens no connections of its own, so it takes no {'/'.join(connection)}=: the "
            "replicas' connections are the guard's; set Guard(pool_limits=...) for their limits, or build them "
            "with Guard(transport_factory=...) for TLS settings or HTTP/2"
        )
    if kwargs.get("trust_env", True) is False:
        raise GuardConfigError(
            "a guarded client opens no connections of its own, so trust_env=False would not keep its requests "
            "from the proxy and CA variables of the environment (HTTPS_PROXY, SSL_CERT_FILE, ...): the replicas' "
            "connections are the guard's and follow them as the SDKs' own clients do; to ignore them, build the "
            "replicas' transports with Guard(transport_factory=lambda replica: "
            "httpx.AsyncHTTPTransport(trust_env=False))"
        )
    kwargs.setdefault("timeout", timeout_type(SDK_TIMEOUT, connect=SDK_CONNECT_TIMEOUT))
    kwargs.setdefault("follow_redirects", True)
    return kwargs
