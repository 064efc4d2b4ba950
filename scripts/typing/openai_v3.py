"""User code for openai >= 3 (httpx2 clients): must pass ``mypy --strict`` with no type: ignore."""

from __future__ import annotations

import openai

from llmguard_client import Guard

guard = Guard(["http://127.0.0.1:8000"])
async_client = openai.AsyncOpenAI(base_url="http://127.0.0.1:8000/v1", api_key="k", http_client=guard.httpx2_client())
sync_client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="k", http_client=guard.sync_httpx2_client())
