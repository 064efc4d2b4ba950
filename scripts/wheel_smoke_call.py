"""Run inside a fresh venv that holds the llmguard-client wheel alone: one plain and one streamed call, and the
error of a client that needs an extra (``guard.httpx2_client()`` without httpx2).

``scripts/wheel_smoke.py`` copies this file out of the checkout and runs it with ``python -I``, so the only
llmguard_client it can import is the installed wheel. Standard library plus the wheel's own dependencies only:
the server is a stdlib ``http.server`` on 127.0.0.1 answering ``/v1/chat/completions`` as JSON or as SSE.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TOKENS = ["Hello", " from", " the", " loopback", " server."]
ABSENT = ("openai", "httpx2", "trio", "uvicorn", "starlette", "rich", "redis", "pytest", "llmguard_tools")
"""Installed only by an extra or a test venv: none may be here, or the wheel is not alone."""


class Handler(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint: the whole answer as JSON, or one SSE event per token."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        if body.get("stream"):
            self._stream()
        else:
            self._json()

    def _json(self) -> None:
        answer = {
            "id": "chatcmpl-smoke",
            "object": "chat.completion",
            "model": "smoke",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "".join(TOKENS)}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": len(TOKENS), "total_tokens": 3 + len(TOKENS)},
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        deltas: list[dict[str, Any]] = [{"role": "assistant"}, *({"content": t} for t in TOKENS)]
        for i, delta in enumerate(deltas):
            finish = "stop" if i == len(deltas) - 1 else None
            chunk = {
                "id": "chatcmpl-smoke",
                "object": "chat.completion.chunk",
                "model": "smoke",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def content_of_sse(lines: list[str]) -> str:
    """The content deltas of an SSE chat stream, joined."""
    text = []
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            choices = json.loads(line[len("data: ") :])["choices"]
            text.append(choices[0]["delta"].get("content") or "" if choices else "")
    return "".join(text)


async def calls(url: str) -> None:
    from llmguard_client import Guard, Tier

    async with Guard(replicas=[url], tiers={"interactive": Tier(ttft=10.0, total=30.0, stall=10.0)}) as guard:
        async with guard.http_client() as client:
            request = {"model": "smoke", "messages": [{"role": "user", "content": "Hi"}]}
            plain = await client.post(f"{url}/v1/chat/completions", json=request)
            assert plain.status_code == 200, plain.text
            assert plain.json()["choices"][0]["message"]["content"] == "".join(TOKENS), plain.text
            assert plain.extensions["llmguard"].status == "ok", plain.extensions["llmguard"]
            async with client.stream("POST", f"{url}/v1/chat/completions", json={**request, "stream": True}) as resp:
                assert resp.status_code == 200
                lines = [line async for line in resp.aiter_lines()]
            assert content_of_sse(lines) == "".join(TOKENS), lines
            record = resp.extensions["llmguard"]
            assert record.status == "ok" and record.ttft is not None, record
        assert guard.snapshot().idle, guard.snapshot()
        try:  # without the [httpx2] extra its clients say which extra brings it
            guard.httpx2_client()
        except ModuleNotFoundError as missing:
            assert "pip install 'llmguard-client[httpx2]'" in str(missing), missing
        else:
            raise AssertionError("guard.httpx2_client() without httpx2 installed raised nothing")


def main() -> None:
    import anyio

    import llmguard_client

    where = Path(llmguard_client.__file__).resolve()
    assert where.is_relative_to(Path(sys.prefix).resolve()), f"imported from {where}, not from the venv"
    present = [name for name in ABSENT if importlib.util.find_spec(name) is not None]
    assert not present, f"not a bare install: {present} importable"
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        anyio.run(calls, f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    versions = ", ".join(
        f"{name} {importlib.metadata.version(name)}"
        for name in ("llmguard-client", "httpx", "anyio", "sniffio", "tenacity", "opentelemetry-api")
        if _installed(name)
    )
    print(f"a plain and a streamed call ok on Python {sys.version.split()[0]} with {versions}")


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


if __name__ == "__main__":
    main()
