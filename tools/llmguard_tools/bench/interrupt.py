"""Ctrl-C for the long-running commands (``demo``, ``bench``): one line, no child left, out within a bound.

A terminal sends SIGINT to the whole process group: the command, its simulated cluster, its worker processes
and a ``--fleet auto`` redis-server get it at once. The children may stop first; what matters is that the
command stops too, and does not go on against servers that are gone. `run_interruptibly` takes SIGINT over
from the event loops the command runs (asyncio's runner cancels one task on SIGINT, and a task that absorbs
that cancellation lets the run go on): the first SIGINT raises `KeyboardInterrupt` where the command is, so it
unwinds through its own clean-up (clusters terminated, temporary files removed); if that has not finished
within ``grace`` seconds, or on a second SIGINT, every child is stopped and the process exits at once.
Either way the caller's one line is printed once, every child process left is stopped and reaped, and the
status is 130. What the unwinding would report on the way (a server task logging the `KeyboardInterrupt` it
was stopped by, a coroutine left unawaited) is silenced, unless ``LLMGUARD_DEBUG`` is set.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from types import FrameType
from typing import IO

EXIT_STATUS = 130
"""128 + SIGINT, what a shell reports for a command stopped by Ctrl-C."""
GRACE = 1.0
"""Seconds the command's own clean-up may take before the process exits regardless."""


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children first), from ``ps``; [] where ``ps`` is not available."""
    try:
        out = subprocess.run(["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(fields[0]))
    found: list[int] = []
    frontier = [pid]
    while frontier:
        below = [child for parent in frontier for child in children.get(parent, ())]
        found += below
        frontier = below
    return found


def stop_children(timeout: float = 0.5) -> None:
    """SIGTERM to every process below this one, SIGKILL to those still there after ``timeout``; reap ours."""
    pids = descendants(os.getpid())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _reap() and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    while _reap():
        time.sleep(0.01)


def _reap() -> bool:
    """Collect every child that has exited; True while some child of this process is still running."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False  # no child at all (or another waiter took the last one)
        if pid == 0:
            return True


class _Interrupt:
    """The state of one `run_interruptibly`: whether SIGINT came, and the one line said once."""

    def __init__(self, say: Callable[[str, IO[str]], None], grace: float) -> None:
        self._say = say
        self._stderr = sys.stderr
        self._grace = grace
        self._lock = threading.Lock()
        self._said = False
        self.interrupted = False
        self._timer: threading.Timer | None = None
        self._sink: IO[str] | None = None
        self._quiet_warnings: warnings.catch_warnings[None] | None = None

    def handler(self, signum: int, frame: FrameType | None) -> None:
        if self.interrupted:
            self.exit_now()
        self.interrupted = True
        if not os.environ.get("LLMGUARD_DEBUG"):
            logging.disable(logging.CRITICAL)
            self._quiet_warnings = warnings.catch_warnings()
            self._quiet_warnings.__enter__()
            warnings.simplefilter("ignore")  # e.g. a coroutine the interrupt left unawaited, at interpreter exit
            self._sink = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - closed by finish()
        self._timer = threading.Timer(self._grace, self.exit_now)
        self._timer.daemon = True
        self._timer.start()
        raise KeyboardInterrupt

    def say_once(self) -> None:
        with self._lock:
            if self._said:
                return
            self._said = True
        self._say("interrupted", self._stderr)

    def finish(self) -> None:
        """After the command unwound: no exit from the timer any more, every child stopped, stderr back."""
        if self._timer is not None:
            self._timer.cancel()
        self.say_once()
        stop_children()
        sys.stderr = self._stderr
        logging.disable(logging.NOTSET)
        if self._quiet_warnings is not None:
            self._quiet_warnings.__exit__(None, None, None)
        if self._sink is not None:
            self._sink.close()

    def exit_now(self) -> None:
        self.say_once()
        stop_children()
        for stream in (sys.stdout, self._stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(EXIT_STATUS)


def _forget_interrupt_in_exec() -> None:
    """Clear CPython's mark of a KeyboardInterrupt that ended a string ``exec`` (dataclasses and namedtuple build
    their methods so, e.g. during an import the Ctrl-C landed in): under ``python -m`` the interpreter would
    otherwise kill itself with SIGINT at exit, whatever status the command returns. Every string ``exec``
    resets the mark when it starts."""
    exec("pass", {})


def run_interruptibly(command: Callable[[], int], say: Callable[[str, IO[str]], None], grace: float = GRACE) -> int:
    """``command()``, or `EXIT_STATUS` after ``say("interrupted", stderr)`` once when SIGINT stops it.

    Off the main thread (where no signal handler can be set) it is ``command()`` alone.
    """
    if threading.current_thread() is not threading.main_thread():
        return command()
    state = _Interrupt(say, grace)
    previous = signal.signal(signal.SIGINT, state.handler)
    try:
        try:
            status = command()
        except BaseException:
            if not state.interrupted:
                raise
            # KeyboardInterrupt, or whatever the unwinding raised instead (a worker that died of the same SIGINT)
        if state.interrupted:  # also when something on the way absorbed the KeyboardInterrupt
            state.finish()  # with the handler still ours: a second SIGINT now exits at once
            _forget_interrupt_in_exec()
            return EXIT_STATUS
        return status
    finally:
        signal.signal(signal.SIGINT, previous)
