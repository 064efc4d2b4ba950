"""A request body given as an iterator is sent as it comes, on one attempt, and a file upload as its file is
read, by every kind of client.

Real openai SDK (async and sync, httpx2) and plain httpx (async and sync) through the guard to a raw loopback
server that reads the upload itself: the body's first bytes reach the server before the iterator is
exhausted, or the file read to its end (the guard buffers nothing). An iterator's call gets no hedge and no
retry (its record says why), and a failure keeps its type; a body in memory is still retried, for contrast; a
file upload is retried, its file read again, and never hedged.
"""

from __future__ import annotations

import functools
import io
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import anyio.to_thread
import httpx
import pytest

from llmguard_client import Guard, HedgePolicy, RetryPolicy, Tier, guard_failure
from llmguard_client.telemetry.record import PhaseRecord
from tests.edges.conftest import eventually, pools

openai = pytest.importorskip("openai")
httpx2 = pytest.importorskip("httpx2")
CLIENTS = ["openai async", "openai sync", "httpx async", "httpx sync"]
PATH = "/v1/chat/completions"  # a generation path: a body in memory would be hedged and retried on any 5xx
RetryMode = Literal["guard", "cooperative"]
Answer = Literal["status", "hang", "cut"]
WAIT = 5.0
"""The longest an iterator waits for the server to see its first chunk (only a buffering guard waits it out)."""


class UploadServer:
    """A raw HTTP/1.1 server on 127.0.0.1 that reads each upload itself: it notes the moment a request's first
    body bytes arrive (`first_bytes`), reads the body to its end and answers ``status`` (``hang``: never)."""

    def __init__(self, status: int = 200, hang: bool = False, plan: list[Answer] | None = None) -> None:
        self.status, self.hang = status, hang
        self.plan = plan if plan is not None else []
        """How to answer the next requests, one each (then as ``status`` and ``hang`` say)."""
        self.first_bytes = threading.Event()
        self.bodies: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._open: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self) -> None:
        self._listener.close()
        for conn in self._open:
            conn.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._open.append(conn)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536) or b"\0"
            head, rest = data.split(b"\r\n\r\n", 1)
            fields = dict(line.split(b": ", 1) for line in head.lower().split(b"\r\n")[1:])
            length = int(fields.get(b"content-length", b"-1"))
            while not rest and length:
                rest += conn.recv(65536)
            self.first_bytes.set()
            while not (len(rest) == length if length >= 0 else rest.endswith(b"0\r\n\r\n")):  # the body's end
                more = conn.recv(65536)
                if not more:
                    return
                rest += more
            self.bodies.append(rest if length >= 0 else _dechunk(rest))
            answer_as = self.plan.pop(0) if self.plan else "hang" if self.hang else "status"
            if answer_as == "cut":  # a 200 whose body ends early: the connection closes mid-body
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
                return
            if answer_as == "hang":
                while conn.recv(65536):  # until the client closes
                    pass
                return
            answer = json.dumps({"received": len(self.bodies[-1])}).encode()
            conn.sendall(
                b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                % (self.status, len(answer))
                + answer
            )


def _dechunk(raw: bytes) -> bytes:
    body = b""
    while True:
        size_line, raw = raw.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            return body
        body, raw = body + raw[:size], raw[size + 2 :]


def sync_chunks(server: UploadServer, seen: list[bool]) -> Iterator[bytes]:
    yield b"first,"
    seen.append(server.first_bytes.wait(WAIT))  # True: the first chunk reached the server before the next
    yield b"second"


async def async_chunks(server: UploadServer, seen: list[bool]) -> AsyncIterator[bytes]:
    yield b"first,"
    seen.append(await anyio.to_thread.run_sync(server.first_bytes.wait, WAIT))
    yield b"second"


def guard_over(servers: list[UploadServer], ttft: float = 10.0, mode: RetryMode = "guard") -> Guard:
    return Guard(
        [s.url for s in servers],
        tiers={"t": Tier(ttft=ttft, total=20.0)},
        hedge=HedgePolicy(warmup_delay=0.05, min_delay=0.05),
        retry=RetryPolicy(backoff_initial=0.01, backoff_max=0.02, mode=mode),
        instrumentation=None,
        transport_factory=pools,
    )


