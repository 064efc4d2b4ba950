"""Clients for tests that talk to a server directly (no guard), on the process's one TLS context.

An ``httpx.AsyncClient()`` or an SDK client left to its defaults builds its own verifying TLS context, which
loads the CA bundle: ~45 ms of CPU each, and the suite built ~90 of them per run (~4 s of its CPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

from llmguard_client._http.tls import default_tls_context

if TYPE_CHECKING:
    import openai


def plain_httpx(**kwargs: Any) -> httpx.AsyncClient:
    """``httpx.AsyncClient(**kwargs)``, sharing the TLS context."""
    return httpx.AsyncClient(verify=default_tls_context(), **kwargs)


def plain_sdk(base_url: str, **kwargs: Any) -> openai.AsyncOpenAI:
    """The openai SDK on its own default HTTP client (its limits, timeouts and redirects), sharing the TLS
    context; ``base_url`` is the server's, without ``/v1``."""
    import openai

    http_client = openai.DefaultAsyncHttpxClient(verify=default_tls_context())
    return openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x", http_client=http_client, **kwargs)
