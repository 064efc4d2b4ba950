"""Clients for tests that talk to a server directly (no guard), on the process's one TLS context.

An ``httpx.AsyncClient()`` or an SDK client left to its defaults builds its own verifying TLS context, which
loads the CA bundle: ~45 ms of CPU each, and the suite built ~90 of them per run (~4 s of its CPU)."""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

import httpx
import pytest

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


def anthropic_on_httpx() -> Any:
    """The anthropic SDK where it still runs on httpx (< 1.0), else skip the test. The version comes from the
    installed distribution's metadata: a skip does not import anthropic (~1.7 s of CPU)."""
    try:
        version = metadata.version("anthropic")
    except metadata.PackageNotFoundError:
        pytest.skip("anthropic is not installed")
    if int(version.split(".")[0]) >= 1:
        pytest.skip(f"anthropic {version} accepts only httpx2 clients, not the guard's httpx client")
    return pytest.importorskip("anthropic")
