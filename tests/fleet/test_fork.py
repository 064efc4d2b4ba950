"""A process forked after its Guard's fleet store connected on the Guard's own loop thread (a sync call made
before the fork: gunicorn ``--preload`` with a call at import, a prefork pool): that loop, the Guard's connections
and the store's stayed in the parent, so the child's calls are refused at once (build the Guard after the fork),
and closing the Guard there closes none of the parent's connections: the parent's store stays connected, without
a resync, and its calls go on. The scenario runs in a process of its own (a fork inside a test worker would carry
the worker's state)."""

from __future__ import annotations

import os

import pytest

from tests.loopback import LoopbackServer
from tests.redis_server import RedisServer
from tests.scripts import run_script

SCRIPT = """
import asyncio, os, signal, sys, time
from llmguard_client import Guard, GuardClosed

replica, fleet = sys.argv[1], sys.argv[2]
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
guard = Guard(replicas=[replica], fleet=fleet, name="forked", failure_mode="raise", instrumentation=None)
client = guard.sync_http_client()
status = client.post(replica + "/v1/chat/completions", json=BODY).status_code
deadline = time.monotonic() + 20
while not guard.snapshot().fleet.connected and time.monotonic() < deadline:
    time.sleep(0.01)
print("parent:", status, guard.snapshot().fleet.resyncs, flush=True)
pid = os.fork()
if pid == 0:
    signal.alarm(60)

    async def child():
        async with guard.http_client() as http:
            try:
                await http.post(replica + "/v1/chat/completions", json=BODY)
                return "sent"
            except GuardClosed as exc:
                return "refused, forked" if "forked" in str(exc) else f"refused: {exc}"
            finally:
                await guard.aclose()

    print("child:", asyncio.run(child()), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
status = client.post(replica + "/v1/chat/completions", json=BODY).status_code
print("parent after:", status, guard.snapshot().fleet.connected, guard.snapshot().fleet.resyncs, flush=True)
client.close()
guard.close()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_after_the_store_connected_is_refused_and_closes_nothing_of_the_parents(
    servers: list[LoopbackServer], redis_server: RedisServer
) -> None:
    proc = run_script(SCRIPT, servers[0].url, redis_server.url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["parent: 200 1", "child: refused, forked", "parent after: 200 True 1"], (
        proc.stderr
    )
