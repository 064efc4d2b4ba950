"""A process forked while an event loop owned a Guard (its own loop thread, started by sync calls, or a loop of the
application's that had not ended: gunicorn ``--preload``, a prefork worker pool, ``multiprocessing`` with fork)
runs neither that loop nor connections of its own: in the child every call of that Guard, sync or async, is refused
at once with `GuardClosed`, saying why and what to do, instead of waiting for ever on a loop that stayed in the parent
(a sync call) or being refused as if two threads ran the Guard (an async call); closing it there returns at once and
closes nothing of the parent's, which goes on serving. A Guard whose loop had ended before the fork serves the child.
So it is in a child forked from C, where Python's at-fork hooks do not run (uWSGI's workers).

Each scenario runs in a process of its own (a fork inside a test worker would carry the worker's state); each child
reports through a pipe, waited for within a bound (a child left waiting is killed, and the test says so).
"""

from __future__ import annotations

import os

import pytest

from tests.scripts import run_script

PRELUDE = """
import asyncio, os, select, signal, sys, threading
from llmguard_client import Guard, GuardClosed
from tests.loopback import loopback_cluster

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def in_child(work, fork=os.fork):
    # Run work() in a forked child; what it returns, told through a pipe, or "no answer" (the child is then killed).
    read, write = os.pipe()
    pid = fork()
    if pid == 0:
        os.close(read)
        signal.alarm(60)
        try:
            told = work()
        except BaseException as exc:
            told = f"failed: {type(exc).__name__}: {exc}"
        os.write(write, told.encode())
        os._exit(3)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 60)
    told = os.read(read, 4096).decode() if ready else "no answer"
    if not ready:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(read)
    return f"{told} (exit {os.waitstatus_to_exitcode(status)})"


def refused(call):
    try:
        call()
    except GuardClosed as exc:
        return "forked" if "forked" in str(exc) and "post_fork" in str(exc) else f"GuardClosed: {exc}"
    return "sent"


def refused_async(http, url):
    # asyncio.run(...) with the inherited async client, in a thread of its own (the child may be inside a loop)
    async def call():
        await http.post(url, json=BODY)

    told = []
    thread = threading.Thread(target=lambda: told.append(refused(lambda: asyncio.run(call()))))
    thread.start()
    thread.join(60)
    return told[0] if told else "no answer"
"""

SYNC_THREAD = """
with loopback_cluster(1) as cluster:
    url = cluster.servers[0].url + "/v1/chat/completions"
    guard = Guard(replicas=[cluster.servers[0].url], failure_mode="raise", instrumentation=None)
    client = guard.sync_http_client()
    http = guard.http_client()
    print("parent before:", client.post(url, json=BODY).status_code, flush=True)
    for closes in (False, True):
        def work():
            told = [refused(lambda: client.post(url, json=BODY)), refused_async(http, url)]
            if closes:
                guard.close()
                told.append(refused(lambda: client.post(url, json=BODY)))
            return " ".join(told)

        print(f"child (close={closes}):", in_child(work), flush=True)
    print("parent after:", client.post(url, json=BODY).status_code, flush=True)
    client.close()
    guard.close()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_after_sync_calls_is_refused_at_once_and_exits() -> None:
    proc = run_script(PRELUDE + SYNC_THREAD, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "parent before: 200",
        "child (close=False): forked forked (exit 3)",
        "child (close=True): forked forked GuardClosed: this Guard is closed; build a new Guard to send more "
        "requests (exit 3)",
        "parent after: 200",
    ], proc.stderr


CALLERS_LOOP = """
with loopback_cluster(1) as cluster:
    url = cluster.servers[0].url + "/v1/chat/completions"
    guard = Guard(replicas=[cluster.servers[0].url], failure_mode="raise", instrumentation=None)
    client = guard.sync_http_client()
    http = guard.http_client()

    # The application's loop, in a thread of its own, owns the Guard; the main thread's sync calls run there.
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    status = asyncio.run_coroutine_threadsafe(http.post(url, json=BODY), loop).result(60).status_code
    print("parent before:", status, client.post(url, json=BODY).status_code, flush=True)

    def work():
        told = [refused(lambda: client.post(url, json=BODY)), refused_async(http, url)]
        guard.close()
        asyncio.run(guard.aclose())
        return " ".join(told) + " closed"

    print("child of a loop in a thread:", in_child(work), flush=True)

    async def fork_in_loop():
        # Forked from inside the owner loop (a worker pool started by an async app), which is then left unrun.
        def work():
            return " ".join([refused(lambda: client.post(url, json=BODY)), refused_async(http, url)])

        return in_child(work)

    print("child of the loop itself:", asyncio.run_coroutine_threadsafe(fork_in_loop(), loop).result(120), flush=True)
    status = asyncio.run_coroutine_threadsafe(http.post(url, json=BODY), loop).result(60).status_code
    print("parent after:", status, client.post(url, json=BODY).status_code, flush=True)
    asyncio.run_coroutine_threadsafe(guard.aclose(), loop).result(60)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(60)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_while_an_application_loop_owned_the_guard_is_refused_at_once() -> None:
    proc = run_script(PRELUDE + CALLERS_LOOP, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "parent before: 200 200",
        "child of a loop in a thread: forked forked closed (exit 3)",
        "child of the loop itself: forked forked (exit 3)",
        "parent after: 200 200",
    ], proc.stderr


