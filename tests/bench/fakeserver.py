"""A small OpenAI-compatible replica for the bench tests: Starlette served by uvicorn on loopback.

It streams ``max_tokens`` content chunks (``ignore_eos``) paced by ``token_delay``, records every body it
receives, exposes ``/sim/stats`` and ``/sim/reset`` like the simulated cluster, counts disconnects, and
can inject failures through ``FakeReplica.behaviour`` (a function of the request index and attempt).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Behaviour:
    """What to do with one received request: an error status (+ Retry-After), or stream after a delay."""

    status: int = 200
    retry_after: float | None = None
    first_token_delay: float = 0.0


BehaviourFn = Callable[[int, int], Behaviour]
"""(request index parsed from the prompt's first word ``req<i>``, attempt number across the cluster)
-> Behaviour. Attempt numbers restart at ``/sim/reset``."""


@dataclass
class FakeReplica:
    token_delay: float = 0.002
    behaviour: BehaviourFn = field(default=lambda index, attempt: Behaviour())
    bodies: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    running: int = 0
    max_running: int = 0
    attempts_by_index: collections.Counter[int] = field(default_factory=collections.Counter)
    """Shared by the replicas of one `fake_cluster`."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.bodies.clear()
        self.auth.clear()
        self.attempts_by_index.clear()
        self.max_running = 0
        self.counters = dict.fromkeys(
            (
                "received",
                "admitted",
                "rejected",
                "completed",
                "aborted_by_disconnect",
                "work_tokens",
                "aborted_work_tokens",
                "preemptions",
            ),
            0,
        )

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "running": self.running, "waiting": 0, "kv_used": 0, "kv_total": 1000}

    def app(self) -> Starlette:
        async def models(request: Request) -> Response:
            return JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

        async def stats(request: Request) -> Response:
            return JSONResponse(self.stats())

        async def reset(request: Request) -> Response:
            self.reset()
            return JSONResponse({"ok": True})

        async def chat(request: Request) -> Response:
            body = await request.json()
            self.bodies.append(body)
            self.auth.append(request.headers.get("authorization"))
            self.counters["received"] += 1
            content = body["messages"][-1]["content"]
            first = content.split()[0]
            index = int(first[3:]) if first.startswith("req") else -1
            with self.lock:
                self.attempts_by_index[index] += 1
                attempt = self.attempts_by_index[index]
            b = self.behaviour(index, attempt)
            if b.status != 200:
                self.counters["rejected"] += 1
                headers = {} if b.retry_after is None else {"retry-after": f"{b.retry_after:g}"}
                return JSONResponse({"error": {"message": "injected", "code": b.status}}, b.status, headers)
            self.counters["admitted"] += 1
            n_out = int(body.get("max_tokens") or 16)
            prompt_tokens = len(content.split())
            if not body.get("stream"):
                self.counters["completed"] += 1
                self.counters["work_tokens"] += n_out
                return JSONResponse(
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "w " * n_out}}],
                        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n_out},
                    }
                )
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                self._stream(n_out, prompt_tokens, include_usage, b.first_token_delay),
                media_type="text/event-stream",
            )

        return Starlette(
            routes=[
                Route("/v1/models", models),
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/sim/stats", stats),
                Route("/sim/reset", reset, methods=["POST"]),
            ]
        )

    async def _stream(
        self, n_out: int, prompt_tokens: int, include_usage: bool, first_delay: float
    ) -> AsyncIterator[str]:
        def chunk(delta: dict[str, Any], usage: dict[str, int] | None = None) -> str:
            obj: dict[str, Any] = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": "fake-model",
                "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": None}],
            }
            if usage:
                obj["usage"] = usage
            return f"data: {json.dumps(obj)}\n\n"

        self.running += 1
        self.max_running = max(self.max_running, self.running)
        produced = 0
        finished = False
        try:
            yield chunk({"role": "assistant", "content": ""})
            if first_delay:
                await asyncio.sleep(first_delay)
            for _ in range(n_out):
                produced += 1
                yield chunk({"content": "tok "})
                await asyncio.sleep(self.token_delay)
            if include_usage:
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n_out, "total_tokens": 0}
                yield chunk({}, usage)
            yield "data: [DONE]\n\n"
            finished = True
        finally:
            self.running -= 1
            self.counters["work_tokens"] += produced
            if finished:
                self.counters["completed"] += 1
            else:
                self.counters["aborted_by_disconnect"] += 1
                self.counters["aborted_work_tokens"] += produced


class ServerThread:
    """Run one Starlette app under uvicorn on 127.0.0.1:<ephemeral> in a daemon thread."""

    def __init__(self, app: Starlette) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@dataclass
class FakeCluster:
    replicas: list[FakeReplica]
    urls: list[str]

    def reset(self) -> None:
        for r in self.replicas:
            r.reset()
            r.behaviour = lambda index, attempt: Behaviour()

    def bodies(self) -> list[dict[str, Any]]:
        return [b for r in self.replicas for b in r.bodies]

    def set_behaviour(self, fn: BehaviourFn) -> None:
        for r in self.replicas:
            r.behaviour = fn


@contextlib.contextmanager
def fake_cluster(n: int = 2, token_delay: float = 0.002) -> Iterator[FakeCluster]:
    shared: collections.Counter[int] = collections.Counter()
    lock = threading.Lock()
    replicas = [FakeReplica(token_delay=token_delay, attempts_by_index=shared, lock=lock) for _ in range(n)]
    threads = [ServerThread(r.app()) for r in replicas]
    urls: list[str] = []
    try:
        for t in threads:
            urls.append(t.start())
        yield FakeCluster(replicas, urls)
    finally:
        for t in threads:
            t.stop()