async def upload(guard: Guard, kind: str, server: UploadServer, seen: list[bool], body: bytes | None = None) -> Any:
    """POST the iterator (or ``body``) with client ``kind``; the SDKs with ``max_retries=0``."""
    headers = {"content-type": "application/octet-stream"}
    sync = kind.endswith(" sync")
    content: Any = body if body is not None else (sync_chunks if sync else async_chunks)(server, seen)
    options: Any = {"headers": headers}
    if kind == "openai async":
        client: Any = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="k", max_retries=0, http_client=guard.httpx2_client()
        )
        return await client.post("/chat/completions", content=content, cast_to=httpx2.Response, options=options)
    if kind == "openai sync":
        client = openai.OpenAI(
            base_url=server.url + "/v1", api_key="k", max_retries=0, http_client=guard.sync_httpx2_client()
        )
        return await anyio.to_thread.run_sync(
            lambda: client.post("/chat/completions", content=content, cast_to=httpx2.Response, options=options)
        )
    if kind == "httpx async":
        async with guard.http_client() as plain:
            return await plain.post(server.url + PATH, content=content, headers=headers)
    with guard.sync_http_client() as plain_sync:
        return await anyio.to_thread.run_sync(
            lambda: plain_sync.post(server.url + PATH, content=content, headers=headers)
        )


@pytest.mark.parametrize("kind", CLIENTS)
async def test_the_first_bytes_reach_the_server_before_the_iterator_ends(kind: str) -> None:
    servers = [UploadServer(), UploadServer()]
    seen: list[bool] = []
    try:
        async with guard_over(servers) as guard:
            with guard.capture() as calls:
                response = await upload(guard, kind, servers[0], seen)
    finally:
        for server in servers:
            server.close()
    assert response.status_code == 200 and json.loads(response.content) == {"received": len(b"first,second")}
    assert seen == [True]  # the server had the first chunk while the iterator still held the second
    assert servers[0].bodies == [b"first,second"] and servers[1].bodies == []
    record: PhaseRecord = calls[0]
    assert record.one_attempt == "streamed_body" and len(record.attempts) == 1


@pytest.mark.parametrize("kind", ["openai async", "httpx sync"])
async def test_a_server_error_is_neither_retried_nor_hedged_and_keeps_its_status(kind: str) -> None:
    servers = [UploadServer(status=500), UploadServer(status=500)]
    seen: list[bool] = []
    try:
        async with guard_over(servers) as guard:
            with guard.capture() as calls:
                if kind.startswith("openai"):
                    with pytest.raises(openai.InternalServerError) as caught:
                        await upload(guard, kind, servers[0], seen)
                    assert guard_failure(caught.value) == "upstream_status"
                else:
                    response = await upload(guard, kind, servers[0], seen)
                    assert response.status_code == 500
    finally:
        for server in servers:
            server.close()
    assert sum(len(s.bodies) for s in servers) == 1  # one attempt: no retry on the other replica
    assert calls[0].one_attempt == "streamed_body" and len(calls[0].attempts) == 1


@pytest.mark.parametrize("kind", ["openai sync", "httpx async"])
async def test_a_timeout_stays_a_timeout_after_one_attempt(kind: str) -> None:
    """Both replicas never answer: a body in memory would be hedged after 50 ms; this one is sent once."""
    servers = [UploadServer(hang=True), UploadServer(hang=True)]
    seen: list[bool] = []
    expected: type[BaseException] = openai.APITimeoutError if kind.startswith("openai") else httpx.TimeoutException
    try:
        async with guard_over(servers, ttft=0.5) as guard:
            with guard.capture() as calls, pytest.raises(expected) as caught:
                await upload(guard, kind, servers[0], seen)
    finally:
        for server in servers:
            server.close()
    assert guard_failure(caught.value) == "ttft_timeout"
    assert sum(len(s.bodies) for s in servers) == 1 and len(calls[0].attempts) == 1
    assert calls[0].one_attempt == "streamed_body" and not calls[0].hedged


async def test_the_cooperative_mode_does_not_let_the_sdk_resend_it() -> None:
    """The SDK would resend its exhausted iterator: the guard's answer is final (``x-should-retry: false``)."""
    servers = [UploadServer(status=500), UploadServer(status=500)]
    seen: list[bool] = []
    try:
        async with guard_over(servers, mode="cooperative") as guard:
            client = openai.AsyncOpenAI(
                base_url=servers[0].url + "/v1", api_key="k", max_retries=2, http_client=guard.httpx2_client()
            )
            with guard.capture() as calls, pytest.raises(openai.InternalServerError) as caught:
                await client.post("/chat/completions", content=async_chunks(servers[0], seen), cast_to=httpx2.Response)
    finally:
        for server in servers:
            server.close()
    assert caught.value.response.headers["x-should-retry"] == "false" and seen == [True]
    assert sum(len(s.bodies) for s in servers) == 1
    assert [(c.one_attempt, len(c.attempts)) for c in calls] == [("streamed_body", 1)]


