"""The sync httpx2 edge: an `httpx2.BaseTransport` that runs the async core on the Guard's loop thread."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import httpx2

from llmguard_client.edges._client_calls import SyncClientCalls
from llmguard_client.edges._httpx2_types import (
    SdkErrors,
    caller_error,
    core_request,
    response_extensions,
    streamed,
)
from llmguard_client.edges._registry import send_sync
from llmguard_client.edges._runner import SyncBody
from llmguard_client.edges._sdk_defaults import with_sdk_defaults
from llmguard_client.errors import GuardClosed, WrongEventLoop

if TYPE_CHECKING:
    from llmguard_client.edges._guard_handle import GuardHandle


class SyncHttpx2GuardTransport(httpx2.BaseTransport):
    """An `httpx2.BaseTransport` for `httpx2.Client` (``openai.OpenAI`` >= 3, ``anthropic.Anthropic`` >= 1).

    ``close()`` ends the client's calls in flight (`llmguard_client.edges._client_calls`); the Guard owns the
    pools and the thread, and keeps them (``guard.close()`` closes them).
    """

    def __init__(self, guard: GuardHandle, sdk: SdkErrors | None = None) -> None:
        self._guard = guard
        self._sdk = sdk
        self._calls = SyncClientCalls()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        upload = streamed(request, sync=True)  # an iterator's or an upload's body is sent as it is read
        inner = core_request(request, upload if upload is not None else request.read())
        try:
            try:
                response, body = send_sync(self._guard, inner, self._calls)
            except (GuardClosed, WrongEventLoop) as closed:  # no loop to run the core on: refused, nothing sent
                refusal = self._guard.transport.refuse(inner, closed)
                return httpx2.Response(
                    refusal.status_code, headers=refusal.headers.raw, content=refusal.content, request=request
                )
        except httpx.HTTPError as exc:
            error = caller_error(exc, request, self._sdk)
            raise error from error.__cause__
        out = httpx2.Response(
            response.status_code, headers=response.headers.raw, stream=_Body(body, request, self._sdk), request=request
        )
        out.extensions = response_extensions(response.extensions)  # shared: the final record lands in it
        return out

    def close(self) -> None:
        self._calls.close()


class _Body(httpx2.SyncByteStream):
    def __init__(self, body: SyncBody, request: httpx2.Request, sdk: SdkErrors | None) -> None:
        self._body = body
        self._request = request
        self._sdk = sdk

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._body
        except httpx.HTTPError as exc:
            error = caller_error(exc, self._request, self._sdk)
            raise error from error.__cause__

    def close(self) -> None:
        self._body.close()


def sync_httpx2_client(guard: GuardHandle, *, sdk: SdkErrors | None = None, **kwargs: Any) -> httpx2.Client:
    """An `httpx2.Client` whose transport is the guard (see `SyncHttpx2GuardTransport`); ``sdk`` as for
    `llmguard_client.edges.httpx2_async.httpx2_client`."""
    with_sdk_defaults(kwargs, httpx2.Timeout)
    return httpx2.Client(transport=SyncHttpx2GuardTransport(guard, sdk), **kwargs)
