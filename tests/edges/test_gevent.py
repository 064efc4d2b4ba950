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
SCRIPT = """
import sys
from llmguard_client import Guard  # imported before the patching, as gunicorn --preload does
from gevent import monkey

monkey.patch_all()
import gevent

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
replica = sys.argv[1]
guard = Guard(replicas=[replica], failure_mode="raise", instrumentation=None)
client = guard.sync_http_client()


def call(stream):
    with client.stream("POST", replica + "/v1/chat/completions", json={**BODY, "stream": stream}) as response:
        return response.status_code, b"chatcmpl" in response.read()


calls = [gevent.spawn(call, i % 2 == 0) for i in range(6)]
gevent.joinall(calls, timeout=60)
print([c.value if c.successful() else repr(c.exception) for c in calls], flush=True)
client.close()
guard.close()
print("closed", flush=True)
"""


def test_sync_calls_are_served_from_greenlets_when_gevent_patched_after_the_import(
    servers: list[LoopbackServer],
) -> None:
    proc = run_script(SCRIPT, servers[0].url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str([(200, True)] * 6), "closed"], proc.stderr