async def test_a_body_in_memory_is_still_retried() -> None:
    servers = [UploadServer(status=500), UploadServer(status=500)]
    try:
        async with guard_over(servers) as guard:
            with guard.capture() as calls:
                response = await upload(guard, "httpx async", servers[0], [], body=b"first,second")
    finally:
        for server in servers:
            server.close()
    assert response.status_code == 500 and calls[0].one_attempt is None
    assert sum(len(s.bodies) for s in servers) == 3  # RetryPolicy's max_attempts


class SlowFile(io.BytesIO):
    """A file to upload whose reads past the first wait until ``first_bytes`` is set: a guard that read the whole
    upload before sending waits it out (and notes False in ``seen``)."""

    def __init__(self, data: bytes, first_bytes: threading.Event, seen: list[bool]) -> None:
        super().__init__(data)
        self._first_bytes, self._seen = first_bytes, seen

    def read(self, size: int | None = -1) -> bytes:
        if self.tell() and not self._seen:
            self._seen.append(self._first_bytes.wait(WAIT))
        return super().read(size)


FILE = b'{"custom_id": "1"}\n' * 20_000  # 380 kB: six of httpx's 64 KiB reads


@pytest.mark.parametrize("kind", CLIENTS)
async def test_a_file_upload_is_sent_as_its_file_is_read(kind: str) -> None:
    """``client.files.create(file=...)`` (the SDKs) or ``files=`` (httpx): the server has the upload's first
    bytes before the file is read to its end, and gets the whole file."""
    server = UploadServer()
    seen: list[bool] = []
    file = SlowFile(FILE, server.first_bytes, seen)
    try:
        async with guard_over([server]) as guard:
            with guard.capture() as calls:
                if kind.startswith("openai"):
                    sync = kind == "openai sync"
                    client: Any = (openai.OpenAI if sync else openai.AsyncOpenAI)(
                        base_url=server.url + "/v1",
                        api_key="k",
                        max_retries=0,
                        http_client=guard.sync_httpx2_client() if sync else guard.httpx2_client(),
                    )
                    create = functools.partial(client.files.create, file=("batch.jsonl", file), purpose="batch")
                    await (anyio.to_thread.run_sync(create) if sync else create())
                elif kind == "httpx async":
                    async with guard.http_client() as plain:
                        await plain.post(server.url + "/v1/files", files={"file": file}, data={"purpose": "batch"})
                else:
                    with guard.sync_http_client() as plain_sync:
                        await anyio.to_thread.run_sync(
                            lambda: plain_sync.post(server.url + "/v1/files", files={"file": file})
                        )
    except openai.APIResponseValidationError:
        pass  # the server's answer is no File object: what was sent is the point
    finally:
        server.close()
    assert seen == [True]
    assert len(server.bodies) == 1 and FILE in server.bodies[0]
    assert calls[0].one_attempt is None


RAW_CLIENTS = ["httpx async", "httpx sync", "httpx2 async", "httpx2 sync"]


@pytest.mark.parametrize("kind", RAW_CLIENTS)
async def test_a_file_upload_is_retried_reading_its_file_again_and_never_hedged(kind: str) -> None:
    """On a generation path both replicas answer 500: three attempts, each with the whole file, none a hedge."""
    servers = [UploadServer(status=500), UploadServer(status=500)]
    file = io.BytesIO(FILE)
    url, files = servers[0].url + PATH, {"file": ("batch.jsonl", file)}
    try:
        async with guard_over(servers) as guard:
            with guard.capture() as calls:
                if kind == "httpx async":
                    async with guard.http_client() as client:
                        status = (await client.post(url, files=files)).status_code
                elif kind == "httpx2 async":
                    async with guard.httpx2_client() as client2:
                        status = (await client2.post(url, files=files)).status_code
                else:
                    sync_client: Any = guard.sync_http_client() if kind == "httpx sync" else guard.sync_httpx2_client()
                    with sync_client:
                        status = (
                            await anyio.to_thread.run_sync(lambda: sync_client.post(url, files=files))
                        ).status_code
    finally:
        for server in servers:
            server.close()
    bodies = [body for server in servers for body in server.bodies]
    assert status == 500 and len(bodies) == 3 and all(FILE in body for body in bodies)
    assert len(set(bodies)) == 1  # the same upload each time (one boundary)
    assert len(calls[0].attempts) == 3 and not calls[0].hedged and calls[0].one_attempt is None


SDK_CLIENTS = ["openai async", "openai sync"]


