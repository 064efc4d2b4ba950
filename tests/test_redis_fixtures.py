"""The Redis fixtures wait for a server that answers as Redis, not for any connection to its port."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_server import PortTaken, wait_until_serving


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A port where another program accepts and echoes what it reads: what a connect loop meets when its socket
    connects to itself (a free ephemeral port) or when another process took the port."""
    listener = socket.create_server(("127.0.0.1", 0))
    stopped = threading.Event()

    def serve() -> None:
        listener.settimeout(0.05)
        while not stopped.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(1.0)
                with contextlib.suppress(OSError):
                    conn.sendall(conn.recv(64))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stopped.set()
        thread.join(5)
        listener.close()


@pytest.fixture
def waiting_process() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield process
    finally:
        process.kill()
        process.wait(10)


def test_an_echo_on_the_port_is_not_a_redis_server(echo_port: int, waiting_process: subprocess.Popen[bytes]) -> None:
    with pytest.raises(RuntimeError, match="did not start"):
        wait_until_serving(echo_port, waiting_process, time.monotonic() + 0.5)


def test_a_plain_listener_is_not_a_tls_redis_server(
    echo_port: int, waiting_process: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    from tests.redis_cluster import OPENSSL, make_certificates

    if OPENSSL is None:
        pytest.skip("openssl is not installed")
    ca, _, _ = make_certificates(tmp_path)
    with pytest.raises(RuntimeError, match="did not start"):
        wait_until_serving(echo_port, waiting_process, time.monotonic() + 0.5, tls_ca=ca)


def test_a_server_that_exits_at_start_is_a_taken_port(echo_port: int) -> None:
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait(10)
    with pytest.raises(PortTaken):
        wait_until_serving(echo_port, exited, time.monotonic() + 10.0)
