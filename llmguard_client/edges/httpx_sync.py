"""The sync httpx edge: an `httpx.BaseTransport` that runs the async core on the Guard's loop thread."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx

from llmguard_client._http.upload import sync_streamed
from llmguard_client.edges._client_calls import SyncClientCalls
from llmguard_client.edges._registry import send_sync
from llmguard_client.edges._runner import SyncBody
from llmguard_client.edges._sdk_defaults import with_sdk_defaults
from llmguard_client.errors import GuardClosed, WrongEventLoop
from llmguard_client.telemetry.capture import CAPTURES_EXTENSION, active_captures

if TYPE_CHECKING:
    from llmguard_client.edges._guard_handle import GuardHandle


class SyncGuardTransport(httpx.BaseTransport):
    """An `httpx.BaseTransport` for `httpx.Client` (and ``openai.OpenAI`` 1.x/2.x).

    Each request runs through the Guard's async core on the Guard's event-loop thread;
    the body is pulled from it chunk by chunk as the caller reads. ``close()`` ends the
    client's calls in flight (`llmguard_client.edges._client_calls`); the Guard owns the
    pools and the thread, and keeps them (``guard.close()`` closes them).
    """

    def __init__(self, guard: GuardHandle) -> None:
        self._guard = guard
        self._calls = SyncClientCalls()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        inner = sync_streamed(request)  # an iterator's or an upload's body is sent as it is read
        if inner is None:
            inner = request
            request.read()  # a request body in memory is sent whole (it may be replayed to several replicas)
        captures = active_captures()
        if captures:
            inner.extensions = {**inner.extensions, CAPTURES_EXTENSION: captures}
        try:
            response, body = send_sync(self._guard, inner, self._calls)
        except (GuardClosed, WrongEventLoop) as closed:  # no loop to run the core on: refused, nothing sent
            return self._guard.transport.refuse(request, closed)
        out = httpx.Response(response.status_code, headers=response.headers.raw, stream=_Body(body), request=request)
        out.extensions = response.extensions  # shared (the constructor copies): the final record lands in it
        return out

    def close(self) -> None:
        self._calls.close()


class _Body(httpx.SyncByteStream):
    def __init__(self, body: SyncBody) -> None:
        self._body = body

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        self._body.close()


def sync_http_client(guard: GuardHandle, **kwargs: Any) -> httpx.Client:
    """An `httpx.Client` whose transport is the guard (see `SyncGuardTransport`)."""
    with_sdk_defaults(kwargs, httpx.Timeout)
    return httpx.Client(transport=SyncGuardTransport(guard), **kwargs)
