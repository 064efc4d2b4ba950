"""User code for openai 1.x/2.x (httpx clients): must pass ``mypy --strict`` with no type: ignore."""

from __future__ import annotations

import httpx
import openai

from llmguard_client import Guard

guard = Guard(["http://127.0.0.1:8000"])
async_client = openai.AsyncOpenAI(base_url="http://127.0.0.1:8000/v1", api_key="k", http_client=guard.http_client())
sync_client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="k", http_client=guard.sync_http_client())

# http_client_for's type is the client itself (not Optional): kept, it can be closed or used without a check.
kept: httpx.AsyncClient = guard.http_client_for(openai.AsyncOpenAI)
kept_sync: httpx.Client = guard.http_client_for(openai.OpenAI)
