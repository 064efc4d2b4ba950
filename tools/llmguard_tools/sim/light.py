"""A light OpenAI-compatible replica with per-request faults, for the soak and burst benchmarks.

The simulated cluster's lightest member: no engine model (`llmguard_tools.sim.server` has one), a fixed
answer, and the simulator's SSE framing (`llmguard_tools.sim.wire`).

Run it as its own process, so the client being measured shares no CPU time or memory with it::

    python -m llmguard_tools.sim.light [--port 0] [--seed 0] [--fault-rate 0.05] [--first-token-delay 0.01]

It prints ``PORT <n>`` on one stdout line once it accepts connections, and runs until SIGTERM/SIGINT.
A hand-written HTTP/1.1 server on asyncio streams (keep-alive, chunked SSE), not a framework, for two
reasons: it costs little CPU per request, and it can do what an ASGI app cannot, such as reset a TCP
connection (RST) in the middle of a stream.

Each ``POST /v1/chat/completions`` draws its fault from a seeded `random.Random`: with probability
``--fault-rate`` one of

- ``reset``: streamed, the connection is reset (RST) after ``FAULT_AFTER`` content tokens;
  non-streamed, it is reset before any byte of the answer;
- ``http500``: a 500 with a JSON error body (the connection stays usable);
- ``stall``: streamed, ``--stall`` seconds of silence after ``FAULT_AFTER`` tokens (past the client
  tier's stall limit); non-streamed, ``--stall`` seconds before the answer;
- ``error_event`` (streamed only): an ``data: {"error": ...}`` event after ``FAULT_AFTER`` tokens in
  a 200 stream, which then ends without ``[DONE]``.

``GET /stats`` answers the counters as JSON (requests, faults injected by kind, open connections,
streams the client left before their end).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import socket
import struct
import time
from collections import Counter
from typing import Any

from llmguard_tools.sim.wire import DONE, sse

FAULT_AFTER = 2
"""Content tokens sent before a mid-stream fault (reset, stall, error event)."""
STREAM_FAULTS = ("reset", "http500", "stall", "error_event")
PLAIN_FAULTS = ("reset", "http500", "stall")


class Replica:
    """The server's state: options, the fault stream, counters."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.fault_rate: float = args.fault_rate
        self.first_token_delay: float = args.first_token_delay
        self.tokens: int = args.tokens
        self.gap: float = args.gap
        self.stall: float = args.stall
        self.rng = random.Random(args.seed)
        self.stats: Counter[str] = Counter()
        self.open_connections = 0

    def draw(self, stream: bool) -> str | None:
        if self.fault_rate <= 0 or self.rng.random() >= self.fault_rate:
            return None
        return self.rng.choice(STREAM_FAULTS if stream else PLAIN_FAULTS)

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open_connections += 1
        self.stats["connections"] += 1
        try:
            while await self._one_request(reader, writer):
                pass
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass
        except asyncio.CancelledError:  # the server is stopping (a stall may still be sleeping)
            pass
        finally:
            self.open_connections -= 1
            if not writer.transport.is_closing():
                writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection must end."""
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                key, value = line.split(":", 1)
                headers[key.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        keep_alive = headers.get("connection", "").lower() != "close"
        if method == "GET" and path == "/stats":
            stats = {**self.stats, "open_connections": self.open_connections}
            await _send_json(writer, 200, stats, keep_alive)
            return keep_alive
        if method != "POST" or not path.endswith("/chat/completions"):
            await _send_json(writer, 404, {"error": {"message": f"no route {method} {path}"}}, keep_alive)
            return keep_alive
        request: Any = json.loads(body) if body else {}
        stream = bool(request.get("stream"))
        fault = self.draw(stream)
        self.stats["requests"] += 1
        self.stats["streamed" if stream else "plain"] += 1
        if fault is not None:
            self.stats[f"fault_{fault}"] += 1
        if fault == "http500":
            await _send_json(writer, 500, {"error": {"message": "injected 500", "type": "server_error"}}, keep_alive)
            return keep_alive
        if not stream:
            if fault == "reset":
                _reset(writer)
                return False
            await asyncio.sleep(self.stall if fault == "stall" else self.first_token_delay)
            await _send_json(writer, 200, _completion(self.tokens), keep_alive)
            return keep_alive
        return await self._stream(writer, fault, keep_alive)

    async def _stream(self, writer: asyncio.StreamWriter, fault: str | None, keep_alive: bool) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
            + (b"" if keep_alive else b"connection: close\r\n")
            + b"\r\n"
        )
        base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": int(time.time()), "model": "m"}
        try:
            _chunk(writer, sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
            await writer.drain()
            await asyncio.sleep(self.first_token_delay)
            for i in range(self.tokens):
                if i == FAULT_AFTER and fault is not None:
                    if fault == "reset":
                        _reset(writer)
                        return False
                    if fault == "error_event":
                        error = {"error": {"message": "injected error event", "type": "server_error"}}
                        _chunk(writer, sse(error))
                        writer.write(b"0\r\n\r\n")
                        await writer.drain()
                        return keep_alive
                    await asyncio.sleep(self.stall)
                elif i and self.gap:
                    await asyncio.sleep(self.gap)
                delta = {"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}
                _chunk(writer, sse({**base, "choices": [delta]}))
                await writer.drain()
            _chunk(writer, sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
            _chunk(writer, DONE)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (ConnectionError, OSError):
            self.stats["client_gone_mid_stream"] += 1
            return False
        if writer.transport.is_closing():
            self.stats["client_gone_mid_stream"] += 1
            return False
        return keep_alive


def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


async def _send_json(writer: asyncio.StreamWriter, status: int, obj: object, keep_alive: bool) -> None:
    data = json.dumps(obj).encode()
    reason = {200: "OK", 404: "Not Found", 500: "Internal Server Error"}.get(status, "Status")
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n".encode()
        + (b"" if keep_alive else b"connection: close\r\n")
        + b"\r\n"
        + data
    )
    await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Abort the connection with a TCP RST (SO_LINGER 0), as a crashed or restarted server would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _completion(tokens: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": " t" * tokens}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": tokens, "total_tokens": 7 + tokens},
    }


async def _main(args: argparse.Namespace) -> None:
    replica = Replica(args)
    server = await asyncio.start_server(replica.serve_connection, "127.0.0.1", args.port, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"PORT {port}", flush=True)
    async with server:
        await stop.wait()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m llmguard_tools.sim.light", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0, help="0: any free port (default)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the per-request fault draws")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="probability of a fault per request")
    parser.add_argument("--first-token-delay", type=float, default=0.01, help="seconds before the first token")
    parser.add_argument("--tokens", type=int, default=6, help="content tokens per answer")
    parser.add_argument("--gap", type=float, default=0.002, help="seconds between streamed tokens")
    parser.add_argument("--stall", type=float, default=1.0, help="seconds a stall fault lasts")
    args = parser.parse_args(argv)
    if not 0.0 <= args.fault_rate <= 1.0:
        parser.error("--fault-rate must be from 0 to 1")
    if args.tokens <= FAULT_AFTER:
        parser.error(f"--tokens must be more than {FAULT_AFTER} (mid-stream faults happen after {FAULT_AFTER})")
    return args


if __name__ == "__main__":
    asyncio.run(_main(parse_args()))
