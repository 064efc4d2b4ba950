"""Edges: thin adapters from each kind of HTTP client to the one async core.

The request path is ``guard.transport.handle_async_request(httpx.Request)``; each edge
only translates the caller's request and response types and runs that core:

- httpx, async: `httpx_async` (``guard.http_client()``), or the core itself (``guard.transport``);
- httpx, sync: `httpx_sync` (``guard.sync_http_client()``);
- httpx2, async: `httpx2_async` (``guard.httpx2_client()``), for openai >= 3 and anthropic >= 1;
- httpx2, sync: `httpx2_sync` (``guard.sync_httpx2_client()``);
- whichever an SDK class takes: `sdk` (``guard.http_client_for(openai.OpenAI)``).

Each client they build knows its calls in flight, and its close ends them (`_client_calls`); the core itself, shared
by every client, is closed only with the Guard. The sync edges run the core on one background event-loop thread per
Guard (`_runner`).
httpx2 is imported only by the httpx2 edges.
"""
