"""A raw HTTP/1.1 server on 127.0.0.1 that records each request's exact bytes.

Unlike `tests.loopback.LoopbackServer` (Starlette, which normalises headers), this one keeps
the request line, the header lines (case and order) and the body exactly as they crossed the
socket, so a test can compare what a guarded client sent with what plain httpx sends.
"""

from __future__ import annotations

import contextlib
import socket
import threading

SSE_BODY = (
    b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    b'data: {"id":"c1","model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
    b"data: [DONE]\n\n"
)


def sse_response(body: bytes = SSE_BODY, status: str = "200 OK") -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: text/event-stream\r\ncontent-length: {len(body)}\r\n"
        "x-upstream: yes\r\n\r\n"
    )
    return head.encode() + body


class RecordingServer:
    """Answers every request with ``response`` and keeps ``requests``: the raw bytes of each."""

    def __init__(self, response: bytes | None = None) -> None:
        self.response = response if response is not None else sse_response()
        self.requests: list[bytes] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.05)  # so the accept loop notices the stop flag
        self._stop = threading.Event()
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> RecordingServer:
        self._accepting.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._accepting.join(timeout=5)
        self._sock.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            self._conns.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.split(b"\r\n")[1:]
                fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines)}
                if b"content-length" in fields:
                    need = int(fields[b"content-length"])
                    while len(buffer) < need:
                        buffer += conn.recv(65536)
                    body, buffer = buffer[:need], buffer[need:]
                elif fields.get(b"transfer-encoding", b"").lower() == b"chunked":
                    while b"\r\n0\r\n\r\n" not in buffer and not buffer.startswith(b"0\r\n\r\n"):
                        buffer += conn.recv(65536)
                    end = (
                        buffer.index(b"0\r\n\r\n") + 5
                        if buffer.startswith(b"0\r\n")
                        else buffer.index(b"\r\n0\r\n\r\n") + 7
                    )
                    body, buffer = buffer[:end], buffer[end:]
                else:
                    body = b""
                self.requests.append(head + b"\r\n\r\n" + body)
                conn.sendall(self.response)
        except OSError:
            return
