"""A scriptable OpenAI-compatible server on 127.0.0.1, for tests of the real request path.

Each `LoopbackServer` runs uvicorn in its own thread and event loop, so disconnects,
pooling and timing are real. A test sets ``server.script`` to a `Script` describing
the next responses; the server records every request it received and every
response it could not finish because the client went away.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Script:
    """What the server answers. Times are seconds."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    """For an error status or a JSON answer: the body (dict -> JSON, str -> as is)."""
    tokens: int = 5
    role_chunk: bool = True
    keepalives_before: int = 0
    stall_before_first: float = 0.0
    gap: float = 0.0
    stall_after_first: float = 0.0
    include_usage: bool | None = None
    """None: follow the request's stream_options.include_usage."""
    hang_before_headers: float = 0.0
    reset_after_tokens: int | None = None


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float


class LoopbackServer:
    def __init__(self, name: str) -> None:
        self.name = name
        self.script = Script()
        self.received: list[Received] = []
        self.disconnects = 0
        self.completed = 0
        self.started_streams = 0
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._sock = sock
        self.url = f"http://127.0.0.1:{self.port}"
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/files", self._chat, methods=["POST"]),
            ]
        )
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._sock]))

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("loopback server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)

    def reset(self) -> None:
        self.script = Script()
        self.received.clear()
        self.disconnects = self.completed = self.started_streams = 0

    def wait_for(self, predicate: Any, timeout: float = 3.0) -> bool:
        """Poll (from the test's thread) until ``predicate()`` holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.01)
        return bool(predicate())

    async def _models(self, request: Request) -> Response:
        self.received.append(Received(request.url.path, dict(request.headers), {}, time.monotonic()))
        return JSONResponse({"object": "list", "data": [{"id": "test-model", "object": "model"}]})

    async def _chat(self, request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw) if raw else {}
        self.received.append(Received(request.url.path, dict(request.headers), body, time.monotonic()))
        script = self.script
        if script.hang_before_headers:
            until = time.monotonic() + script.hang_before_headers
            while time.monotonic() < until:
                if await request.is_disconnected():
                    self.disconnects += 1
                    return Response(status_code=499)
                await asyncio.sleep(0.01)
        if script.status >= 400 or script.body is not None:
            content = script.body if script.body is not None else {"error": {"message": "scripted", "type": "x"}}
            if isinstance(content, str):
                return Response(content, status_code=script.status, headers=script.headers, media_type="text/html")
            return JSONResponse(content, status_code=script.status, headers=script.headers)
        if not body.get("stream"):
            return JSONResponse(_completion(body, script), headers=script.headers)
        return StreamingResponse(
            self._events(body, script), media_type="text/event-stream", headers=script.headers
        )

    async def _events(self, body: dict[str, Any], script: Script) -> AsyncIterator[bytes]:
        self.started_streams += 1
        finished = False
        try:
            created = int(time.time())
            base = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": created, "model": "test-model"}
            if script.role_chunk:
                yield _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            for _ in range(script.keepalives_before):
                yield b": keep-alive\n\n"
            if script.stall_before_first:
                await asyncio.sleep(script.stall_before_first)
            for i in range(script.tokens):
                if i == 1 and script.stall_after_first:
                    await asyncio.sleep(script.stall_after_first)
                elif i and script.gap:
                    await asyncio.sleep(script.gap)
                if script.reset_after_tokens is not None and i == script.reset_after_tokens:
                    raise ConnectionResetError("scripted reset")
                yield _sse({**base, "choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}]})
            yield _sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            include = script.include_usage
            if include is None:
                include = bool((body.get("stream_options") or {}).get("include_usage"))
            if include:
                usage = {"prompt_tokens": 7, "completion_tokens": script.tokens, "total_tokens": 7 + script.tokens}
                yield _sse({**base, "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"
            finished = True
            self.completed += 1
        finally:
            if not finished:
                self.disconnects += 1


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _completion(body: dict[str, Any], script: Script) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "test-model",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
    }