ENDED_LOOP = """
with loopback_cluster(1) as cluster:
    url = cluster.servers[0].url + "/v1/chat/completions"
    guard = Guard(replicas=[cluster.servers[0].url], failure_mode="raise", instrumentation=None)
    http = guard.http_client()

    async def call():
        return (await http.post(url, json=BODY)).status_code

    if sys.argv[1] == "ended":
        print("parent before:", asyncio.run(call()), flush=True)  # that loop has ended: the Guard is no loop's
    else:  # a loop kept for the process, stopped between its runs: the next loop takes the Guard over
        kept = asyncio.new_event_loop()
        print("parent before:", kept.run_until_complete(call()), flush=True)

    def work():
        with guard.sync_http_client() as client:
            told = [client.post(url, json=BODY).status_code, asyncio.run(call())]
        guard.close()
        return " ".join(map(str, told))

    print("child:", in_child(work), flush=True)
    print("parent after:", asyncio.run(call()), flush=True)
    guard.close()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
@pytest.mark.parametrize("owner", ["ended", "stopped"])
def test_a_child_forked_after_the_owner_loop_ended_or_stopped_is_served(owner: str) -> None:
    proc = run_script(PRELUDE + ENDED_LOOP, owner, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["parent before: 200", "child: 200 200 (exit 3)", "parent after: 200"], (
        proc.stderr
    )


FORKED_FROM_C = """
import ctypes, gc

# fork(2) called from C, as uWSGI forks its workers: Python's at-fork hooks do not run in the child. PyDLL keeps the
# GIL through the call, so the child holds it (as it would be had the call released it, by another of its threads).
# The child starts no thread: its parent's threads' states linger there, and a new thread may take one's place and
# crash or hang the child (CPython's, with no guard involved), so the async call runs in the child's main thread.
c_fork = ctypes.PyDLL(None).fork
hooked = []
os.register_at_fork(after_in_child=lambda: hooked.append(True))


def refused_here(http, url):
    async def call():
        await http.post(url, json=BODY)

    return refused(lambda: asyncio.run(call()))

with loopback_cluster(1) as cluster:
    url = cluster.servers[0].url + "/v1/chat/completions"
    guard = Guard(replicas=[cluster.servers[0].url], failure_mode="raise", instrumentation=None)
    client = guard.sync_http_client()
    http = guard.http_client()
    print("parent before:", client.post(url, json=BODY).status_code, flush=True)  # the Guard's own loop runs

    def work():
        told = [f"hooks ran: {bool(hooked)}", refused(lambda: client.post(url, json=BODY)), refused_here(http, url)]
        guard.close()
        return " ".join(told) + " closed"

    def drop():  # no call first: collected, the Guard stops its loop thread, which is the parent's
        global guard, client, http
        del guard, client, http
        gc.collect()
        return "dropped"

    print("child:", in_child(work, c_fork), flush=True)
    print("child dropping the Guard:", in_child(drop, c_fork), flush=True)
    print("parent after:", client.post(url, json=BODY).status_code, flush=True)
    client.close()
    guard.close()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_from_c_without_the_at_fork_hooks_is_refused_at_once() -> None:
    proc = run_script(PRELUDE + FORKED_FROM_C, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "parent before: 200",
        "child: hooks ran: False forked forked closed (exit 3)",
        "child dropping the Guard: dropped (exit 3)",
        "parent after: 200",
    ], proc.stderr


HELD_LOCK = """
with loopback_cluster(1) as cluster:
    url = cluster.servers[0].url + "/v1/chat/completions"
    guard = Guard(replicas=[cluster.servers[0].url], failure_mode="raise", instrumentation=None)
    client = guard.sync_http_client()
    # Another thread of the parent is counting a call of this client in (its lock held) as the process forks.
    held, release = threading.Lock(), threading.Event()
    calls = client._transport._calls

    def count_in():
        with calls._lock:
            held.release()
            release.wait()

    held.acquire()
    threading.Thread(target=count_in).start()
    held.acquire()
    print("child:", in_child(lambda: str(client.post(url, json=BODY).status_code)), flush=True)
    release.set()
    print("parent:", client.post(url, json=BODY).status_code, flush=True)
    client.close()
    guard.close()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_while_another_thread_counted_a_call_in_is_served() -> None:
    proc = run_script(PRELUDE + HELD_LOCK, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["child: 200 (exit 3)", "parent: 200"], proc.stderr


BUILT_IN_THE_CHILD = """
import ctypes
from llmguard_client.server_hints import poll_once

c_fork = ctypes.PyDLL(None).fork  # fork(2) from C, as uWSGI forks its workers: no at-fork hooks run in the child

with loopback_cluster(1) as cluster:
    url = cluster.servers[0].url + "/v1/chat/completions"
    early = Guard(replicas=[cluster.servers[0].url], failure_mode="raise", instrumentation=None)

    def polled(guard, polled, done):  # a metrics poller on a loop of the worker's, which goes on running
        async def main():
            await poll_once(guard)
            polled.set()
            await asyncio.to_thread(done.wait)

        asyncio.run(main())

    def work():  # as a worker's post-fork hook builds its Guard, and its metrics poller runs before any call
        told = []
        built_here = lambda: Guard(replicas=[cluster.servers[0].url], failure_mode="raise", instrumentation=None)
        for make in (lambda: early, built_here):  # built in the parent but not used there, then built in the child
            each = make()
            ready, done = threading.Event(), threading.Event()
            poller = threading.Thread(target=polled, args=(each, ready, done))
            poller.start()
            ready.wait(30)
            try:
                told.append(str(each.sync_http_client().post(url, json=BODY).status_code))
            except Exception as exc:
                told.append(type(exc).__name__)
            done.set()
            poller.join(30)
            each.close()
        return " ".join(told)

    print("child:", in_child(work, c_fork), flush=True)
    early.close()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_guard_first_polled_in_a_child_forked_from_c_is_served() -> None:
    proc = run_script(PRELUDE + BUILT_IN_THE_CHILD, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["child: 200 200 (exit 3)"], proc.stderr
