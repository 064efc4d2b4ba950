"""User code that ``mypy --strict`` must pass (tests/edges/test_sdk.py runs it): ``guard.http_client_for``'s
static type is the client the SDK class takes, never ``X | None``.

The classes stand for the SDKs' own, with their ``http_client`` parameters as openai and anthropic declare them
(openai >= 3 and anthropic >= 1 take httpx2's clients; openai 1.x/2.x httpx's), so no SDK need be installed.
"""

from __future__ import annotations

from typing import Any

import httpx
import httpx2
from typing_extensions import assert_type

from llmguard_client import Guard


class AsyncOpenAI3:
    def __init__(self, *, api_key: str | None = None, http_client: httpx2.AsyncClient | None = None) -> None: ...


class OpenAI3:
    def __init__(self, *, api_key: str | None = None, http_client: httpx2.Client | None = None) -> None: ...


class AsyncOpenAI2:
    def __init__(self, *, api_key: str | None = None, http_client: httpx.AsyncClient | None = None) -> None: ...


class OpenAI2:
    def __init__(self, *, api_key: str | None = None, http_client: httpx.Client | None = None) -> None: ...


class Forwarding(AsyncOpenAI3):
    """A user's subclass passing its keywords on: which client it takes is known at run time only."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)


async def keeps_the_client(guard: Guard) -> None:
    assert_type(guard.http_client_for(AsyncOpenAI3), httpx2.AsyncClient)
    assert_type(guard.http_client_for(OpenAI3), httpx2.Client)
    assert_type(guard.http_client_for(AsyncOpenAI2), httpx.AsyncClient)
    assert_type(guard.http_client_for(OpenAI2, timeout=5.0), httpx.Client)
    assert_type(guard.http_client_for(Forwarding), Any)
    client = guard.http_client_for(AsyncOpenAI3)
    AsyncOpenAI3(api_key="k", http_client=client)
    await client.aclose()
    async with guard.http_client_for(AsyncOpenAI3):
        pass
    with guard.http_client_for(OpenAI2) as sync:
        assert_type(sync, httpx.Client)
