"""The guard's random sources draw afresh in a forked child: workers forked from one parent (gunicorn ``--preload``)
must not retry in step. The scenario runs in a process of its own (a fork inside a test worker would carry the
worker's state)."""

from __future__ import annotations

import os

import pytest

from tests.scripts import run_script

SCRIPT = """
import os
from llmguard_client._layers.retry import Backoff

backoff = Backoff(1.0, 60.0)  # built before the fork, as a preloaded Guard's is


def draws():
    return repr([backoff(8) for _ in range(4)])


reads, writes = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(writes, draws().encode())
    os._exit(0)
os.waitpid(pid, 0)
child = os.read(reads, 4096).decode()
print("child waits as its parent:", child == draws())
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_draws_other_backoffs_than_its_parent() -> None:
    proc = run_script(SCRIPT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["child waits as its parent: False"], proc.stderr


JITTER = """
import ctypes, os
from llmguard_client._core.forks import catch_up_with_fork
from llmguard_client._core.randomness import jitter

c_fork = ctypes.PyDLL(None).fork  # fork(2) from C, as uWSGI forks its workers: no at-fork hooks run in the child


def draws():
    return repr([jitter(0.5, 1.0) for _ in range(4)])


for name, fork in (("os.fork", os.fork), ("fork from C", c_fork)):
    reads, writes = os.pipe()
    pid = fork()
    if pid == 0:
        catch_up_with_fork()  # as a call's entry does
        os.write(writes, draws().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(reads, 4096).decode()
    print(f"{name}: the child's jitter is its parent's:", child == draws())
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_with_or_without_the_at_fork_hooks_draws_a_jitter_of_its_own() -> None:
    proc = run_script(JITTER)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "os.fork: the child's jitter is its parent's: False",
        "fork from C: the child's jitter is its parent's: False",
    ], proc.stderr
