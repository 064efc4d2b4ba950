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

from llmguard_client.sim.wire_messages import MessagesWire
from llmguard_client.sim.wire_responses import ResponsesWire

VLLM_BUSY: dict[str, Any] = {
    "message": "The engine is currently busy and cannot accept new requests. Please try again later or on a "
    "different instance.",
    "type": "Service Unavailable",
    "param": None,
    "code": 503,
}
"""The error vLLM 0.32 sends on queue overflow (``--max-num-queued-reqs``), inside a 200 stream under races."""


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
    error_at: int | None = None
    """Send an in-stream error event (``error``) just before token ``error_at`` (0: before any token),
    then the protocol's tail after an error (``[DONE]`` for chat/completions, nothing else)."""
    error: dict[str, Any] = field(default_factory=lambda: dict(VLLM_BUSY))
    """The error object of ``error_at`` (default: vLLM 0.32's queue-overflow error, ``code: 503``)."""
    truncate_at: int | None = None
    """End the body cleanly just before token ``truncate_at``: no finish reason, no end marker."""
    malformed_at: int | None = None
    """Send an event whose data is not JSON just before token ``malformed_at``."""
    json_for_stream: bool = False
    """Answer a plain JSON completion even when the request asked for a stream."""


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float
    peer: str | None = None
    """The client's ``host:port``: the same peer means the same (reused) connection."""


class LoopbackServer:
    def __init__(self, name: str) -> None:
        self.name = name
        self.script = Script()
        self.received: list[Received] = []
        self.disconnects = 0
        self.completed = 0
        self.started_streams = 0
        self.token_times: list[float] = []
        """``time.monotonic()`` when each content token of the last stream was handed to the server."""
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._sock = sock
        self.url = f"http://127.0.0.1:{self.port}"
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._chat, methods=["POST"]),
                Route("/v1/responses", self._chat, methods=["POST"]),
                Route("/v1/messages", self._chat, methods=["POST"]),
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
        self.token_times = []

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
        peer = f"{request.client.host}:{request.client.port}" if request.client else None
        self.received.append(Received(request.url.path, dict(request.headers), body, time.monotonic(), peer))
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
        encoder = _encoder(request.url.path, body, script)
        if not body.get("stream") or script.json_for_stream:
            return Response(encoder.complete(), media_type="application/json", headers=script.headers)
        return StreamingResponse(self._events(encoder, script), media_type="text/event-stream", headers=script.headers)

    async def _events(self, encoder: _Encoder, script: Script) -> AsyncIterator[bytes]:
        self.started_streams += 1
        self.token_times = []
        finished = False
        try:
            if script.role_chunk:
                yield encoder.opening()
            for _ in range(script.keepalives_before):
                yield b": keep-alive\n\n"
            if script.stall_before_first:
                await asyncio.sleep(script.stall_before_first)
            for i in range(script.tokens + 1):
                if i == script.error_at:
                    yield encoder.error_event(script.error)
                    finished = True
                    return
                if i == script.truncate_at:
                    finished = True
                    return
                if i == script.malformed_at:
                    yield b"data: {not json\n\n"
                if i == script.tokens:
                    break
                if i == 1 and script.stall_after_first:
                    await asyncio.sleep(script.stall_after_first)
                elif i and script.gap:
                    await asyncio.sleep(script.gap)
                if script.reset_after_tokens is not None and i == script.reset_after_tokens:
                    raise ConnectionResetError("scripted reset")
                self.token_times.append(time.monotonic())
                yield encoder.token(i)
            yield encoder.closing()
            finished = True
            self.completed += 1
        finally:
            if not finished:
                self.disconnects += 1


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class _Encoder:
    """The answer's bytes in the request's protocol (by path); tokens are `` t0``, `` t1``, ..."""

    def __init__(self, protocol: str, body: dict[str, Any], script: Script) -> None:
        self.protocol = protocol
        self.tokens = script.tokens
        include = script.include_usage
        if include is None:
            include = bool((body.get("stream_options") or {}).get("include_usage"))
        self.include_usage = include
        self.base = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": "test-model"}
        if protocol == "completions":
            self.base = {**self.base, "id": "cmpl-test", "object": "text_completion"}
        self.responses = ResponsesWire("test", 0, "test-model")
        self.messages = MessagesWire("test", "test-model", 7)

    def _choice(self, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if self.protocol == "completions":
            return {"index": 0, "text": text or "", "finish_reason": finish}
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "finish_reason": finish}

    def opening(self) -> bytes:
        if self.protocol == "responses":
            return self.responses.opening()
        if self.protocol == "messages":
            return self.messages.opening()
        return _sse({**self.base, "choices": [self._choice(None, None, role=True)]})

    def token(self, i: int) -> bytes:
        if self.protocol == "responses":
            return self.responses.token_of(f" t{i}")
        if self.protocol == "messages":
            return self.messages.token_of(f" t{i}")
        return _sse({**self.base, "choices": [self._choice(f" t{i}", None)]})

    def closing(self) -> bytes:
        if self.protocol == "responses":
            return self.responses.closing("stop", 7, self.tokens)
        if self.protocol == "messages":
            return self.messages.closing("stop", 7, self.tokens)
        out = _sse({**self.base, "choices": [self._choice(None, "stop")]})
        if self.include_usage:
            usage = {"prompt_tokens": 7, "completion_tokens": self.tokens, "total_tokens": 7 + self.tokens}
            out += _sse({**self.base, "choices": [], "usage": usage})
        return out + b"data: [DONE]\n\n"

    def error_event(self, error: dict[str, Any]) -> bytes:
        if self.protocol == "responses":
            data = {"type": "error", "code": error.get("code"), "message": error.get("message"), "param": None}
            return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
        if self.protocol == "messages":
            kind = "overloaded_error" if error.get("code") in (503, 529) else str(error.get("type"))
            data = {"type": "error", "error": {"type": kind, "message": error.get("message")}}
            return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
        return _sse({"error": error}) + b"data: [DONE]\n\n"

    def complete(self) -> bytes:
        if self.protocol == "responses":
            return self.responses.complete(1, "stop", 7)
        if self.protocol == "messages":
            return self.messages.complete(1, "stop", 7)
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        if self.protocol == "completions":
            choice["text"] = "hello"
        else:
            choice["message"] = {"role": "assistant", "content": "hello"}
        body = {**self.base, "object": "chat.completion" if self.protocol == "chat" else "text_completion"}
        body.update(choices=[choice], usage={"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8})
        return json.dumps(body).encode()


def _encoder(path: str, body: dict[str, Any], script: Script) -> _Encoder:
    for suffix, protocol in (
        ("/chat/completions", "chat"),
        ("/completions", "completions"),
        ("/responses", "responses"),
        ("/messages", "messages"),
    ):
        if path.endswith(suffix):
            return _Encoder(protocol, body, script)
    return _Encoder("chat", body, script)  # /v1/files and the like: a chat answer, as before
