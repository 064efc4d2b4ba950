"""A pytest plugin that sends every openai / anthropic client built during a test through a Guard.

Loaded into an SDK's own test suite (``-p peer_plugin``, by `scripts/peer_suites.py`), with the suite's files
unchanged:

- a client built without ``http_client=`` gets the guarded client a user would pass,
  ``guard.http_client_for(type(client))`` (its timeout, redirects and headers are the guard's defaults);
- a client built with its own ``http_client=`` keeps that client (its timeout, redirects, auth...), and the
  client's transport becomes the guard, with the test's transport (a ``MockTransport``, or a default pool)
  as the guard's inner transport for the one replica;
- each test gets fresh Guards, ``Guard(replicas=[origin], tiers={"t": Tier(ttft=30, total=60)})``, one per
  (origin, inner transport, sync or async), closed at the end of the test, so no test sees state an earlier
  one left (a cool-down, an open circuit, a spent budget).

The suites mock with respx (anthropic, over httpx) and respx2 (openai >= 3, over httpx2): both patch the
connection pool *below* the client's transport, so the guard's layers run and the mocks still answer.
The guard's inner transport is an httpx one; for an httpx2 client it forwards to an httpx2 pool (this
plugin's `_Httpx2Inner`), which respx2 patches. A body the guard sends as it comes (an iterator's) is passed
to the test's transport unread, as the SDK's own client would pass it (`_unread_body`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio.from_thread
import anyio.to_thread
import httpx
import pytest

from llmguard_client import BudgetPolicy, Guard, RetryPolicy, Tier

try:
    import httpx2
except ImportError:  # pragma: no cover - an httpx-only SDK
    httpx2 = None  # type: ignore[assignment]

TIERS = {"t": Tier(ttft=30, total=60)}
RETRY = RetryPolicy(mode="cooperative") if os.environ.get("PEER_RETRY_MODE") == "cooperative" else RetryPolicy()
"""``PEER_RETRY_MODE=cooperative``: the Guards let the SDK send the retries (`RetryPolicy.mode`)."""
BUDGET = (
    BudgetPolicy(floor=int(os.environ["PEER_BUDGET_FLOOR"])) if "PEER_BUDGET_FLOOR" in os.environ else BudgetPolicy()
)
"""``PEER_BUDGET_FLOOR=N``: the Guards' retry budget holds N retries on its own (default: `BudgetPolicy`'s 3)."""
_template = Guard(replicas=["http://template.invalid"], tiers=TIERS)
"""Builds the SDK-default replacements (never sends: their transport is swapped for `_Router`)."""
_guards: dict[tuple[str, int, bool], Guard] = {}
"""This test's Guards, by (origin, id of the inner transport, sync)."""
_inners: dict[int, Any] = {}
stats = {"clients": 0, "guarded_requests": 0}


# --- the inner transport: the test's own (mocked) transport, called from the guard's async core ----------


def _to_httpx_error(exc: Exception, request: httpx.Request) -> Exception:
    cls = getattr(httpx, type(exc).__name__, None)
    if isinstance(cls, type) and issubclass(cls, httpx.RequestError):
        return cls(str(exc), request=request)
    return exc


class _Raised(Exception):
    """A BaseException a test's *sync* transport raised (e.g. ``asyncio.CancelledError``), carried through the
    guard's event loop, where it would read as a cancellation of the guard's own task; the router re-raises
    ``error`` itself to the client, as the client would have met it from its transport."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


def _call_sync(handle: Callable[[Any], Any], request: Any) -> Any:
    try:
        return handle(request)
    except Exception:
        raise
    except BaseException as exc:  # synchronous code is not cancelled by the loop: this is the transport's own
        raise _Raised(exc) from None


def _unread_body(request: httpx.Request) -> httpx.AsyncByteStream | None:
    """The attempt's body when the guard sends it as it comes (not held in memory), else None."""
    stream = request.stream
    return None if isinstance(stream, httpx.ByteStream) else stream  # type: ignore[return-value]


