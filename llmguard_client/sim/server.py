"""The Starlette ASGI app of one replica: OpenAI-compatible completions (SSE or JSON), models, stats.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``, ``GET /sim/stats``,
``POST /sim/reset``, ``GET /metrics`` (vLLM's queue and KV-cache gauges). A client disconnect (the ASGI
``http.disconnect`` message, or a failed send) aborts the request in the engine at once; a ``finally`` releases
it on every other way out (error, cancellation).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Literal

import anyio
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from llmguard_client.sim.engine import EngineRequest, Rejected, RequestTooLarge, Sequence
from llmguard_client.sim.faults import FaultPlan, retry_after_headers
from llmguard_client.sim.protocol import BadRequest, CompletionRequest, parse_request
from llmguard_client.sim.replica import Replica
from llmguard_client.sim.wire import DONE, Wire, error_body

__all__ = ["InjectedConnectionReset", "build_app"]

HTML_500 = (
    b"<html>\r\n<head><title>500 Internal Server Error</title></head>\r\n<body>\r\n"
    b"<center><h1>500 Internal Server Error</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)

Outcome = Literal["done", "reset", "gone"]


class InjectedConnectionReset(Exception):
    """Raised on purpose mid-response so that uvicorn drops the connection without a clean end."""


class _QuietInjectedFaults(logging.Filter):
    """Drops uvicorn's error records for what the sim does on purpose.

    Those are injected connection resets and the cancellation of in-flight requests (streams still open, black
    holes) when a cluster shuts down; every such request is released by its handler's ``finally``.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, (InjectedConnectionReset, asyncio.CancelledError)):
            return False
        return not record.getMessage().endswith("timeout graceful shutdown exceeded")


logging.getLogger("uvicorn.error").addFilter(_QuietInjectedFaults())


async def _send_bytes(send: Send, status: int, body: bytes, content_type: str, headers: list[tuple[str, str]]) -> None:
    raw = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_error(send: Send, status: int, message: str, type_: str, headers: list[tuple[str, str]]) -> None:
    await _send_bytes(send, status, error_body(message, type_, type_), "application/json", headers)


