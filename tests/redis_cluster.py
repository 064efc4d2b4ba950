"""A real 3-master Redis Cluster for the fleet tests, on free loopback ports, and a TLS redis-server.

`RedisCluster` starts three ``redis-server --cluster-enabled yes`` processes in a temporary directory, joins
them with ``redis-cli --cluster create ... --cluster-replicas 0`` and waits until every node reports
``cluster_state:ok``. Where ``redis-server`` has TLS, every node also listens on a TLS port and the cluster bus
runs over TLS (``rediss+cluster://``), so one cluster serves both. The ``redis_cluster`` fixture shares one per
test process (an xdist worker) and flushes it before each test; it is always stopped at the end of the session.
Startup takes about 2 s, most of it Redis's own: a cluster master waits 2 s after starting before it reports
``cluster_state:ok`` (``CLUSTER_WRITABLE_DELAY`` in Redis's cluster code).

`TLSRedisServer` runs one ``redis-server --tls-port`` (no plain port) with a throwaway CA and server certificate
made with the ``openssl`` command.

Skips (or fails under ``CI=true``) like `tests.redis_server` where ``redis-server``/``redis-cli`` are missing, and
where the installed build has no TLS support (the TLS fixture only).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_server import REDIS_SERVER, PortTaken, _free_port, _require_redis, wait_until_serving

REDIS_CLI = shutil.which("redis-cli")
MASTERS = 3


def _command(port: int, *words: str, timeout: float = 5.0) -> bytes:
    """One command over RESP on a plain socket (no client library: the fixture must not depend on what it tests);
    its reply, read until whole (a simple or bulk reply: enough for FLUSHALL and CLUSTER INFO)."""
    payload = f"*{len(words)}\r\n".encode() + b"".join(b"$%d\r\n%s\r\n" % (len(w), w.encode()) for w in words)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(payload)
        reply = b""
        while not _complete(reply):
            chunk = conn.recv(65536)
            if not chunk:
                break
            reply += chunk
        return reply


def _complete(reply: bytes) -> bool:
    line, sep, rest = reply.partition(b"\r\n")
    if not sep:
        return False
    return not line.startswith(b"$") or int(line[1:]) < 0 or len(rest) >= int(line[1:]) + 2


class RedisCluster:
    """Three masters on 127.0.0.1 (no replicas), every slot assigned (see the module docstring)."""

    def __init__(self, tls: TLSFiles | None = None) -> None:
        self.tls = tls
        """With certificates: every node also listens for TLS (`tls_ports`) and the cluster bus runs over TLS."""
        self.tls_ports = [_free_port() for _ in range(MASTERS)] if tls is not None else []
        self.ports = [_free_port() for _ in range(MASTERS)]
        self.bus_ports = [_free_port() for _ in range(MASTERS)]
        """Cluster bus ports, chosen rather than the default port + 10000 (which may be taken or past 65535)."""
        self.processes: list[subprocess.Popen[bytes]] = []
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.startup: float | None = None
        """Seconds from the first process start to ``cluster_state:ok`` on every node."""

    @property
    def url(self) -> str:
        """The fleet URL naming the first node (the client discovers the others)."""
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    @property
    def tls_url(self) -> str:
        """The ``rediss+cluster://`` URL naming the first node's TLS port, with the test CA."""
        assert self.tls is not None
        return f"rediss+cluster://127.0.0.1:{self.tls_ports[0]}?ssl_ca_certs={self.tls.ca}"

    def start(self) -> None:
        """Start the nodes and create the cluster; with fresh ports again (up to 3 times) when a port chosen free
        was taken before its node could listen (other test processes pick ports too)."""
        for tries in range(3):
            try:
                self._start_once()
                return
            except PortTaken:
                if tries == 2:
                    raise
                self.ports = [_free_port() for _ in self.ports]
                self.bus_ports = [_free_port() for _ in self.bus_ports]
                self.tls_ports = [_free_port() for _ in self.tls_ports]

    def _start_once(self) -> None:
        assert REDIS_SERVER is not None and REDIS_CLI is not None
        began = time.monotonic()
        self._dir = tempfile.TemporaryDirectory(prefix="llmguard-cluster-")
        try:
            for port, bus in zip(self.ports, self.bus_ports, strict=True):
                args = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
                args += ["--cluster-enabled", "yes", "--cluster-port", str(bus)]
                args += ["--cluster-config-file", f"nodes-{port}.conf"]
                args += ["--cluster-node-timeout", "5000", "--dir", self._dir.name]
                if self.tls is not None:
                    args += ["--tls-port", str(self.tls_ports[len(self.processes)]), "--tls-cluster", "yes"]
                    args += self.tls.server_args()
                self.processes.append(
                    subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self._dir.name)
                )
            deadline = time.monotonic() + 10.0
            for port, process in zip(self.ports, self.processes, strict=True):
                wait_until_serving(port, process, deadline)
            nodes = [f"127.0.0.1:{port}" for port in self.ports]
            created = subprocess.run(
                [REDIS_CLI, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True,
                timeout=30,
                check=False,
            )
            if created.returncode != 0:
                if any(process.poll() is not None for process in self.processes):  # its cluster bus port was taken
                    raise PortTaken(f"a cluster node exited at start: {created.stderr!r}")
                raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout!r} {created.stderr!r}")
            while not all(b"cluster_state:ok" in _command(port, "CLUSTER", "INFO") for port in self.ports):
                if time.monotonic() > deadline + 20.0:
                    raise RuntimeError("the cluster never reported cluster_state:ok")
                time.sleep(0.01)
        except BaseException:
            self.stop()
            raise
        self.startup = time.monotonic() - began

    def flush(self) -> None:
        for port in self.ports:
            _command(port, "FLUSHALL")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
        for process in self.processes:
            process.wait(timeout=10)
        self.processes = []
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def _require_cluster_tools() -> None:
    _require_redis()
    if REDIS_CLI is None:
        pytest.skip("redis-cli is not installed (it comes with redis-server: apt-get install -y redis-server)")


