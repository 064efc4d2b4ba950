"""A FastAPI app with the Guard in its lifespan: one Guard per process, opened and closed with the app.

    python3 -m venv .venv && .venv/bin/pip install -e . -e ./tools fastapi
    .venv/bin/python examples/fastapi_app.py          # starts the simulated cluster and the app, calls it

Or serve it yourself against a running cluster::

    python -m llmguard_tools.sim --scenario stragglers          # prints {"urls": [...]}
    LLMGUARD_REPLICAS=http://127.0.0.1:PORT1,http://127.0.0.1:PORT2 uvicorn examples.fastapi_app:app

``GET /ask?q=...`` answers through the guard and reports the call's TTFT and attempts;
``GET /ask/stream?q=...`` streams the answer as plain text.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from llmguard_client import Guard, Tier, guard_failure


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    replicas = os.environ["LLMGUARD_REPLICAS"].split(",")
    async with Guard(replicas=replicas, tiers={"interactive": Tier(ttft=1.0, total=30.0, stall=2.0)}) as guard:
        app.state.guard = guard
        app.state.llm = openai.AsyncOpenAI(
            base_url=replicas[0] + "/v1", api_key="sim", http_client=guard.http_client_for(openai.AsyncOpenAI)
        )
        yield  # the Guard (its pools, its in-flight calls) is closed when the app stops


app = FastAPI(lifespan=lifespan)


@app.get("/ask")
async def ask(request: Request, q: str) -> dict[str, Any]:
    guard: Guard = request.app.state.guard
    llm: openai.AsyncOpenAI = request.app.state.llm
    with guard.capture() as calls:
        try:
            done = await llm.chat.completions.create(
                model="sim-model", messages=[{"role": "user", "content": q}], max_tokens=20
            )
            answer: str | None = done.choices[0].message.content
        except openai.APIError as exc:
            return {"error": guard_failure(exc) or type(exc).__name__}
    record = calls[-1]
    return {"answer": answer, "ttft_ms": round((record.ttft or 0.0) * 1000), "attempts": len(record.attempts)}


@app.get("/ask/stream")
async def ask_stream(request: Request, q: str) -> StreamingResponse:
    llm: openai.AsyncOpenAI = request.app.state.llm
    stream = await llm.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": q}], max_tokens=20, stream=True
    )

    async def text() -> AsyncIterator[str]:
        async for chunk in stream:  # the client going away closes this stream, and the guard the upstream
            if chunk.choices and chunk.choices[0].delta.content:
                yield chunk.choices[0].delta.content

    return StreamingResponse(text(), media_type="text/plain")


def _demo() -> None:
    from llmguard_tools.sim.launch import spawn_cluster

    with spawn_cluster("stragglers") as urls:
        os.environ["LLMGUARD_REPLICAS"] = ",".join(urls)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            for q in ("first", "second", "third"):
                print("/ask        ", http.get("/ask", params={"q": q}).json())
            print("/ask/stream ", repr(http.get("/ask/stream", params={"q": "stream it"}).text[:60]))
        server.should_exit = True
        thread.join()


if __name__ == "__main__":
    _demo()