class _Pull:
    """A sync iterator over an async body, for a sync transport called in a worker thread."""

    def __init__(self, stream: httpx.AsyncByteStream) -> None:
        self._chunks = stream.__aiter__()

    async def _next(self) -> bytes | None:
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            return None

    def __iter__(self) -> Any:
        while (chunk := anyio.from_thread.run(self._next)) is not None:
            yield chunk


class _Httpx2Inner(httpx.AsyncBaseTransport):
    """An httpx transport over an httpx2 one (async or sync): what respx2 patches stays below the guard."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        unread = _unread_body(request)
        is_async = isinstance(self._inner, httpx2.AsyncBaseTransport)
        body: Any = (await request.aread()) if unread is None else unread if is_async else _Pull(unread)
        req2 = httpx2.Request(
            request.method, str(request.url), headers=request.headers.raw, content=body, extensions=request.extensions
        )
        try:
            if is_async:
                response = await self._inner.handle_async_request(req2)
                stream: Any = _AsyncChunks(response)
            elif unread is not None:  # the transport pulls the body from this loop: call it from a worker thread
                response = await anyio.to_thread.run_sync(_call_sync, self._inner.handle_request, req2)
                stream = _AsyncChunks(response)
            else:
                response = _call_sync(self._inner.handle_request, req2)
                stream = _AsyncChunks(response)
        except httpx2.HTTPError as exc:
            raise _to_httpx_error(exc, request) from exc
        response.request = req2  # as the test's client sets it on what its transport returns
        return httpx.Response(
            response.status_code, headers=response.headers.raw, stream=stream, extensions=dict(response.extensions)
        )

    async def aclose(self) -> None:
        if isinstance(self._inner, httpx2.AsyncBaseTransport):
            await self._inner.aclose()
        else:
            self._inner.close()


class _AsyncChunks(httpx.AsyncByteStream):
    """A response's body (sync or async stream, httpx or httpx2) as an httpx async stream."""

    def __init__(self, response: Any) -> None:
        self._stream = response.stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            if hasattr(self._stream, "__aiter__"):
                async for chunk in self._stream:
                    yield chunk
            else:
                for chunk in self._stream:
                    yield chunk
        except httpx2.HTTPError as exc:
            raise _to_httpx_error(exc, httpx.Request("GET", "http://peer.invalid")) from exc

    async def aclose(self) -> None:
        close = getattr(self._stream, "aclose", None)
        if close is not None and inspect.iscoroutinefunction(close):
            await close()
        elif hasattr(self._stream, "close"):
            self._stream.close()


class _HttpxSyncInner(httpx.AsyncBaseTransport):
    """A sync httpx transport (a test's ``MockTransport``) called from the guard's async core."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        unread = _unread_body(request)
        if unread is None:
            await request.aread()
            response = _call_sync(self._inner.handle_request, request)
        else:  # the transport pulls the body from this loop: call it from a worker thread
            pulled = httpx.Request(
                request.method,
                request.url,
                headers=request.headers.raw,
                content=_Pull(unread),
                extensions=request.extensions,
            )
            response = await anyio.to_thread.run_sync(_call_sync, self._inner.handle_request, pulled)
        response.request = request if unread is None else pulled
        return httpx.Response(
            response.status_code,
            headers=response.headers.raw,
            stream=_AsyncChunks(response),
            extensions=dict(response.extensions),
        )

    async def aclose(self) -> None:
        self._inner.close()


def _inner_factory(inner: Any, sync: bool) -> Callable[[Any], httpx.AsyncBaseTransport]:
    """The guard's inner transport over the test's own: called the way the test's client would call it."""
    if httpx2 is not None and isinstance(inner, (httpx2.AsyncBaseTransport, httpx2.BaseTransport)):
        if sync and isinstance(inner, httpx2.BaseTransport):
            return lambda replica: _Httpx2Inner(_SyncOnly(inner))
        return lambda replica: _Httpx2Inner(inner)
    if isinstance(inner, httpx.AsyncBaseTransport) and not (sync and isinstance(inner, httpx.BaseTransport)):
        return lambda replica: inner
    return lambda replica: _HttpxSyncInner(inner)


