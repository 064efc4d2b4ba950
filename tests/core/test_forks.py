"""`in_forked_child`: a registered method (or a module's function) runs in each forked child while its object lives,
and not after; once, whether Python's at-fork hooks ran it or the child was forked from C without them (uWSGI's
workers), where `catch_up_with_fork` runs it at the first call's entry. Each scenario runs in a process of its own (a
fork inside a test worker would carry the worker's state)."""

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


ONCE_IN_EACH_CHILD = """
import ctypes, os, threading, time
from llmguard_client._core.forks import catch_up_with_fork, in_forked_child

ran = []


class Worker:
    def after_fork(self):
        time.sleep(0.05)  # the other threads' calls come meanwhile: they wait for it
        ran.append("method")


def after_fork():
    ran.append("function")


worker = Worker()
in_forked_child(worker.after_fork)
in_forked_child(after_fork)
c_fork = ctypes.PyDLL(None).fork  # fork(2) from C (as uWSGI forks its workers): Python's at-fork hooks do not run


def child(fork):
    reads, writes = os.pipe()
    pid = fork()
    if pid == 0:
        told = [f"at the fork {sorted(ran)}"]
        seen = []
        entries = [threading.Thread(target=lambda: (catch_up_with_fork(), seen.append(sorted(ran)))) for _ in range(4)]
        for entry in entries:
            entry.start()
        for entry in entries:
            entry.join()
        catch_up_with_fork()
        told.append(f"after the calls {sorted(ran)}, as each call saw: {all(s == sorted(ran) for s in seen)}")
        os.write(writes, "; ".join(told).encode())
        os._exit(0)
    os.close(writes)
    os.waitpid(pid, 0)
    told = os.read(reads, 4096).decode()
    os.close(reads)
    return told


print("os.fork:", child(os.fork))
print("fork from C:", child(c_fork))
print("in the parent:", sorted(ran))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_without_the_at_fork_hooks_runs_them_once_at_its_first_call() -> None:
    proc = run_script(ONCE_IN_EACH_CHILD)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "os.fork: at the fork ['function', 'method']; after the calls ['function', 'method'], as each call saw: True",
        "fork from C: at the fork []; after the calls ['function', 'method'], as each call saw: True",
        "in the parent: []",
    ], proc.stderr


IN_THE_CHILD_ONLY = """
import ctypes, gc, os, signal
from llmguard_client._core.forks import catch_up_with_fork, in_forked_child

ran = []


class Parents:
    def after_fork(self):
        ran.append(f"parent's (collecting: {gc.isenabled()})")
        catch_up_with_fork()  # reached from a callback (a finalizer would do so): returns, and runs nothing twice


class Childs:
    def after_fork(self):
        ran.append("child's")


parents = Parents()
in_forked_child(parents.after_fork)
c_fork = ctypes.PyDLL(None).fork  # fork(2) from C (as uWSGI forks its workers): Python's at-fork hooks do not run
reads, writes = os.pipe()
pid = c_fork()
if pid == 0:
    signal.alarm(30)
    childs = Childs()  # built in the child before its first call: its callback is for its own children
    in_forked_child(childs.after_fork)
    catch_up_with_fork()  # the first call
    os.write(writes, repr(ran).encode())
    os._exit(0)
os.close(writes)
_, status = os.waitpid(pid, 0)
print("child:", os.read(reads, 4096).decode(), "exit", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_an_object_built_in_a_child_forked_without_the_hooks_is_the_childs_and_callbacks_run_once() -> None:
    """The callbacks run once, with no garbage collection meanwhile and nothing reached from them catching up again
    (a finalizer did, and the child waited on itself); an object built in the child before its first call is not
    taken for the parent's (its Guard refused every call as forked)."""
    proc = run_script(IN_THE_CHILD_ONLY)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ['child: ["parent\'s (collecting: False)"] exit 0'], proc.stderr
