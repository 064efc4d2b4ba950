"""A real ``redis-server`` for the fleet tests, on a free loopback port, with the faults the tests need.

`RedisServer` runs one server process with no persistence and no config file: `stop` (SIGKILL, like a crash),
`pause`/`resume` (SIGSTOP/SIGCONT: a server that stops answering but keeps its connections), `start` again on the
same port (a restart, with an empty data set). The ``redis_server`` fixture shares one per test process and
flushes it before each test; ``redis_factory`` starts private ones for the tests that break them.

Where ``redis-server`` is not installed the fixtures skip, except under CI (``CI=true``), where they fail:
``.ci/run`` installs it, and a fleet test that silently skipped in CI would prove nothing.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PortTaken(RuntimeError):
    """A server exited as it started: a port chosen free was taken by another process meanwhile."""


def wait_until_serving(
    port: int, process: subprocess.Popen[bytes], deadline: float, *, tls_ca: Path | None = None
) -> None:
    """Wait until `process` serves on `port`: a plain port answers PING (PONG, or an error such as NOAUTH), a TLS
    port completes a handshake with the test CA. An accepted connection alone proves nothing: a connect loop on a
    free ephemeral port can connect the socket to itself, or reach another process that took the port meanwhile."""
    while True:
        if _redis_answers(port, tls_ca) and process.poll() is None:
            return
        if process.poll() is not None:  # it could not listen: another process took a port after it was chosen
            raise PortTaken(f"redis-server exited at start on port {port}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"redis-server did not start on port {port}")
        time.sleep(0.01)


def _redis_answers(port: int, tls_ca: Path | None) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
            if tls_ca is not None:
                with ssl.create_default_context(cafile=tls_ca).wrap_socket(conn, server_hostname="127.0.0.1"):
                    return True
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith((b"+PONG", b"-"))
    except OSError:  # refused, timed out, or a failed handshake (ssl.SSLError is an OSError)
        return False


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1 (see the module docstring for its faults)."""

    def __init__(self, password: str | None = None, unixsocket: str | None = None) -> None:
        self.port = _free_port()
        self.password = password
        self.unixsocket = unixsocket
        """A path the server also listens on (a Unix socket), if any."""
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server (again, after `stop`) and wait until it accepts connections."""
        assert REDIS_SERVER is not None
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        if self.unixsocket:
            args += ["--unixsocket", self.unixsocket]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until_serving(self.port, self.process, time.monotonic() + 10.0)

    def stop(self) -> None:
        """Kill the server at once (a crash: no goodbye to its clients)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a paused server must be able to die
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def pause(self) -> None:
        """SIGSTOP: connections stay open, nothing is answered."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def flush(self) -> None:
        """Empty every database (between tests sharing one server)."""
        auth = f"AUTH {self.password}\r\n".encode() if self.password else b""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as conn:
            conn.sendall(auth + b"FLUSHALL\r\n")
            expected = 2 if self.password else 1
            reply = b""
            while reply.count(b"\r\n") < expected:
                chunk = conn.recv(256)
                if not chunk:
                    break
                reply += chunk


def _require_redis() -> None:
    if REDIS_SERVER is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is not installed; .ci/run installs it (apt-get install -y redis-server)")
        pytest.skip("redis-server is not installed (apt-get install -y redis-server)")


@pytest.fixture(scope="session")
def _shared_redis() -> Iterator[RedisServer]:
    _require_redis()
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_server(_shared_redis: RedisServer) -> RedisServer:
    """This test process's ``redis-server``, emptied before the test."""
    _shared_redis.flush()
    return _shared_redis


@pytest.fixture
def redis_factory() -> Iterator[type[RedisServer]]:
    """Starts private servers (``redis_factory()`` then ``.start()``) that the test may kill or pause; all are
    stopped when the test ends."""
    _require_redis()
    started: list[RedisServer] = []

    class Private(RedisServer):
        def start(self) -> None:
            if self not in started:
                started.append(self)
            super().start()

    yield Private
    for server in started:
        server.stop()