def sdk_client(guard: Guard, kind: str, url: str, factory: str = "http_client_for") -> Any:
    """An openai client (default ``max_retries=2``) of ``kind`` over ``guard``, given ``guard.http_client_for`` (a
    final failure is raised as openai's own error, which it does not retry) or ``guard.httpx2_client`` (it retries
    whatever its HTTP client raises)."""
    sync = kind == "openai sync"
    sdk = openai.OpenAI if sync else openai.AsyncOpenAI
    if factory == "http_client_for":
        http: Any = guard.http_client_for(sdk)
    else:
        http = guard.sync_httpx2_client() if sync else guard.httpx2_client()
    client = sdk(base_url=url + "/v1", api_key="k", http_client=http)
    assert client.max_retries == 2
    return client


async def create_file(client: Any, data: bytes) -> Any:
    """``client.files.create`` with ``data`` as the file, from this task (a sync client's in a worker thread)."""
    create = functools.partial(client.files.create, file=("batch.jsonl", io.BytesIO(data)), purpose="batch")
    return await (create() if isinstance(client, openai.AsyncOpenAI) else anyio.to_thread.run_sync(create))


def received(server: UploadServer, at_least: int) -> int:
    """Uploads the server read to their end (waiting for at least ``at_least``: the guard may give up on one
    before the server's thread noted it)."""
    eventually(lambda: len(server.bodies) >= at_least)
    return len(server.bodies)


@pytest.mark.parametrize("mode", ["guard", "cooperative"])
@pytest.mark.parametrize("factory", ["http_client_for", "httpx2_client"])
@pytest.mark.parametrize("kind", SDK_CLIENTS)
async def test_an_upload_past_its_deadline_reaches_the_server_once(kind: str, factory: str, mode: RetryMode) -> None:
    """The tier's first-token deadline passes while the server holds the upload: the guard gives up, as on a JSON
    call, and the SDK's retries send nothing (through ``http_client_for`` openai is given its own error and sends
    none; through ``httpx2_client`` each fails at once), in either retry mode. Before: each of the SDK's two
    retries was a new call with a fresh deadline, the whole file uploaded three times."""
    server = UploadServer(hang=True)
    try:
        async with guard_over([server], ttft=0.5, mode=mode) as guard:
            client = sdk_client(guard, kind, server.url, factory)
            with guard.capture() as calls, pytest.raises(openai.APITimeoutError) as caught:
                await create_file(client, FILE)
    finally:
        server.close()
    cause = caught.value.__cause__
    assert guard_failure(caught.value) == "ttft_timeout" and cause is not None
    assert received(server, 1) == 1 and FILE in server.bodies[0]
    if factory == "http_client_for":
        assert getattr(cause, "final", False) and len(calls) == 1
    else:
        assert "retry 2 of a call the guard already gave up on" in str(cause)


@pytest.mark.parametrize("kind", SDK_CLIENTS)
async def test_an_upload_to_no_listener_is_tried_by_the_guard_alone(kind: str) -> None:
    """Nothing listens: the guard's three attempts fail to connect and the SDK sends no retry of its own (before:
    each SDK request was a call of three attempts, nine connection attempts in all)."""
    with socket.create_server(("127.0.0.1", 0)) as closed:
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    async with Guard(
        [url], retry=RetryPolicy(backoff_initial=0.01, backoff_max=0.02), instrumentation=None, transport_factory=pools
    ) as guard:
        client = sdk_client(guard, kind, url)
        with guard.capture() as calls, pytest.raises(openai.APIConnectionError) as caught:
            await create_file(client, FILE)
    assert guard_failure(caught.value) == "all_attempts_failed"
    assert [len(call.attempts) for call in calls] == [3]


@pytest.mark.parametrize("kind", SDK_CLIENTS)
async def test_another_upload_from_the_same_task_is_not_taken_for_a_retry(kind: str) -> None:
    """After an upload given up on, the next one from the same task is sent, and so is the SDK's retry of it when
    its answer breaks off: a first request forgets what an earlier upload of the same URL and size left, so that
    retry is not answered with the earlier upload's error."""
    server = UploadServer(plan=["hang", "cut", "status"])
    other = FILE.replace(b"1", b"2")  # another file of the same size
    try:
        async with guard_over([server], ttft=0.5) as guard:
            client = sdk_client(guard, kind, server.url, "httpx2_client")
            with pytest.raises(openai.APITimeoutError):
                await create_file(client, FILE)
            done = await create_file(client, other)
    finally:
        server.close()
    assert done is not None
    assert received(server, 3) == 3 and [other in body for body in server.bodies] == [False, True, True]
