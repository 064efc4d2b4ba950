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


CALL_AT_EXIT = """
import atexit, sys

WARM = sys.argv[1] == "warm"


def last_call():  # registered before llmguard_client is imported: it runs after the guard's own exit handler
    answer = client.post(url, json={"model": "m", "messages": [{"role": "user", "content": "bye"}]})
    print("exit handler:", answer.status_code, flush=True)


atexit.register(last_call)

from llmguard_client import Guard
from tests.loopback import LoopbackServer

server = LoopbackServer("a")
server.start()
url = server.url + "/v1/chat/completions"
guard = Guard(replicas=[server.url], failure_mode="raise", instrumentation=None)
client = guard.sync_http_client()
if WARM:
    print("main:", client.post(url, json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}).status_code)
print("main: end", flush=True)
"""


def test_a_sync_call_from_an_exit_handler_registered_before_the_import_is_served_and_the_process_exits() -> None:
    """The guard's exit handler ran before such a handler (atexit runs the last registered first): after a sync call
    it had refused the handler's call (`GuardClosed`); before any, the handler's call started the Guard's loop
    thread, and the Guard, collected as the interpreter finalized, waited for that thread, frozen by then: the
    process never exited. The plain client serves the call and exits."""
    cold = run_script(CALL_AT_EXIT, "cold", timeout=30)
    assert (cold.returncode, cold.stdout.splitlines(), cold.stderr) == (0, ["main: end", "exit handler: 200"], "")
    warm = run_script(CALL_AT_EXIT, "warm", timeout=30)
    assert (warm.returncode, warm.stdout.splitlines(), warm.stderr) == (
        0,
        ["main: 200", "main: end", "exit handler: 200"],
        "",
    )


GUARD_IN_EXIT_HANDLER = """
import atexit, threading


def with_a_guard_of_its_own():  # registered before llmguard_client is imported
    from llmguard_client import Guard

    with Guard(replicas=[server.url], failure_mode="raise", instrumentation=None) as guard:
        status = guard.sync_http_client().post(server.url + "/v1/chat/completions", json=BODY).status_code
    threads = [t.name for t in threading.enumerate() if t.name.startswith("llmguard-sync")]
    print("exit handler:", status, "closed" if guard.closed else "open", threads, flush=True)


atexit.register(with_a_guard_of_its_own)

import llmguard_client
from tests.loopback import LoopbackServer

BODY = {"model": "m", "messages": [{"role": "user", "content": "bye"}]}
server = LoopbackServer("a")
server.start()
print("main: end", flush=True)
"""


def test_a_guard_built_and_closed_by_an_exit_handler_is_closed() -> None:
    """The Guard started its thread during the exit: nothing stops it from being closed as any other, its
    connections and thread with it."""
    proc = run_script(GUARD_IN_EXIT_HANDLER, timeout=30)
    assert (proc.returncode, proc.stdout.splitlines(), proc.stderr) == (
        0,
        ["main: end", "exit handler: 200 closed []"],
        "",
    )


CLOSED_BY_A_LATER_HANDLER = """
import atexit, threading


def close_it():  # registered before llmguard_client is imported: it runs after the guard's own exit handler
    guard.close()
    threads = [t.name for t in threading.enumerate() if t.name.startswith("llmguard-sync")]
    print("closer:", "closed" if guard.closed else "open", threads, flush=True)


atexit.register(close_it)

from llmguard_client import Guard
from tests.loopback import LoopbackServer

server = LoopbackServer("a")
server.start()
guard = None


def build_and_call():  # registered after the import: it runs before the guard's own exit handler
    global guard
    guard = Guard(replicas=[server.url], failure_mode="raise", instrumentation=None)
    body = {"model": "m", "messages": [{"role": "user", "content": "bye"}]}
    print("builder:", guard.sync_http_client().post(server.url + "/v1/chat/completions", json=body).status_code)


atexit.register(build_and_call)
"""


def test_a_guard_first_used_before_the_guards_exit_handler_is_left_to_the_exit_by_a_later_close() -> None:
    """Its thread started before the guard's own exit handler ran, as a thread of the running program's: a close
    from a handler that runs after that one refuses further calls and leaves the thread and its connections to
    the process's exit (closing them under calls daemon threads still make printed a traceback for each)."""
    proc = run_script(CLOSED_BY_A_LATER_HANDLER, timeout=30)
    assert (proc.returncode, proc.stdout.splitlines()[0], proc.stderr) == (0, "builder: 200", "")
    assert proc.stdout.splitlines()[1].startswith("closer: open ['llmguard-sync-")
