"""The one scriptable OpenAI-compatible test server, on 127.0.0.1, for tests of real request paths.

Each `LoopbackServer` runs uvicorn in its own thread and event loop, so disconnects, pooling and
timing are real (with ``http2=True``, hypercorn: HTTP/2 with prior knowledge as well as HTTP/1.1). A test
sets ``server.script`` to a `Script` describing the next responses, or
``server.scripter`` to choose a `Script` per request; the server records every request it received and
every response it could not finish because the client went away.

It is the tests' member of the simulator's server family (`llmguard_tools.sim`): uvicorn and starlette as the
simulated cluster's replicas, the simulator's SSE framing and its Responses and Messages encoders; what it adds is
the per-test script. For the bench harness it also speaks the simulated cluster's side channel: ``GET /sim/stats`` (the
sim's counters: received, admitted, rejected, completed, aborted_by_disconnect, work_tokens...) and
``POST /sim/reset``. `loopback_cluster` runs several servers that share one attempt counter.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from llmguard_tools.sim.wire import DONE, sse
from llmguard_tools.sim.wire_messages import MessagesWire
from llmguard_tools.sim.wire_responses import ResponsesWire

CHAT_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/files", "/v1/embeddings")
COUNTERS = (
    "received",
    "admitted",
    "rejected",
    "completed",
    "aborted_by_disconnect",
    "work_tokens",
    "aborted_work_tokens",
    "preemptions",
)

VLLM_BUSY: dict[str, Any] = {
    "message": "The engine is currently busy and cannot accept new requests. Please try again later or on a "
    "different instance.",
    "type": "Service Unavailable",
    "param": None,
    "code": 503,
}
"""The error vLLM 0.32 sends on queue overflow (``--max-num-queued-reqs``), inside a 200 stream under races."""

FAILED_RESPONSE: dict[str, Any] = {
    "id": "resp_1",
    "object": "response",
    "status": "failed",
    "error": {"code": "server_error", "message": "The model failed to generate a response."},
    "output": [],
    "model": "m",
}
"""A non-streamed Responses API answer that says it failed: the openai SDK returns it as a `Response`."""


@dataclass
class Script:
    """What the server answers. Times are seconds."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    """For an error status or a JSON answer: the body (dict -> JSON, str or bytes -> as is, labelled text/html unless
    ``headers`` give a content-type)."""
    tokens: int | None = 5
    """Content chunks to stream; None: the request's ``max_tokens`` (as a server honouring ``ignore_eos``)."""
    role_chunk: bool = True
    keepalives_before: int = 0
    stall_before_first: float = 0.0
    keepalive_every: float = 0.0
    """During ``stall_before_first``, an SSE comment (``: keep-alive``) every so many seconds."""
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
    open_after_error: float = 0.0
    """Seconds the body is held open after the ``error_at`` event before it ends."""
    open_after_end: float = 0.0
    """Seconds the body is held open after the protocol's end marker before it ends (a server or proxy that tidies
    up before it closes)."""
    truncate_at: int | None = None
    """End the body cleanly just before token ``truncate_at``: no finish reason, no end marker."""
    malformed_at: int | None = None
    """Send an event whose data is not JSON just before token ``malformed_at``."""
    json_for_stream: bool = False
    """Answer a plain JSON completion even when the request asked for a stream."""
    stream_media_type: str | None = "text/event-stream"
    """The content type a stream is labelled with (None: no ``content-type`` header), whatever it holds."""
    continued: Script | None = None
    """The script for a continuation request (one already holding `` t0 t1 ...``); its tokens go on from there."""
    tool_calls: bool = False
    """Chat: stream each token as a tool call's arguments instead of content."""


Scripter = Callable[[int, int], "Script | None"]
"""(request index from the prompt's first word ``req<i>``, or -1; attempt number of that index across the
servers sharing the counter, from 1) -> the `Script` for this request, or None for ``server.script``."""


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float
    peer: str | None = None
    """The client's ``host:port``: the same peer means the same (reused) connection."""


