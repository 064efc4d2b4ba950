"""The async httpx edge: the transport of ``guard.http_client()``, the core's own plus the calls of that client."""

from __future__ import annotations

from typing import Any

import httpx

from llmguard_client.edges._client_calls import AsyncClientCalls
from llmguard_client.edges._sdk_defaults import with_sdk_defaults


class ClientTransport(httpx.AsyncBaseTransport):
    """Runs each request through the guard's core (``guard.transport``), as that client's call.

    ``aclose()`` ends the client's calls in flight (`llmguard_client.edges._client_calls`), as closing a plain
    client's pool would; the Guard owns the pools and keeps them (``await guard.aclose()`` closes them).
    """

    def __init__(self, core: httpx.AsyncBaseTransport) -> None:
        self._core = core
        self._calls = AsyncClientCalls()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._calls.send(self._core, request)

    async def aclose(self) -> None:
        await self._calls.aclose()


def httpx_client(core: httpx.AsyncBaseTransport, **kwargs: Any) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` whose transport is the guard's core, as one client (see `ClientTransport`)."""
    return httpx.AsyncClient(transport=ClientTransport(core), **with_sdk_defaults(kwargs, httpx.Timeout))
