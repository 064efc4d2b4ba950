"""A process that gevent monkey-patches after importing the package (what gunicorn ``--preload`` with gevent
workers does: the app is imported first, the worker patches later): the Guard's sync calls are served from
greenlets as in a process patched first. Before, each was refused as if the Guard were closed (a thread
identity captured at import time took every greenlet for the Guard's own loop thread), and closing it hung
10 s. The scenario runs in a process of its own: the patching must not reach the test worker."""

from __future__ import annotations

import pytest

from tests.loopback import LoopbackServer
from tests.scripts import run_script

pytest.importorskip("gevent")
CALLS = """
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
replica = sys.argv[1]
guard = Guard(replicas=[replica], failure_mode="raise", instrumentation=None)
client = guard.sync_http_client()


def call(stream):
    with client.stream("POST", replica + "/v1/chat/completions", json={**BODY, "stream": stream}) as response:
        return response.status_code, b"chatcmpl" in response.read()
"""
"""Guarded sync calls, streamed or not, each giving its status and whether its body is a completion."""
SCRIPT = (
    """
import sys
from llmguard_client import Guard  # imported before the patching, as gunicorn --preload does
from gevent import monkey

monkey.patch_all()
import gevent
"""
    + CALLS
    + """

calls = [gevent.spawn(call, i % 2 == 0) for i in range(6)]
gevent.joinall(calls, timeout=60)
print([c.value if c.successful() else repr(c.exception) for c in calls], flush=True)
client.close()
guard.close()
print("closed", flush=True)
"""
)


def test_sync_calls_are_served_from_greenlets_when_gevent_patched_after_the_import(
    servers: list[LoopbackServer],
) -> None:
    proc = run_script(SCRIPT, servers[0].url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str([(200, True)] * 6), "closed"], proc.stderr


SEEN_SCRIPT = (
    """
import sys
from gevent import monkey

monkey.patch_all()
import asyncio

import gevent

from llmguard_client import Guard
"""
    + CALLS
    + """

async def own():
    await asyncio.sleep(0.01)
    return "ran"


def looks():
    try:
        asyncio.get_running_loop()
        running = "a loop runs"
    except RuntimeError:
        running = "no loop runs"
    return running, asyncio.run(own())


first = [gevent.spawn(call, i % 2 == 0) for i in range(6)]  # the Guard's loop starts
gevent.joinall(first, timeout=60)
calls = [gevent.spawn(call, i % 2 == 0) for i in range(6)]
seen = gevent.spawn(looks)  # while those calls are in flight on the Guard's loop
gevent.joinall([*calls, seen], timeout=60)
print([c.value if c.successful() else repr(c.exception) for c in first + calls], flush=True)
print(seen.value if seen.successful() else repr(seen.exception), flush=True)
client.close()
guard.close()
"""
)


def test_greenlets_beside_the_guards_loop_see_no_running_loop_and_may_run_their_own(
    servers: list[LoopbackServer],
) -> None:
    """The Guard's loop thread is a greenlet of the process's one OS thread, and asyncio keeps one running loop (and
    one set of async generator hooks) per OS thread: every other greenlet saw the Guard's loop as its own, so code
    that asks whether it runs in async code refused to (Django's ORM: ``SynchronousOnlyOperation`` in every view,
    the plain client's too), and ``asyncio.run`` (asgiref's ``async_to_sync``) could not start."""
    proc = run_script(SEEN_SCRIPT, servers[0].url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str([(200, True)] * 12), str(("no loop runs", "ran"))], proc.stderr


FORK_SCRIPT = (
    """
import os
import sys
from gevent import monkey

monkey.patch_all()
from llmguard_client import Guard
"""
    + CALLS
    + """
print(call(False), flush=True)  # the Guard's loop runs here when the process forks
pid = os.fork()
if pid == 0:
    guard = Guard(replicas=[replica], failure_mode="raise", instrumentation=None)
    client = guard.sync_http_client()
    print("child", call(True), flush=True)
    client.close()
    guard.close()
    os._exit(0)
os.waitpid(pid, 0)
client.close()
guard.close()
print("parent closed", flush=True)
"""
)


def test_a_guard_built_in_a_child_forked_while_the_parents_loop_ran_serves_its_calls(
    servers: list[LoopbackServer],
) -> None:
    """gunicorn ``--preload`` with gevent workers, a call made at import: each worker builds its own Guard, as the
    one it inherited tells it to. The parent's loop, copied into the child as running, was taken for one running in
    the child's thread: the child's Guard could not start, and every call of it failed."""
    proc = run_script(FORK_SCRIPT, servers[0].url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str((200, True)), "child " + str((200, True)), "parent closed"], proc.stderr


EXIT_SCRIPT = """
import atexit, sys
from gevent import monkey

monkey.patch_all()
from llmguard_client import Guard

replica = sys.argv[1]
guard = Guard(replicas=[replica], failure_mode="raise", instrumentation=None)
client = guard.sync_http_client()


def last_call():  # registered after the import: it runs before the guard's own exit handler
    body = {"model": "m", "messages": [{"role": "user", "content": "bye"}]}
    print("exit handler:", client.post(replica + "/v1/chat/completions", json=body).status_code, flush=True)


atexit.register(last_call)
"""


def test_a_first_sync_call_from_an_exit_handler_under_gevent_leaves_the_exit_quiet(
    servers: list[LoopbackServer],
) -> None:
    """The Guard, collected as the interpreter finalized, looked up the current thread to stop its loop, which
    gevent refuses then: ``Exception ignored in ... RuntimeError: greenlet is being finalized`` on stderr."""
    proc = run_script(EXIT_SCRIPT, servers[0].url, timeout=60)
    assert (proc.returncode, proc.stdout.splitlines(), proc.stderr) == (0, ["exit handler: 200"], "")
