"""A guarded client's ``auth=``, run for each request the guard sends rather than once per call.

httpx runs a client's `httpx.Auth` flow for each request the client sends, so an SDK's retry is signed afresh
(a new nonce, a new timestamp, a token refreshed on a 401). Under a guard one call sends several requests (its
retries, hedges, attempts on other replicas); were the flow run above the guard, each would resend the first
request as it was signed. So a guarded client keeps a `ClientAuth` as its auth instead: httpx calls it once per
request, and all it does is name the caller's auth on the request (`AUTH_EXTENSION`); each attempt then runs that
auth's flow on its own request (its replica's URL and headers), sending each request the flow yields and handing
back the response (`ClientAuth.send`). An ``auth=`` given for one request replaces the client's, as in httpx, and
runs once above the guard.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any

import anyio
import anyio.to_thread
import httpx

AUTH_EXTENSION = "llmguard.auth"
"""The request extension naming the caller's `ClientAuth`, for the attempts to run."""

Send = Callable[[httpx.Request], Awaitable[httpx.Response]]


class ClientAuth:
    """A guarded client's ``auth=`` (an `httpx.Auth` or an `httpx2.Auth`, as the client built it), run by the guard.

    ``blocking``: the client is a sync one, so its flow is sync code that may block (fetch a token); its steps
    then run in a worker thread, never on the event loop the guard's calls share.
    """

    __slots__ = ("auth", "blocking")

    def __init__(self, auth: Any, *, blocking: bool) -> None:
        self.auth = auth
        self.blocking = blocking

    def __call__(self, request: Any) -> Any:
        """The flow httpx runs for the client (as a function auth): the request named as this auth's to sign."""
        request.extensions = {**request.extensions, AUTH_EXTENSION: self}
        return request

    async def send(self, request: httpx.Request, send: Send) -> httpx.Response:
        """The response to ``request`` authenticated by the flow: each request the flow yields is sent with
        ``send``, and each response but the last closed once the flow has read it."""
        if self.auth.requires_request_body:
            await request.aread()  # a body sent as it is read, read whole here so the flow can sign it
        if self.blocking:
            return await _run(_SyncSteps(self.auth.sync_auth_flow(request), self.auth), send)
        return await _run(_AsyncSteps(self.auth.async_auth_flow(request)), send)


async def _run(steps: _AsyncSteps | _SyncSteps, send: Send) -> httpx.Response:
    response: httpx.Response | None = None
    try:
        outgoing = await steps.first()
        while True:
            response = await send(_as_httpx(outgoing))
            outgoing = await steps.after(response)
            if outgoing is None:
                done, response = response, None
                return done
            await response.aclose()
            response = None
    finally:
        if response is not None:  # the flow failed, or was cancelled, with a response in hand
            with anyio.CancelScope(shield=True):
                await response.aclose()
        await steps.close()


class _AsyncSteps:
    """An async client's flow, run on the event loop (as httpx's `AsyncClient` runs it)."""

    def __init__(self, flow: Any) -> None:
        self._flow = flow

    async def first(self) -> Any:
        return await self._flow.__anext__()

    async def after(self, response: httpx.Response) -> Any:
        try:
            return await self._flow.asend(response)
        except StopAsyncIteration:
            return None

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._flow.aclose()


class _SyncSteps:
    """A sync client's flow, each step in a worker thread (it may block); a response whose body the flow reads
    is read on the loop first, so the flow's ``response.read()`` finds it in memory."""

    def __init__(self, flow: Generator[Any, Any, None], auth: Any) -> None:
        self._flow = flow
        self._auth = auth

    async def first(self) -> Any:
        return await anyio.to_thread.run_sync(_step, self._flow, None)

    async def after(self, response: httpx.Response) -> Any:
        if self._auth.requires_response_body:
            await response.aread()
        return await anyio.to_thread.run_sync(_step, self._flow, response)

    async def close(self) -> None:
        self._flow.close()


def _step(flow: Generator[Any, Any, None], response: httpx.Response | None) -> Any:
    """The flow's next request, or None once it has ended (a StopIteration would not cross the thread)."""
    try:
        return flow.send(response)
    except StopIteration:
        return None


def _as_httpx(request: Any) -> httpx.Request:
    """A request an httpx2 flow built itself (e.g. to fetch a token), as the `httpx.Request` the guard sends."""
    if isinstance(request, httpx.Request):
        return request
    return httpx.Request(
        request.method,
        str(request.url),
        headers=request.headers.raw,
        content=request.read(),
        extensions=dict(request.extensions),
    )
