"""A process forked after its Guard's fleet store connected on the Guard's own loop thread (a sync call made
before the fork: gunicorn ``--preload`` with a call at import, a prefork pool): the child's async calls start
a store of their own, on the child's loop, with connections of its own. Before, the child's store stayed off
for good (a cool-down it met never reached Redis) while its snapshot said ``connected``. The scenario runs in a
process of its own (a fork inside a test worker would carry the worker's state)."""

from __future__ import annotations

import os

import pytest

from tests.loopback import LoopbackServer
from tests.redis_server import RedisServer
from tests.scripts import run_script

SCRIPT = """
import asyncio, os, sys, time
from llmguard_client import Guard

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
    async def child():
        async with guard.http_client() as http:
            status = (await http.post(replica + "/v1/chat/completions", json=BODY)).status_code
            deadline = time.monotonic() + 20
            while guard.snapshot().fleet.resyncs < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            fleet = guard.snapshot().fleet
            await guard.aclose()
            return status, fleet.connected, fleet.resyncs

    print("child:", *asyncio.run(child()), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
client.close()
guard.close()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_after_the_store_connected_connects_a_store_of_its_own(
    servers: list[LoopbackServer], redis_server: RedisServer
) -> None:
    proc = run_script(SCRIPT, servers[0].url, redis_server.url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["parent: 200 1", "child: 200 True 2"], proc.stderr