class ConcurrencyGauge:
    """Streams running at once across the servers that share it (one cluster), and the most seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self.max_running = 0

    def add(self, delta: int) -> None:
        with self._lock:
            self.running += delta
            self.max_running = max(self.max_running, self.running)


class LoopbackServer:
    def __init__(
        self,
        name: str,
        *,
        default: Script | None = None,
        model: str = "test-model",
        attempts: collections.Counter[int] | None = None,
        lock: threading.Lock | None = None,
        gauge: ConcurrencyGauge | None = None,
        http2: bool = False,
        routes: Sequence[BaseRoute] = (),
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        """``routes``: more starlette routes, after the OpenAI ones (e.g. another API's paths); ``tls``: a
        (certificate, key) pair to serve HTTPS with (uvicorn only; `tests.redis_cluster.make_certificates`)."""
        if tls is not None and http2:
            raise ValueError("tls= is served by uvicorn, without http2=True")
        self.name = name
        self.gauge = gauge or ConcurrencyGauge()
        self.model = model
        self.default = default or Script()
        self.script = self.default
        self.scripter: Scripter | None = None
        self.received: list[Received] = []
        self.disconnects = 0
        self.completed = 0
        self.started_streams = 0
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.running = 0
        self.max_running = 0
        self._generation = 0
        """Bumped by `reset`: a request still being served from before (the client gone, the server not yet told)
        counts its disconnect or completion in no later test's counters."""
        self.attempts_by_index: collections.Counter[int] = collections.Counter() if attempts is None else attempts
        self._lock = lock or threading.Lock()
        self.token_times: list[float] = []
        """``time.monotonic()`` when each content token of the last stream was handed to the server."""
        # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
        # without it uvicorn's separate header and body writes wait out a 40 ms delayed ACK on every reused
        # connection (Nagle).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._sock = sock
        self.url = f"{'http' if tls is None else 'https'}://127.0.0.1:{self.port}"
        app = Starlette(
            routes=[
                *(Route(path, self._chat, methods=["POST"]) for path in CHAT_PATHS),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/sim/stats", self._stats, methods=["GET"]),
                Route("/sim/reset", self._reset, methods=["POST"]),
                *routes,
            ]
        )
        self._server: uvicorn.Server | _Hypercorn = (
            _Hypercorn(app, sock)
            if http2
            else uvicorn.Server(
                uvicorn.Config(
                    app,
                    log_level="warning",
                    lifespan="off",
                    timeout_graceful_shutdown=1,
                    ssl_certfile=None if tls is None else str(tls[0]),
                    ssl_keyfile=None if tls is None else str(tls[1]),
                )
            )
        )
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        if isinstance(self._server, _Hypercorn):
            asyncio.run(self._server.serve())
        else:
            asyncio.run(self._server.serve(sockets=[self._sock]))

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("loopback server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.request_stop()
        self._thread.join(timeout=5)

    def request_stop(self) -> None:
        """Ask the server to exit without waiting (uvicorn's shutdown takes 0.1-0.2 s: stop several at once)."""
        self._server.should_exit = True

    def reset(self) -> None:
        """Back to the default script, no scripter, nothing received, every counter at zero."""
        self.script = self.default
        self.scripter = None
        self._generation += 1
        self.reset_counters()

    def reset_counters(self) -> None:
        """What ``POST /sim/reset`` does: forget what was received and counted (the script stays)."""
        self.received.clear()
        self.disconnects = self.completed = self.started_streams = 0
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.max_running = 0
        self.token_times = []
        with self._lock:
            self.attempts_by_index.clear()

    def bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies of the completion requests received."""
        return [r.body for r in self.received if r.path in CHAT_PATHS]

    def auth(self) -> list[str | None]:
        """The ``authorization`` header of each completion request received."""
        return [r.headers.get("authorization") for r in self.received if r.path in CHAT_PATHS]

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> bool:
        """Poll (from the test's thread) until ``predicate()`` holds; it returns as soon as it does, so the
        timeout costs nothing to a passing test and only gives a loaded machine's server thread room."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.01)
        return bool(predicate())

    async def _models(self, request: Request) -> Response:
        self.received.append(Received(request.url.path, dict(request.headers), {}, time.monotonic()))
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _stats(self, request: Request) -> Response:
        stats = {**self.counters, "running": self.running, "waiting": 0, "kv_used": 0, "kv_total": 1000}
        return JSONResponse(stats)

    async def _reset(self, request: Request) -> Response:
        self.reset_counters()
        return JSONResponse({"ok": True})

    def _script_for(self, body: dict[str, Any]) -> Script:
        scripter = self.scripter
        if scripter is None:
            return self.script
        messages = body.get("messages") or [{}]
        words = str(messages[-1].get("content") or "").split()
        index = int(words[0][3:]) if words and words[0].startswith("req") and words[0][3:].isdigit() else -1
        with self._lock:
            self.attempts_by_index[index] += 1
            attempt = self.attempts_by_index[index]
        return scripter(index, attempt) or self.script

    async def _chat(self, request: Request) -> Response:
        generation = self._generation
        raw = await request.body()
        body = json.loads(raw) if raw else {}
        peer = f"{request.client.host}:{request.client.port}" if request.client else None
        self.received.append(Received(request.url.path, dict(request.headers), body, time.monotonic(), peer))
        self.counters["received"] += 1
        script = self._script_for(body)
        if script.continued is not None and _continued_tokens(_protocol(request.url.path), body):
            script = script.continued
        if script.hang_before_headers:
            until = time.monotonic() + script.hang_before_headers
            while time.monotonic() < until:
                if await request.is_disconnected():
                    if generation == self._generation:
                        self.disconnects += 1
                        self.counters["aborted_by_disconnect"] += 1
                    return Response(status_code=499)
                await asyncio.sleep(0.01)
        if script.status >= 400 or script.body is not None:
            self.counters["rejected" if script.status >= 400 else "completed"] += 1
            content = script.body if script.body is not None else {"error": {"message": "scripted", "type": "x"}}
            if isinstance(content, (str, bytes)):
                return Response(content, status_code=script.status, headers=script.headers, media_type="text/html")
            return JSONResponse(content, status_code=script.status, headers=script.headers)
        self.counters["admitted"] += 1
        tokens = script.tokens if script.tokens is not None else int(body.get("max_tokens") or 16)
        encoder = _encoder(request.url.path, body, script, tokens, self.model)
        if not body.get("stream") or script.json_for_stream:
            self.counters["completed"] += 1
            self.counters["work_tokens"] += 1
            return Response(encoder.complete(), media_type="application/json", headers=script.headers)
        return StreamingResponse(
            self._events(encoder, script, tokens, generation),
            media_type=script.stream_media_type,
            headers=script.headers,
        )

    async def _events(self, encoder: _Encoder, script: Script, tokens: int, generation: int) -> AsyncIterator[bytes]:
        self.started_streams += 1
        self.token_times = []
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self.gauge.add(1)
        open_ = True
        finished = False
        produced = 0
        try:
            if script.role_chunk:
                yield encoder.opening()
            for _ in range(script.keepalives_before):
                yield b": keep-alive\n\n"
            if script.stall_before_first:
                waited = 0.0
                while script.keepalive_every and waited + script.keepalive_every < script.stall_before_first:
                    await asyncio.sleep(script.keepalive_every)
                    waited += script.keepalive_every
                    yield b": keep-alive\n\n"
                await asyncio.sleep(script.stall_before_first - waited)
            for i in range(tokens + 1):
                if i == script.error_at:
                    yield encoder.error_event(script.error)
                    if script.open_after_error:
                        await asyncio.sleep(script.open_after_error)
                    finished = True
                    return
                if i == script.truncate_at:
                    finished = True
                    return
                if i == script.malformed_at:
                    yield b"data: {not json\n\n"
                if i == tokens:
                    break
                if i == 1 and script.stall_after_first:
                    await asyncio.sleep(script.stall_after_first)
                elif i and script.gap:
                    await asyncio.sleep(script.gap)
                if script.reset_after_tokens is not None and i == script.reset_after_tokens:
                    raise ConnectionResetError("scripted reset")
                produced += 1
                self.token_times.append(time.monotonic())
                yield encoder.token(i)
            # The stream stops counting as open before its last bytes go out: a client reading them may open its
            # next stream before this generator is resumed to run its finally.
            open_ = False
            self.running -= 1
            self.gauge.add(-1)
            yield encoder.closing()
            finished = True
            if generation == self._generation:
                self.completed += 1
                self.counters["completed"] += 1
            if script.open_after_end:
                await asyncio.sleep(script.open_after_end)
        finally:
            if open_:
                self.running -= 1
                self.gauge.add(-1)
            if generation == self._generation:  # not a stream of an earlier test
                self.counters["work_tokens"] += produced
                if not finished:
                    self.disconnects += 1
                    self.counters["aborted_by_disconnect"] += 1
                    self.counters["aborted_work_tokens"] += produced

    def _completion(self) -> dict[str, Any]:
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
        }


class _Hypercorn:
    """Serves the app with hypercorn on the server's socket, with uvicorn.Server's ``started``/``should_exit``."""

    def __init__(self, app: Starlette, sock: socket.socket) -> None:
        from hypercorn.config import Config

        self._app = app
        self._config = Config()
        self._config.bind = [f"fd://{sock.fileno()}"]
        self._config.graceful_timeout = 1
        self.started = False
        self.should_exit = False

    async def serve(self) -> None:
        from hypercorn.asyncio import serve

        async def until_asked_to_exit() -> None:
            self.started = True
            while not self.should_exit:  # noqa: ASYNC110 - set from another thread, as uvicorn's is
                await asyncio.sleep(0.05)

        await serve(self._app, self._config, shutdown_trigger=until_asked_to_exit)  # type: ignore[arg-type]


@dataclass
class LoopbackCluster:
    """Servers standing in for a cluster's replicas; they share one attempt counter per request index."""

    servers: list[LoopbackServer]
    gauge: ConcurrencyGauge

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def reset(self) -> None:
        for s in self.servers:
            s.reset()
        self.gauge.max_running = self.gauge.running

    def bodies(self) -> list[dict[str, Any]]:
        return [b for s in self.servers for b in s.bodies()]

    def set_scripter(self, scripter: Scripter) -> None:
        for s in self.servers:
            s.scripter = scripter


@contextlib.contextmanager
def loopback_cluster(n: int = 2, *, default: Script | None = None) -> Iterator[LoopbackCluster]:
    """``n`` started servers whose default script streams the request's ``max_tokens`` 2 ms apart."""
    attempts: collections.Counter[int] = collections.Counter()
    lock = threading.Lock()
    gauge = ConcurrencyGauge()
    default = default or Script(tokens=None, gap=0.002)
    servers = [LoopbackServer(f"r{i}", default=default, attempts=attempts, lock=lock, gauge=gauge) for i in range(n)]
    with running(servers):
        yield LoopbackCluster(servers, gauge)


@contextlib.contextmanager
def running(servers: list[LoopbackServer]) -> Iterator[list[LoopbackServer]]:
    """``servers`` started, and stopped together on exit (those that started, if one fails to)."""
    started: list[LoopbackServer] = []
    try:
        for server in servers:
            server.start()
            started.append(server)
        yield servers
    finally:
        stop_all(started)


def answering_stream(body: bytes) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any]:
    """A `raw_server` handler that reads one request and answers ``body`` as a 200 event stream, then closes."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        await reader.readexactly(int(length.group(1)) if length else 0)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    return answer


@contextlib.asynccontextmanager
async def raw_server(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any],
) -> AsyncIterator[str]:
    """A server on the test's own loop that runs ``handle`` for each connection, as it is (for answers no
    `Script` describes: a hang-up, a fixed body); its base URL."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


