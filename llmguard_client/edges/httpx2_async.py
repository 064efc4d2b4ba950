"""The async httpx2 edge: an `httpx2.AsyncBaseTransport` over the async core (openai >= 3, anthropic >= 1)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import httpx
import httpx2

from llmguard_client.edges._client_calls import AsyncClientCalls
from llmguard_client.edges._httpx2_types import (
    SdkErrors,
    caller_error,
    core_request,
    response_extensions,
    streamed,
)
from llmguard_client.edges._sdk_defaults import with_sdk_defaults

if TYPE_CHECKING:
    from llmguard_client.edges._guard_handle import GuardHandle


class Httpx2GuardTransport(httpx2.AsyncBaseTransport):
    """An `httpx2.AsyncBaseTransport` that runs each request through the guard's core, as one client's call.

    ``aclose()`` ends the client's calls in flight (`llmguard_client.edges._client_calls`), as closing a plain
    client's pool would; the Guard owns the pools and keeps them (``await guard.aclose()`` closes them).
    """

    def __init__(self, core: httpx.AsyncBaseTransport, sdk: SdkErrors | None = None) -> None:
        self._core = core
        self._sdk = sdk
        self._calls = AsyncClientCalls()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        upload = streamed(request, sync=False)  # an iterator's or an upload's body is sent as it is read
        inner = core_request(request, upload if upload is not None else await request.aread())
        try:
            response = await self._calls.send(self._core, inner)
        except httpx.HTTPError as exc:
            error = caller_error(exc, request, self._sdk)
            raise error from error.__cause__
        out = httpx2.Response(
            response.status_code,
            headers=response.headers.raw,
            stream=_Body(response, request, self._sdk),
            request=request,
        )
        out.extensions = response_extensions(response.extensions)  # shared: the final record lands in it
        return out

    async def aclose(self) -> None:
        await self._calls.aclose()


class _Body(httpx2.AsyncByteStream):
    """The core's body, passed through as it arrives; httpx errors become httpx2 ones.

    Iterated by a plain async iterator, not an async generator: SDKs iterate a body twice (openai
    drains the rest after ``[DONE]``) and leave the first iteration suspended; a generator left so
    would be finalized, racing the response's own close, when the event loop shuts down.
    """

    def __init__(self, response: httpx.Response, request: httpx2.Request, sdk: SdkErrors | None) -> None:
        self._response = response
        self._request = request
        self._sdk = sdk

    def __aiter__(self) -> AsyncIterator[bytes]:
        stream = self._response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        return _Chunks(stream.__aiter__(), self._request, self._sdk)

    async def aclose(self) -> None:
        await self._response.aclose()


class _Chunks:
    __slots__ = ("_chunks", "_request", "_sdk")

    def __init__(self, chunks: AsyncIterator[bytes], request: httpx2.Request, sdk: SdkErrors | None) -> None:
        self._chunks = chunks
        self._request = request
        self._sdk = sdk

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._chunks.__anext__()
        except httpx.HTTPError as exc:
            error = caller_error(exc, self._request, self._sdk)
            raise error from error.__cause__


def httpx2_client(guard: GuardHandle, *, sdk: SdkErrors | None = None, **kwargs: Any) -> httpx2.AsyncClient:
    """An `httpx2.AsyncClient` whose transport is the guard (see `Httpx2GuardTransport`); ``sdk``: the errors of
    the SDK it is for, when that SDK passes its own on unretried."""
    with_sdk_defaults(kwargs, httpx2.Timeout)
    return httpx2.AsyncClient(transport=Httpx2GuardTransport(guard.transport, sdk), **kwargs)
