"""A LangChain chat model through a Guard, sync and async.

    python3 -m venv .venv && .venv/bin/pip install -e . -e ./tools langchain-openai
    .venv/bin/python examples/langchain_chat.py

``ChatOpenAI`` builds its openai clients from the ``http_client`` (sync: ``invoke``) and
``http_async_client`` (async: ``ainvoke``) you give it; without the first, ``invoke`` goes around the
guard. ``guard.http_client_for`` picks the kind the installed openai takes.
"""

from __future__ import annotations

import anyio
import openai
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from llmguard_client import Guard, Tier
from llmguard_tools.sim.launch import spawn_cluster


def chat_model(guard: Guard, base_url: str) -> ChatOpenAI:
    return ChatOpenAI(
        model="sim-model",
        base_url=base_url + "/v1",
        api_key=SecretStr("sim"),
        max_completion_tokens=20,
        http_client=guard.http_client_for(openai.OpenAI),
        http_async_client=guard.http_client_for(openai.AsyncOpenAI),
    )


def sync_part(urls: list[str]) -> None:
    with Guard(replicas=urls, tiers={"interactive": Tier(ttft=1.0, total=30.0)}) as guard:
        llm = chat_model(guard, urls[0])
        with guard.capture() as calls:
            reply = llm.invoke("Say something short.")
            streamed = "".join(str(chunk.content) for chunk in llm.stream("And stream it."))
        print(f"invoke: {str(reply.content)[:40]!r}; stream: {len(streamed.split())} words")
        print(f"sync: {len(calls)} calls through the guard, status {[r.status for r in calls]}")


async def async_part(urls: list[str]) -> None:
    async with Guard(replicas=urls, tiers={"interactive": Tier(ttft=1.0, total=30.0)}) as guard:
        llm = chat_model(guard, urls[0])
        with guard.capture() as calls:
            reply = await llm.ainvoke("Say something short.")
            streamed = "".join([str(chunk.content) async for chunk in llm.astream("And stream it.")])
        print(f"ainvoke: {str(reply.content)[:40]!r}; astream: {len(streamed.split())} words")
        print(f"async: {len(calls)} calls through the guard, status {[r.status for r in calls]}")


if __name__ == "__main__":
    with spawn_cluster("healthy") as cluster_urls:
        sync_part(cluster_urls)
        anyio.run(async_part, cluster_urls)