def stop_all(servers: list[LoopbackServer]) -> None:
    """Stop ``servers`` together: every one is asked to exit before any is waited for."""
    for server in servers:
        server.request_stop()
    for server in servers:
        server.stop()


class _Encoder:
    """The answer's bytes in the request's protocol (by path); tokens are `` t0``, `` t1``, ..."""

    def __init__(self, protocol: str, body: dict[str, Any], script: Script, tokens: int, model: str) -> None:
        self.protocol = protocol
        self.tokens = tokens
        include = script.include_usage
        if include is None:
            include = bool((body.get("stream_options") or {}).get("include_usage"))
        self.include_usage = include
        self.tool_calls = script.tool_calls
        self.base = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": model}
        if protocol == "completions":
            self.base = {**self.base, "id": "cmpl-test", "object": "text_completion"}
        self.offset = _continued_tokens(protocol, body)
        """Tokens of a continued answer already in the request (`` t0 t1 ...``): numbering goes on from there."""
        self.responses = ResponsesWire("test", 0, model)
        self.messages = MessagesWire("test", model, 7)

    def _choice(self, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if self.protocol == "completions":
            return {"index": 0, "text": text or "", "finish_reason": finish}
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if text is not None and self.tool_calls:
            delta["tool_calls"] = [{"index": 0, "function": {"arguments": text}}]
        elif text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "finish_reason": finish}

    def opening(self) -> bytes:
        if self.protocol == "responses":
            return self.responses.opening()
        if self.protocol == "messages":
            return self.messages.opening()
        return sse({**self.base, "choices": [self._choice(None, None, role=True)]})

    def token(self, i: int) -> bytes:
        if self.protocol == "responses":
            return self.responses.token_of(f" t{i}")
        if self.protocol == "messages":
            return self.messages.token_of(f" t{i}")
        return sse({**self.base, "choices": [self._choice(f" t{self.offset + i}", None)]})

    def closing(self) -> bytes:
        if self.protocol == "responses":
            return self.responses.closing("stop", 7, self.tokens)
        if self.protocol == "messages":
            return self.messages.closing("stop", 7, self.tokens)
        out = sse({**self.base, "choices": [self._choice(None, "stop")]})
        if self.include_usage:
            usage = {"prompt_tokens": 7, "completion_tokens": self.tokens, "total_tokens": 7 + self.tokens}
            out += sse({**self.base, "choices": [], "usage": usage})
        return out + DONE

    def error_event(self, error: dict[str, Any]) -> bytes:
        if self.protocol == "responses":
            data = {"type": "error", "code": error.get("code"), "message": error.get("message"), "param": None}
            return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
        if self.protocol == "messages":
            kind = "overloaded_error" if error.get("code") in (503, 529) else str(error.get("type"))
            data = {"type": "error", "error": {"type": kind, "message": error.get("message")}}
            return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
        return sse({"error": error}) + DONE

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


def _continued_tokens(protocol: str, body: dict[str, Any]) -> int:
    """How many `` tN`` tokens a continuation request already holds (completions: the prompt; chat: the
    trailing assistant message of a ``continue_final_message`` request, as vLLM continues it)."""
    if protocol == "completions":
        text = body.get("prompt")
    elif protocol == "chat" and body.get("continue_final_message"):
        text = (body.get("messages") or [{}])[-1].get("content")
    else:
        return 0
    return len(re.findall(r"(?<= )t\d+", text)) if isinstance(text, str) else 0


def _protocol(path: str) -> str:
    for suffix, protocol in (
        ("/chat/completions", "chat"),
        ("/completions", "completions"),
        ("/responses", "responses"),
        ("/messages", "messages"),
    ):
        if path.endswith(suffix):
            return protocol
    return "chat"  # /v1/files and the like: a chat answer, as before


def _encoder(path: str, body: dict[str, Any], script: Script, tokens: int, model: str) -> _Encoder:
    return _Encoder(_protocol(path), body, script, tokens, model)
