"""A process forked after a Guard's sync calls started its event-loop thread (gunicorn ``--preload``, a prefork
worker pool, ``multiprocessing`` with fork): the child's sync calls fail at once, saying why and what to do,
instead of waiting for ever on a thread that stayed in the parent; the child exits normally (closing the Guard or
not), and the parent's Guard goes on serving.

The scenario runs in a process of its own (a fork inside a test worker would carry the worker's state).
"""

from __future__ import annotations

import os

import pytest

from tests.scripts import run_script

SCRIPT = """
import os, signal, sys
from llmguard_client import Guard, GuardClosed
from tests.loopback import loopback_cluster

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
with loopback_cluster(1) as cluster:
    url = cluster.servers[0].url + "/v1/chat/completions"
    guard = Guard(replicas=[cluster.servers[0].url], failure_mode="raise", instrumentation=None)
    client = guard.sync_http_client()
    print("parent before:", client.post(url, json=BODY).status_code, flush=True)
    for closes in (False, True):
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)  # a child left waiting is killed, and the test says so
            try:
                client.post(url, json=BODY)
                print("child: sent", flush=True)
            except GuardClosed as exc:
                print("child:", type(exc).__name__, "forked" in str(exc), "post_fork" in str(exc), flush=True)
            if closes:
                guard.close()
            sys.exit(3)  # a normal exit: atexit handlers and finalizers run
        _, status = os.waitpid(pid, 0)
        print(f"child exit (close={closes}):", os.waitstatus_to_exitcode(status), flush=True)
    print("parent after:", client.post(url, json=BODY).status_code, flush=True)
    client.close()
    guard.close()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_after_sync_calls_is_refused_at_once_and_exits() -> None:
    proc = run_script(SCRIPT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "parent before: 200",
        "child: GuardClosed True True",
        "child exit (close=False): 3",
        "child: GuardClosed True True",
        "child exit (close=True): 3",
        "parent after: 200",
    ]
