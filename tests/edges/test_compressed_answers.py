"""A server (or a gateway before it) that compresses its answers, streams included: the SDK gets through the
guard what it gets without it, and the guard still sees the first token and the usage."""

from __future__ import annotations

import asyncio
import json
import threading
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from llmguard_client import Guard, PhaseRecord, Tier
from tests.edges.conftest import pools

openai = pytest.importorskip("openai")
brotli = pytest.importorskip("brotli")

TOKENS = ["Hello", " from", " a", " compressed", " stream"]
ANSWER: dict[str, Any] = {
    "id": "c",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(TOKENS)}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
}


def events() -> list[bytes]:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    out = [
        b"data: " + json.dumps({**chunk, "choices": [{"index": 0, "delta": {"content": t}}]}).encode() + b"\n\n"
        for t in TOKENS
    ]
    return [*out, b"data: [DONE]\n\n"]


class Squeeze:
    """A compressor flushed after each event, as a gateway compressing a stream must (else nothing arrives)."""

    def __init__(self, encoding: str) -> None:
        self.brotli = brotli.Compressor() if encoding == "br" else None
        self.zlib = zlib.compressobj(wbits=31 if encoding == "gzip" else 15)

    def part(self, data: bytes) -> bytes:
        if self.brotli is not None:
            return bytes(self.brotli.process(data)) + bytes(self.brotli.flush())
        return self.zlib.compress(data) + self.zlib.flush(zlib.Z_SYNC_FLUSH)

    def end(self) -> bytes:
        return bytes(self.brotli.finish()) if self.brotli is not None else self.zlib.flush()


class CompressingServer:
    """An OpenAI-style chat server on 127.0.0.1 whose every answer is compressed with ``encoding``."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self.loop = asyncio.new_event_loop()
        self.requests = 0
        self.writers: set[asyncio.StreamWriter] = set()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        started.wait(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        started.set()
        self.loop.run_forever()
        self.loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                body = json.loads(await reader.readexactly(length))
                self.requests += 1
                await self._answer(writer, bool(body.get("stream")))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            self.writers.discard(writer)

    async def _answer(self, writer: asyncio.StreamWriter, stream: bool) -> None:
        squeeze, encoding = Squeeze(self.encoding), self.encoding.encode()
        if not stream:
            data = squeeze.part(json.dumps(ANSWER).encode()) + squeeze.end()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: %s\r\n"
                b"content-length: %d\r\n\r\n%s" % (encoding, len(data), data)
            )
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: %s\r\n"
            b"transfer-encoding: chunked\r\n\r\n" % encoding
        )
        for event in events():
            data = squeeze.part(event)
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()
        data = squeeze.end()
        writer.write((b"%x\r\n%s\r\n" % (len(data), data) if data else b"") + b"0\r\n\r\n")
        await writer.drain()

    async def _close(self) -> None:
        self.server.close()
        for writer in list(self.writers):
            writer.close()
        await self.server.wait_closed()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(params=["gzip", "deflate", "br"])
def server(request: pytest.FixtureRequest) -> Iterator[CompressingServer]:
    running = CompressingServer(request.param)
    yield running
    running.stop()


MESSAGES: Any = [{"role": "user", "content": "hi"}]


async def ask(client: Any, stream: bool) -> str:
    if not stream:
        done = await client.chat.completions.create(model="m", messages=MESSAGES)
        return str(done.choices[0].message.content)
    events = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    return "".join([chunk.choices[0].delta.content or "" async for chunk in events])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_compressed_answer_reaches_the_sdk_as_without_a_guard(server: CompressingServer, stream: bool) -> None:
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0) as plain:
        expected = await ask(plain, stream)
    records: list[PhaseRecord] = []
    async with Guard([server.url], tiers={"t": Tier(5, 10)}, transport_factory=pools, on_record=records.append) as g:
        guarded = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="k", max_retries=0, http_client=g.http_client_for(openai.AsyncOpenAI)
        )
        assert await ask(guarded, stream) == expected == "".join(TOKENS)  # before: APIConnectionError
    [record] = records
    assert (record.status, len(record.attempts), record.first_token is not None) == ("ok", 1, True)
    if stream:
        assert record.chunks == len(TOKENS)
    else:
        assert (record.prompt_tokens, record.completion_tokens) == (3, 5)
    assert server.requests == 2


def test_a_sync_client_through_the_guard_gets_a_compressed_stream_whole(server: CompressingServer) -> None:
    with Guard([server.url], tiers={"t": Tier(5, 10)}, transport_factory=pools, instrumentation=None) as g:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", http_client=g.sync_http_client())
        events = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        assert "".join(chunk.choices[0].delta.content or "" for chunk in events) == "".join(TOKENS)


async def test_a_control_calls_compressed_stream_is_measured_as_a_guarded_ones(server: CompressingServer) -> None:
    records: list[PhaseRecord] = []
    async with Guard(
        [server.url], tiers={"t": Tier(5, 10)}, transport_factory=pools, on_record=records.append, rollout=0.0
    ) as g:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", http_client=g.http_client())
        assert await ask(client, stream=True) == "".join(TOKENS)
    [record] = records
    assert (record.cohort, record.status, record.chunks, record.first_token is not None) == (
        "control",
        "ok",
        len(TOKENS),
        True,
    )
