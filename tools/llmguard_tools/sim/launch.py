"""`spawn_cluster`: run ``python -m llmguard_tools.sim`` as a subprocess for the duration of a ``with``."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["ClusterStartError", "spawn_cluster"]


class ClusterStartError(RuntimeError):
    """The cluster subprocess exited or did not become ready in time; the message carries its stderr."""


@contextlib.contextmanager
def spawn_cluster(
    scenario: str, *, replicas: int | None = None, seed: int = 0, timeout: float = 20.0
) -> Iterator[list[str]]:
    """Start a simulated cluster in a subprocess, yield its base URLs, terminate it (and wait) on exit.

    On a `KeyboardInterrupt` the cluster is killed instead, so a Ctrl-C does not wait for it to drain.
    """
    with tempfile.TemporaryDirectory(prefix="llmguard-sim-") as tmp:
        ready = Path(tmp) / "ready.json"
        cmd = [sys.executable, "-m", "llmguard_tools.sim", "--scenario", scenario, "--seed", str(seed)]
        cmd += ["--ready-file", str(ready)]
        if replicas is not None:
            cmd += ["--replicas", str(replicas)]
        with open(Path(tmp) / "stderr.log", "w+b") as stderr:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
            try:
                yield _wait_ready(proc, ready, stderr, timeout)
            except KeyboardInterrupt:  # Ctrl-C: stopped at once, not drained
                proc.kill()
                proc.wait()
                raise
            finally:
                _terminate(proc)


def _wait_ready(proc: subprocess.Popen[bytes], ready: Path, stderr: IO[bytes], timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None:
            raise ClusterStartError(f"sim cluster exited with status {proc.returncode}: {_tail(stderr)}")
        if time.monotonic() > deadline:
            raise ClusterStartError(f"sim cluster not ready after {timeout:.0f}s: {_tail(stderr)}")
        time.sleep(0.02)
    urls = json.loads(ready.read_text())["urls"]
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise ClusterStartError(f"bad ready line: {ready.read_text()!r}")
    return urls


def _tail(stderr: IO[bytes], limit: int = 2000) -> str:
    stderr.seek(0)
    data = stderr.read()
    return data[-limit:].decode(errors="replace").strip() or "(no stderr)"


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
