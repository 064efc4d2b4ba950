"""The Starlette ASGI app of one replica: OpenAI-compatible completions (SSE or JSON), models, stats.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses`` (OpenAI Responses API),
``POST /v1/messages`` (Anthropic Messages), ``GET /v1/models``, ``GET /sim/stats``, ``POST /sim/reset``,
``GET /metrics`` (vLLM's queue and KV-cache gauges), ``GET /load`` (vLLM's ``{"server_load": N}``, requests in
the engine). A non-streaming answer to a request sent with ``endpoint-load-metrics-format: text`` carries vLLM's
ORCA load report (``endpoint-load-metrics: TEXT named_metrics.num_requests_waiting=..., ...``), read when it
is sent. A client disconnect (the ASGI ``http.disconnect`` message, or a failed send) aborts the request in the
engine at once; a ``finally`` releases it on every other way out (error, cancellation)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Literal

import anyio
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from llmguard_tools.sim.engine import EngineRequest, Rejected, RequestTooLarge, Sequence
from llmguard_tools.sim.faults import FaultPlan, retry_after_headers
from llmguard_tools.sim.prefix_cache import CacheCounters
from llmguard_tools.sim.protocol import BadRequest, CompletionRequest, Kind, parse_request
from llmguard_tools.sim.provider_limit import ProviderLimit
from llmguard_tools.sim.replica import Replica
from llmguard_tools.sim.wire import error_body
from llmguard_tools.sim.wire_messages import anthropic_error_body
from llmguard_tools.sim.wires import StreamWire, wire_for

__all__ = ["InjectedConnectionReset", "build_app"]

HTML_500 = (
    b"<html>\r\n<head><title>500 Internal Server Error</title></head>\r\n<body>\r\n"
    b"<center><h1>500 Internal Server Error</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)

Outcome = Literal["done", "reset", "gone", "cut"]
"""done: answered in full; reset: connection reset on purpose; gone: the client left; cut: the body was ended
early on purpose (an error event or a truncation after some tokens)."""
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
VLLM_BUSY = (
    "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance."
)
"""vLLM 0.32's queue-overflow message (``--max-num-queued-reqs``)."""


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


async def _send_error(
    send: Send, status: int, message: str, type_: str, headers: list[tuple[str, str]], kind: Kind = "chat"
) -> None:
    body = anthropic_error_body(message, type_) if kind == "messages" else error_body(message, type_, type_)
    await _send_bytes(send, status, body, "application/json", headers)