class _Completions:
    """The ASGI endpoint of ``/v1/chat/completions`` (``chat``) or ``/v1/completions`` (``text``)."""

    def __init__(self, replica: Replica, kind: Literal["chat", "text"]) -> None:
        self.replica = replica
        self.kind: Literal["chat", "text"] = kind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        replica = self.replica
        replica.counters.received += 1
        try:
            parsed = parse_request(await Request(scope, receive).body(), self.kind, replica.model)
        except ClientDisconnect:
            return
        except BadRequest as exc:
            replica.counters.bad_requests += 1
            await _send_error(send, 400, str(exc), "invalid_request_error", [])
            return
        plan = replica.draw_faults()
        if plan.html_500:
            replica.counters.html_500 += 1
            await _send_bytes(send, 500, HTML_500, "text/html", [])
            return
        if plan.blackhole:
            replica.counters.blackholed += 1
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        seq = await self._submit(parsed, send)
        if seq is None:
            return
        try:
            await self._serve(seq, parsed, plan, receive, send)
        finally:
            replica.abort(seq, by_disconnect=False)  # a no-op unless something unexpected escaped _serve

    async def _submit(self, parsed: CompletionRequest, send: Send) -> Sequence | None:
        replica = self.replica
        model_len = replica.engine.config.model_len
        max_tokens = parsed.max_tokens if parsed.max_tokens is not None else max(1, model_len - parsed.prompt_tokens)
        request = EngineRequest(parsed.prompt_tokens, max_tokens, max_tokens if parsed.ignore_eos else None)
        try:
            return replica.submit(request)
        except Rejected as rejected:
            headers = retry_after_headers(replica.faults.retry_after, rejected.retry_after_s, time.time())
            message = f"Server overloaded ({rejected.reason} admission); retry later"
            await _send_error(send, 429, message, "rate_limit_exceeded", headers)
        except RequestTooLarge as exc:
            replica.counters.bad_requests += 1
            await _send_error(send, 400, str(exc), "invalid_request_error", [])
        return None

    async def _serve(
        self, seq: Sequence, parsed: CompletionRequest, plan: FaultPlan, receive: Receive, send: Send
    ) -> None:
        replica = self.replica
        faults = replica.faults
        if faults.first_token_delay_s and replica.slow_now():
            replica.stall(seq, faults.first_token_delay_s)
        if plan.stall_first:
            replica.counters.stalled_first += 1
            replica.stall(seq, faults.stall_first_s)
        if plan.stall_mid:
            replica.counters.stalled_mid += 1
            replica.engine.stall_after(seq, min(faults.fault_after_tokens, seq.output_tokens), faults.stall_mid_s)
        wire = Wire(
            self.kind,
            f"{'chatcmpl' if self.kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}",
            int(time.time()),
            parsed.model,
            include_usage=parsed.stream and parsed.include_usage,
        )
        outcome: Outcome | None = None
        disconnected = False

        async def watch_disconnect(scope: anyio.CancelScope) -> None:
            nonlocal disconnected
            while (await receive())["type"] != "http.disconnect":
                pass
            if not seq.done:
                disconnected = True
                replica.abort(seq, by_disconnect=True)
            scope.cancel()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_disconnect, tg.cancel_scope)
                if parsed.stream:
                    outcome = await self._stream(seq, parsed, plan, wire, send)
                else:
                    outcome = await self._respond(seq, parsed, plan, wire, send)
                tg.cancel_scope.cancel()
        finally:
            replica.abort(seq, by_disconnect=disconnected or outcome == "gone")
        if outcome == "reset":
            raise InjectedConnectionReset(f"injected connection reset on replica {replica.index}")

    def _fault_at(self, seq: Sequence) -> int:
        return min(self.replica.faults.fault_after_tokens, seq.output_tokens)

    async def _stream(
        self, seq: Sequence, parsed: CompletionRequest, plan: FaultPlan, wire: Wire, send: Send
    ) -> Outcome:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        headers.append((b"x-sim-replica", str(self.replica.index).encode()))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            role = wire.role()
            if role is not None:
                await send({"type": "http.response.body", "body": role, "more_body": True})
            sent, fault_at = 0, self._fault_at(seq)
            while True:
                await self.replica.wait_progress(seq, sent)
                chunks: list[bytes] = []
                while sent < seq.generated:
                    sent += 1
                    chunks.append(wire.token())
                    if sent == fault_at and (plan.malformed or plan.reset):
                        if plan.malformed:
                            self.replica.counters.malformed += 1
                            chunks.append(wire.malformed())
                        if plan.reset:
                            await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": True})
                            return self._reset(seq)
                if chunks:
                    await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": True})
                if seq.done:
                    break
            if seq.finish_reason is None:
                return "gone"
            tail = [wire.finish(seq.finish_reason), wire.usage(parsed.prompt_tokens, seq.generated), DONE]
            body = b"".join(part for part in tail if part is not None)
            await send({"type": "http.response.body", "body": body, "more_body": False})
        except OSError:
            return "gone"
        return "done"

    async def _respond(
        self, seq: Sequence, parsed: CompletionRequest, plan: FaultPlan, wire: Wire, send: Send
    ) -> Outcome:
        try:
            while not seq.done:
                await self.replica.wait_progress(seq, seq.generated)
            if seq.finish_reason is None:
                return "gone"
            body = wire.complete(seq.generated, seq.finish_reason, parsed.prompt_tokens)
            if plan.malformed:
                self.replica.counters.malformed += 1
                body = body[: len(body) // 2]
            if not plan.reset:
                await _send_bytes(send, 200, body, "application/json", [("x-sim-replica", str(self.replica.index))])
                return "done"
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
        except OSError:
            return "gone"
        return self._reset(seq)

    def _reset(self, seq: Sequence) -> Outcome:
        self.replica.counters.resets += 1
        self.replica.abort(seq, by_disconnect=False)
        return "reset"


def build_app(replica: Replica) -> Starlette:
    """The ASGI app serving ``replica``."""

    async def models(request: Request) -> Response:
        entry = {"id": replica.model, "object": "model", "created": 0, "owned_by": "llmguard-sim"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def stats(request: Request) -> Response:
        return JSONResponse(replica.stats())

    async def metrics(request: Request) -> Response:
        """The two vLLM gauges a client can route on (Prometheus text, as vLLM serves them)."""
        engine, label = replica.engine, f'{{model_name="{replica.model}"}}'
        text = (
            f"vllm:num_requests_waiting{label} {float(engine.waiting)}\n"
            f"vllm:num_requests_running{label} {float(engine.running)}\n"
            f"vllm:kv_cache_usage_perc{label} {engine.kv_used / engine.config.kv_tokens}\n"
        )
        return Response(text, media_type="text/plain; version=0.0.4")

    async def reset(request: Request) -> Response:
        replica.reset_stats()
        return JSONResponse({"ok": True})

    routes = [
        Route("/v1/chat/completions", _Completions(replica, "chat"), methods=["POST"]),
        Route("/v1/completions", _Completions(replica, "text"), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/sim/stats", stats, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/sim/reset", reset, methods=["POST"]),
    ]
    return Starlette(routes=routes)
