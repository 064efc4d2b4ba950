"""`in_forked_child`: a registered method runs in each forked child while its object lives, and not after. The
scenario runs in a process of its own (a fork inside a test worker would carry the worker's state)."""

from __future__ import annotations

import os

import pytest

from tests.scripts import run_script

SCRIPT = """
import gc, os
from llmguard_client._core.forks import in_forked_child


class Worker:
    def __init__(self, name):
        self.name = name

    def after_fork(self):
        os.write(writes, self.name.encode() + b" ")


kept, dropped = Worker("kept"), Worker("dropped")
in_forked_child(kept.after_fork)
in_forked_child(dropped.after_fork)
del dropped
gc.collect()
reads, writes = os.pipe()
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
os.close(writes)
print("in the child:", os.read(reads, 100).decode().split())
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_method_runs_in_a_forked_child_while_its_object_lives() -> None:
    proc = run_script(SCRIPT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["in the child: ['kept']"], proc.stderr