async def _send_stream_error(
    send: Send, replica: Replica, wire: StreamWire, message: str, type_: str, code: int
) -> None:
    """A whole 200 stream that is only an error event (plus the protocol's tail after one)."""
    headers = [*_SSE_HEADERS, (b"x-sim-replica", str(replica.index).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": wire.error_event(message, type_, code), "more_body": False})


class _Completions:
    """The ASGI endpoint of one generation route (``kind``: see `llmguard_tools.sim.protocol.Kind`)."""

    def __init__(self, replica: Replica, kind: Kind, provider: ProviderLimit | None = None) -> None:
        self.replica = replica
        self.kind: Kind = kind
        self.provider = provider
        """The cluster's provider rate limit (`llmguard_tools.sim.provider_limit`), if it has one."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        replica = self.replica
        replica.counters.received += 1
        try:
            config = replica.engine.config
            block = config.cache_block_tokens if config.prefix_cache_tokens else 0
            parsed = parse_request(await Request(scope, receive).body(), self.kind, replica.model, block_tokens=block)
        except ClientDisconnect:
            return
        except BadRequest as exc:
            replica.counters.bad_requests += 1
            await _send_error(send, 400, str(exc), "invalid_request_error", [], self.kind)
            return
        if replica.rate_limited_now():
            replica.counters.rate_limited += 1
            seconds = replica.faults.rate_limited_retry_after_s
            headers = retry_after_headers("seconds", seconds, time.time())
            await _send_error(send, 429, "Rate limit reached; retry later", "rate_limit_exceeded", headers, self.kind)
            return
        plan = replica.draw_faults()
        wire = wire_for(parsed)
        if plan.error_first and parsed.stream:
            replica.counters.error_first += 1
            await _send_stream_error(send, replica, wire, "injected engine error", "InternalServerError", 500)
            return
        if plan.html_500:
            replica.counters.html_500 += 1
            await _send_bytes(send, 500, HTML_500, "text/html", [])
            return
        if plan.blackhole:
            replica.counters.blackholed += 1
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        charge, limit_headers = parsed.prompt_tokens + (parsed.max_tokens or 0), list[tuple[str, str]]()
        if self.provider is not None:
            admitted, limit_headers = self.provider.admit(charge)
            if not admitted:
                message = "Rate limit reached for requests or tokens per min; retry after the Retry-After"
                await _send_error(send, 429, message, "rate_limit_exceeded", limit_headers, self.kind)
                return
        seq = await self._submit(parsed, wire, send)
        try:
            if seq is not None:
                orca = not parsed.stream and _wants_orca(scope)
                await self._serve(seq, parsed, plan, wire, receive, send, limit_headers, orca=orca)
        finally:
            if seq is not None:
                replica.abort(seq, by_disconnect=False)  # a no-op unless something unexpected escaped _serve
            if self.provider is not None:  # charged prompt + max_tokens: refund what was not used
                self.provider.refund(charge - (parsed.prompt_tokens + seq.generated if seq is not None else 0))

    async def _submit(self, parsed: CompletionRequest, wire: StreamWire, send: Send) -> Sequence | None:
        replica = self.replica
        model_len = replica.engine.config.model_len
        max_tokens = parsed.max_tokens if parsed.max_tokens is not None else max(1, model_len - parsed.prompt_tokens)
        request = EngineRequest(
            parsed.prompt_tokens, max_tokens, max_tokens if parsed.ignore_eos else None, parsed.block_hashes
        )
        try:
            return replica.submit(request)
        except Rejected as rejected:
            if replica.faults.overload_signal == "in_stream":
                if parsed.stream:
                    replica.counters.overload_in_stream += 1
                    await _send_stream_error(send, replica, wire, VLLM_BUSY, "Service Unavailable", 503)
                else:
                    error = {"message": VLLM_BUSY, "type": "Service Unavailable", "param": None, "code": 503}
                    await _send_bytes(send, 503, json.dumps({"error": error}).encode(), "application/json", [])
                return None
            headers = retry_after_headers(replica.faults.retry_after, rejected.retry_after_s, time.time())
            message = f"Server overloaded ({rejected.reason} admission); retry later"
            await _send_error(send, 429, message, "rate_limit_exceeded", headers, self.kind)
        except RequestTooLarge as exc:
            replica.counters.bad_requests += 1
            await _send_error(send, 400, str(exc), "invalid_request_error", [], self.kind)
        return None

    async def _serve(
        self,
        seq: Sequence,
        parsed: CompletionRequest,
        plan: FaultPlan,
        wire: StreamWire,
        receive: Receive,
        send: Send,
        extra: list[tuple[str, str]],
        *,
        orca: bool = False,
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
                    outcome = await self._stream(seq, parsed, plan, wire, send, extra)
                else:
                    outcome = await self._respond(seq, parsed, plan, wire, send, extra, orca=orca)
                tg.cancel_scope.cancel()
        finally:
            replica.abort(seq, by_disconnect=disconnected or outcome == "gone")
        if outcome == "reset":
            raise InjectedConnectionReset(f"injected connection reset on replica {replica.index}")

    def _fault_at(self, seq: Sequence) -> int:
        return min(self.replica.faults.fault_after_tokens, seq.output_tokens)

    async def _stream(
        self,
        seq: Sequence,
        parsed: CompletionRequest,
        plan: FaultPlan,
        wire: StreamWire,
        send: Send,
        extra: list[tuple[str, str]],
    ) -> Outcome:
        headers = [*_SSE_HEADERS, (b"x-sim-replica", str(self.replica.index).encode())]
        headers += [(k.encode(), v.encode()) for k, v in extra]
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            opening = wire.opening()
            if opening:
                await send({"type": "http.response.body", "body": opening, "more_body": True})
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
                    if sent == fault_at and (plan.error_mid or plan.truncate):
                        return await self._cut(seq, plan, wire, chunks, send)
                if chunks:
                    await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": True})
                if seq.done:
                    break
            if seq.finish_reason is None:
                return "gone"
            body = wire.closing(seq.finish_reason, parsed.prompt_tokens, seq.generated)
            await send({"type": "http.response.body", "body": body, "more_body": False})
        except OSError:
            return "gone"
        return "done"

    async def _respond(
        self,
        seq: Sequence,
        parsed: CompletionRequest,
        plan: FaultPlan,
        wire: StreamWire,
        send: Send,
        extra: list[tuple[str, str]],
        *,
        orca: bool = False,
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
                plain = [("x-sim-replica", str(self.replica.index)), *extra]
                if orca:
                    plain.append(orca_header(self.replica))
                await _send_bytes(send, 200, body, "application/json", plain)
                return "done"
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
        except OSError:
            return "gone"
        return self._reset(seq)

    async def _cut(self, seq: Sequence, plan: FaultPlan, wire: StreamWire, chunks: list[bytes], send: Send) -> Outcome:
        """End a stream early on purpose: an error event (``error_mid``) or plain EOF (``truncate``)."""
        counters = self.replica.counters
        if plan.error_mid:
            counters.error_mid += 1
            chunks.append(wire.error_event("injected engine error mid-stream", "InternalServerError", 500))
        else:
            counters.truncated += 1
        await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": False})
        self.replica.abort(seq, by_disconnect=False)
        return "cut"

    def _reset(self, seq: Sequence) -> Outcome:
        self.replica.counters.resets += 1
        self.replica.abort(seq, by_disconnect=False)
        return "reset"


def _wants_orca(scope: Scope) -> bool:
    """Whether the request asked for vLLM's ORCA load report in the text format."""
    return any(k == b"endpoint-load-metrics-format" and v.strip().lower() == b"text" for k, v in scope["headers"])


def orca_header(replica: Replica) -> tuple[str, str]:
    """vLLM's ``endpoint-load-metrics`` header (ORCA, text format), read when the answer is sent."""
    engine = replica.engine
    kv = engine.kv_used / engine.config.kv_tokens
    value = f"TEXT named_metrics.num_requests_waiting={float(engine.waiting)}, named_metrics.kv_cache_usage_perc={kv}"
    return ("endpoint-load-metrics", value)


def prefix_cache_metrics(counters: CacheCounters, label: str) -> str:
    """vLLM v1's prefix-cache counters (in tokens), with their HELP and TYPE lines as prometheus_client writes."""
    lines = []
    for name, value, what in (
        ("queries", counters.queries, "Prefix cache queries, in terms of number of queried tokens."),
        ("hits", counters.hits, "Prefix cache hits, in terms of number of cached tokens."),
    ):
        metric = f"vllm:prefix_cache_{name}"
        lines += [f"# HELP {metric}_total {what}", f"# TYPE {metric}_total counter"]
        lines.append(f"{metric}_total{label} {float(value)}")
    return "\n".join(lines) + "\n"


def build_app(replica: Replica, provider: ProviderLimit | None = None) -> Starlette:
    """The ASGI app serving ``replica`` (``provider``: the rate limit its cluster enforces, if any)."""

    async def models(request: Request) -> Response:
        entry = {"id": replica.model, "object": "model", "created": 0, "owned_by": "llmguard-sim"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def stats(request: Request) -> Response:
        return JSONResponse(replica.stats())

    async def metrics(request: Request) -> Response:
        """vLLM's queue and KV gauges, plus its prefix-cache counters when the cache is on (Prometheus text)."""
        replica.counters.metrics_requests += 1
        engine, label = replica.engine, f'{{model_name="{replica.model}"}}'
        text = (
            f"vllm:num_requests_waiting{label} {float(engine.waiting)}\n"
            f"vllm:num_requests_running{label} {float(engine.running)}\n"
            f"vllm:kv_cache_usage_perc{label} {engine.kv_used / engine.config.kv_tokens}\n"
        )
        if engine.prefix_cache.enabled:
            text += prefix_cache_metrics(engine.prefix_cache.counters, label)
        return Response(text, media_type="text/plain; version=0.0.4")

    async def load(request: Request) -> Response:
        """vLLM's ``/load`` (``--enable-server-load-tracking``): the requests the engine holds."""
        return JSONResponse({"server_load": replica.engine.running + replica.engine.waiting})

    async def reset(request: Request) -> Response:
        replica.reset_stats()
        return JSONResponse({"ok": True})

    routes = [
        Route("/v1/chat/completions", _Completions(replica, "chat", provider), methods=["POST"]),
        Route("/v1/completions", _Completions(replica, "text", provider), methods=["POST"]),
        Route("/v1/responses", _Completions(replica, "responses", provider), methods=["POST"]),
        Route("/v1/messages", _Completions(replica, "messages", provider), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/sim/stats", stats, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/load", load, methods=["GET"]),
        Route("/sim/reset", reset, methods=["POST"]),
    ]
    return Starlette(routes=routes)