class _SyncOnly:
    """A transport that is both sync and async (a test's ``MockTransport``), seen as the sync one."""

    def __init__(self, inner: Any) -> None:
        self.handle_request = inner.handle_request
        self.close = inner.close


# --- the router: the client's transport, handing each request to this test's Guard ----------------------


def _guard_for(url: Any, inner_key: int, sync: bool) -> Guard:
    origin = f"{url.scheme}://{url.netloc.decode('ascii')}"
    key = (origin, inner_key, sync)
    guard = _guards.get(key)
    if guard is None:
        guard = Guard(
            replicas=[origin],
            tiers=TIERS,
            retry=RETRY,
            budget=BUDGET,
            transport_factory=_inner_factory(_inners[inner_key](), sync),
        )
        _guards[key] = guard
    return guard


def _edge(guard: Guard, sdk: Any) -> Any:
    """The guard's own transport for this SDK class's clients (the transport of ``guard.http_client_for(sdk)``)."""
    cache = guard.__dict__.setdefault("_peer_edges", {})
    if sdk not in cache:
        cache[sdk] = guard.http_client_for(sdk)._transport
    return cache[sdk]


def _router(client: Any, sdk: Any) -> Any:
    flavor2 = httpx2 is not None and isinstance(client, (httpx2.Client, httpx2.AsyncClient))
    sync = isinstance(client, httpx2.Client) if flavor2 else isinstance(client, httpx.Client)
    original = client._transport
    if getattr(original, "_peer_guarded", False):
        return original
    if getattr(original, "_peer_template", False):  # an SDK default: a plain pool of the client's kind
        make: Callable[[], Any] = httpx2.AsyncHTTPTransport if flavor2 else httpx.AsyncHTTPTransport  # type: ignore[union-attr]
        inner_key = id(make)
    else:
        make, inner_key = (lambda: original), id(original)
    _inners[inner_key] = make
    stats["clients"] += 1

    def edge(request: Any) -> Any:
        stats["guarded_requests"] += 1
        return _edge(_guard_for(request.url, inner_key, sync), sdk)

    base: Any
    if flavor2:
        base = httpx2.BaseTransport if sync else httpx2.AsyncBaseTransport
    else:
        base = httpx.BaseTransport if sync else httpx.AsyncBaseTransport
    if sync:

        class SyncRouter(base):  # type: ignore[misc, valid-type]
            _peer_guarded = True

            def handle_request(self, request: Any) -> Any:
                try:
                    return edge(request).handle_request(request)
                except _Raised as carried:
                    raise carried.error from None

        return SyncRouter()

    class AsyncRouter(base):  # type: ignore[misc, valid-type]
        _peer_guarded = True

        async def handle_async_request(self, request: Any) -> Any:
            try:
                return await edge(request).handle_async_request(request)
            except _Raised as carried:
                raise carried.error from None

    return AsyncRouter()


def _patch_client_init(module_name: str) -> None:
    try:
        base_client = __import__(module_name, fromlist=["SyncAPIClient"])
    except ImportError:
        return
    for name in ("SyncAPIClient", "AsyncAPIClient"):
        cls = getattr(base_client, name)
        original = cls.__init__

        @functools.wraps(original)
        def init(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> None:
            if kwargs.get("http_client") is None:
                guarded = _template.http_client_for(type(self))
                guarded._transport._peer_template = True
                kwargs["http_client"] = guarded
            __original(self, *args, **kwargs)
            self._client._transport = _router(self._client, type(self))

        cls.__init__ = init


def pytest_configure(config: pytest.Config) -> None:
    _patch_client_init("openai._base_client")
    _patch_client_init("anthropic._base_client")


@pytest.fixture(autouse=True)
async def _peer_guards() -> AsyncIterator[None]:
    """Fresh Guards for this test, closed after it on the suite's event loop (its async pools live there)."""
    _guards.clear()
    yield
    guards = list(_guards.values())
    _guards.clear()
    for guard in guards:
        with contextlib.suppress(Exception):
            await guard.aclose()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(
        f"peer_plugin: {stats['clients']} SDK clients routed, {stats['guarded_requests']} requests through a Guard"
    )
