"""Worker processes forked from a parent that built its Guard before the fork, unused (gunicorn ``--preload``
with a module-level Guard, a prefork pool): each worker's Guard works, and each must hear the others through the
fleet. A store marks what it publishes with its own id and ignores what carries it (its own events), so workers
that kept the parent's id ignored each other's cool-downs. The scenario runs in a process of its own (a fork
inside a test worker would carry the worker's state)."""

from __future__ import annotations

import os

import pytest

from tests.redis_server import RedisServer
from tests.scripts import run_script

SCRIPT = """
import json, os, signal, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from llmguard_client import Guard

fleet = sys.argv[1]
limited = {"on": False}
OK = json.dumps({"id": "c", "object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.server.limits and limited["on"]:  # a hosted API's limit spent for every caller: cools at once
            self.send_response(429)
            self.send_header("retry-after", "30")
            self.send_header("x-ratelimit-remaining-requests", "0")
            body = b'{"error": {"message": "slow down"}}'
        else:
            self.send_response(200)
            body = OK
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


servers = []
for limits in (True, False):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.limits = limits
    threading.Thread(target=server.serve_forever, daemon=True).start()  # in the parent: the child's calls reach it
    servers.append(server)
a, b = (f"http://127.0.0.1:{s.server_address[1]}" for s in servers)
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
guard = Guard(replicas=[a, b], fleet=fleet, name="preloaded", instrumentation=None, hedge=None)


def connected(client):
    assert client.post(a + "/v1/chat/completions", json=BODY).status_code == 200
    deadline = time.monotonic() + 30
    while not guard.snapshot().fleet.connected and time.monotonic() < deadline:
        time.sleep(0.01)


def cooling_for():
    return next(r.cooling_for for r in guard.snapshot().replicas if r.name == a)


child_reads, parent_writes = os.pipe()
parent_reads, child_writes = os.pipe()
pid = os.fork()
if pid == 0:
    signal.alarm(60)
    client = guard.sync_http_client()
    connected(client)
    os.write(child_writes, b"r")
    os.read(child_reads, 1)  # the parent is connected and the limit is on
    while cooling_for() == 0:  # its calls reach the limited replica within a few
        client.post(a + "/v1/chat/completions", json=BODY)
    os.write(child_writes, b"c")
    os.read(child_reads, 1)
    os._exit(0)
client = guard.sync_http_client()
connected(client)
os.read(parent_reads, 1)
limited["on"] = True
os.write(parent_writes, b"g")
os.read(parent_reads, 1)  # the child has cooled the replica, and published it
deadline = time.monotonic() + 10
while cooling_for() == 0 and time.monotonic() < deadline:
    time.sleep(0.01)
print("parent hears the child's cool-down:", cooling_for() > 0, flush=True)
os.write(parent_writes, b"x")
os.waitpid(pid, 0)
client.close()
guard.close()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_workers_forked_from_a_guard_built_before_the_fork_hear_each_others_cool_downs(
    redis_server: RedisServer,
) -> None:
    proc = run_script(SCRIPT, redis_server.url, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["parent hears the child's cool-down: True"], proc.stderr


FORKED_FROM_C = """
import ctypes, os, sys
from llmguard_client import Guard
from llmguard_client._core.forks import catch_up_with_fork

guard = Guard(replicas=["http://127.0.0.1:9"], fleet=sys.argv[1], name="preloaded", instrumentation=None)
store = guard._fleet.store
c_fork = ctypes.PyDLL(None).fork  # fork(2) from C, as uWSGI forks its workers: Python's at-fork hooks do not run


def worker_origin():
    reads, writes = os.pipe()
    pid = c_fork()
    if pid == 0:
        catch_up_with_fork()  # as its first call's entry does
        os.write(writes, store.origin.encode())
        os._exit(0)
    os.close(writes)
    os.waitpid(pid, 0)
    origin = os.read(reads, 100).decode()
    os.close(reads)
    return origin


print("ids of the parent and two workers:", len({store.origin, worker_origin(), worker_origin()}))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_workers_forked_from_c_without_the_at_fork_hooks_take_ids_of_their_own() -> None:
    proc = run_script(FORKED_FROM_C, "redis://127.0.0.1:9/0", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["ids of the parent and two workers: 3"], proc.stderr