@pytest.fixture(scope="session")
def _tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles | None:
    """One CA and server certificate per test process (None: this redis-server has no TLS, or no openssl)."""
    if REDIS_SERVER is None or OPENSSL is None or not tls_supported():
        return None
    return TLSFiles(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def _shared_cluster(_tls_files: TLSFiles | None) -> Iterator[RedisCluster]:
    _require_cluster_tools()
    cluster = RedisCluster(_tls_files)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster(_shared_cluster: RedisCluster) -> RedisCluster:
    """This test process's 3-master Redis Cluster, emptied before the test: plain ports (`RedisCluster.url`) and,
    where the build has TLS, TLS ports too (`RedisCluster.tls_url`; the cluster bus then runs over TLS)."""
    _shared_cluster.flush()
    return _shared_cluster


# --- TLS -------------------------------------------------------------------------------------------

OPENSSL = shutil.which("openssl")


def tls_supported() -> bool:
    """Whether the installed ``redis-server`` was built with TLS: given ``--tls-port`` without certificates, one
    built with it says "No tls-cert-file configured!", one built without it refuses TLS altogether."""
    if REDIS_SERVER is None:
        return False
    probe = subprocess.run(
        [REDIS_SERVER, "--port", "0", "--tls-port", str(_free_port())], capture_output=True, timeout=10, check=False
    )
    return b"No tls-cert-file configured" in probe.stdout + probe.stderr


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost signed by it (``openssl`` CLI):
    the (ca, cert, key) paths."""
    assert OPENSSL is not None
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    cert, key, csr = directory / "server.pem", directory / "server.key", directory / "server.csr"
    ext = directory / "server.ext"
    # What Python 3.13's strict verification (VERIFY_X509_STRICT) asks of a chain: a CA whose key usage allows
    # signing certificates, and a leaf that names its issuer's key.
    ext.write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    ca_extensions = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    steps = [
        [
            "req",
            "-x509",
            *ec,
            *ca_extensions,
            "-keyout",
            ca_key,
            "-out",
            ca,
            "-days",
            "1",
            "-subj",
            "/CN=llmguard test CA",
        ],
        ["req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=localhost"],
        [
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            "1",
            "-extfile",
            ext,
        ],
    ]
    for step in steps:
        subprocess.run([OPENSSL, *map(str, step)], capture_output=True, timeout=30, check=True, cwd=directory)
    return ca, cert, key


class TLSFiles:
    """A throwaway CA and a server certificate signed by it (`make_certificates`)."""

    def __init__(self, directory: Path) -> None:
        self.ca, self.cert, self.key = make_certificates(directory)

    def server_args(self) -> list[str]:
        """``redis-server`` options serving these (clients need no certificate of their own)."""
        return [
            *("--tls-cert-file", str(self.cert), "--tls-key-file", str(self.key)),
            *("--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "no"),
        ]


class TLSRedisServer:
    """One ``redis-server`` answering only TLS on 127.0.0.1 (no plain port), with a password."""

    def __init__(self, files: TLSFiles, password: str) -> None:
        self.port = _free_port()
        self.password = password
        self.files = files
        self.ca = self.files.ca
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, password: str | None = None, **query: str) -> str:
        """``rediss://`` with ``ssl_ca_certs`` naming the test CA, plus ``query``."""
        params = "&".join(f"{k}={v}" for k, v in {"ssl_ca_certs": str(self.ca), **query}.items())
        return f"rediss://:{password or self.password}@127.0.0.1:{self.port}/0?{params}"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        args = [REDIS_SERVER, "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1"]
        args += self.files.server_args()
        args += ["--requirepass", self.password, "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until_serving(self.port, self.process, time.monotonic() + 10.0, tls_ca=self.ca)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


@pytest.fixture
def redis_tls(_tls_files: TLSFiles | None) -> Iterator[TLSRedisServer]:
    """A private TLS-only ``redis-server`` with password ``tls-secret`` (skips where the build has no TLS)."""
    _require_redis()
    if _tls_files is None:
        pytest.skip("this redis-server build has no TLS support (or openssl is missing)")
    server = TLSRedisServer(_tls_files, "tls-secret")
    try:
        server.start()
        yield server
    finally:
        server.stop()
