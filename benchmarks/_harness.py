"""Shared by the benchmarks: replica processes, and what the client process holds and spends."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx

ROOT = Path(__file__).resolve().parents[1]


class ReplicaProcess:
    """One `llmguard_tools.sim.light` in its own process on 127.0.0.1."""

    def __init__(self, *options: str) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "llmguard_tools.sim.light", *options],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()
        if not line.startswith("PORT "):
            self._process.kill()
            raise RuntimeError(f"replica server did not start (first line {line!r})")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()


@contextmanager
def replica_processes(options: Sequence[Sequence[str]]) -> Iterator[list[str]]:
    """Start one replica process per option list; yield their base URLs; stop them all."""
    started: list[ReplicaProcess] = []
    try:
        for opts in options:
            started.append(ReplicaProcess(*opts))
        yield [p.url for p in started]
    finally:
        for process in started:
            process.stop()


def parse_limits(text: str) -> httpx.Limits:
    try:
        total, keepalive = (None if part.strip() == "None" else int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a pool setting is 'max_connections,max_keepalive_connections' (ints or None), got {text!r}"
        ) from None
    return httpx.Limits(max_connections=total, max_keepalive_connections=keepalive)


def label(limits: httpx.Limits) -> str:
    return f"({limits.max_connections}, {limits.max_keepalive_connections})"


def dead_url() -> str:
    """A 127.0.0.1 URL nothing listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def open_sockets() -> int:
    """Sockets this process holds open (``/proc/self/fd`` entries that are sockets)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:  # the fd of the listdir itself, already closed
            pass
    return count


def rss_mb() -> float:
    """Resident set size of this process, in MiB (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def cpu_seconds() -> float:
    """User + system CPU time of this process (all threads)."""
    t = os.times()
    return t.user + t.system


def context_switches() -> int:
    """Context switches so far, voluntary (a thread waiting) and not (preempted), of all this process's threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def asyncio_tasks() -> int:
    return len(asyncio.all_tasks())


def settle() -> None:
    """Collect garbage twice (finalizers may free more) before a measurement."""
    gc.collect()
    gc.collect()


class LoopLag:
    """How late a 10 ms sleep wakes, sampled continuously while `run` is running."""

    def __init__(self, period: float = 0.01) -> None:
        self.period = period
        self.samples: list[float] = []

    async def run(self) -> None:
        while True:
            start = anyio.current_time()
            await anyio.sleep(self.period)
            self.samples.append(max(0.0, anyio.current_time() - start - self.period))

    def take(self) -> list[float]:
        out, self.samples = self.samples, []
        return out
