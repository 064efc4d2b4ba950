"""A process that ends with sync calls of a Guard it never closed still in flight exits as it would with the plain
client: a non-daemon thread's call is served to its end, the calls of daemon threads stop with the process without a
word, and a stream the main thread left open holds nothing up. Before, the Guard's connections were closed under the
daemon threads' calls at exit, and each printed an ``Exception in thread`` traceback (``httpx.ReadError``).

The scenario runs in a process of its own: it is about that process's exit.
"""

from __future__ import annotations

from tests.scripts import run_script

SCRIPT = """
import threading
from llmguard_client import Guard
from tests.loopback import LoopbackServer, Script

server = LoopbackServer("a", default=Script(tokens=200, gap=0.05))
server.start()
url = server.url + "/v1/chat/completions"
STREAM = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
guard = Guard(replicas=[server.url], failure_mode="raise", instrumentation=None)
client = guard.sync_http_client()
started = threading.Semaphore(0)


def read(daemon):
    with client.stream("POST", url, json=STREAM) as response:
        for i, _ in enumerate(response.iter_raw()):
            if i == 0:
                started.release()
                if not daemon:
                    threading.main_thread().join()  # until the interpreter's exit has begun
                    break
    print("non-daemon thread: done", flush=True)


for daemon in (True, True, True, False):
    threading.Thread(target=read, args=(daemon,), daemon=daemon).start()
for _ in range(4):
    started.acquire()
held = client.send(client.build_request("POST", url, json=STREAM), stream=True)  # left open, partly read
chunks = held.iter_raw()
next(chunks)
print("main: end", flush=True)
"""


def test_sync_calls_in_flight_at_exit_end_with_the_process_quietly() -> None:
    proc = run_script(SCRIPT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["main: end", "non-daemon thread: done"], proc.stderr
    assert proc.stderr == ""
