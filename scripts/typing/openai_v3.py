"""User code for openai >= 3 (httpx2 clients): must pass ``mypy --strict`` with no type: ignore."""

from __future__ import annotations

import httpx2
import openai

from llmguard_client import Guard

guard = Guard(["http://127.0.0.1:8000"])
async_client = openai.AsyncOpenAI(base_url="http://127.0.0.1:8000/v1", api_key="k", http_client=guard.httpx2_client())
sync_client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="k", http_client=guard.sync_httpx2_client())

# http_client_for's type is the client itself (not Optional): kept, it can be closed or used without a check.
kept: httpx2.AsyncClient = guard.http_client_for(openai.AsyncOpenAI)
kept_sync: httpx2.Client = guard.http_client_for(openai.OpenAI)
