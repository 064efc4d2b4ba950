"""The Guard's own event-loop thread for sync calls, as the registry keeps it: one whose thread or loop could not
start (the process out of threads or file descriptors) fails its call as a connection error, as a plain client that
cannot open its socket does, leaves nothing behind, and is not kept: the next call starts another.

The failures are made once, at the call that would fail for real (``socket.socketpair`` for the loop's self-pipe,
``Thread.start``), and only in the thread that makes the Guard's loop or starts its thread."""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import socket
import threading
import weakref
from collections.abc import Callable, Iterator

import anyio
import httpx
import pytest

from llmguard_client import Guard, GuardClosed, GuardUnavailable, guard_failure
from llmguard_client.edges import _registry
from llmguard_client.edges._runner import SyncRunner
from tests.edges.conftest import BODY, eventually
from tests.loopback import LoopbackServer

MakeGuard = Callable[..., Guard]
MESSAGES = [{"role": "user", "content": "hi"}]


def _sync_thread(guard: Guard) -> str:
    return f"llmguard-sync-{id(guard):x}"


def _eventpolls() -> int:
    """This process's open epoll fds (an asyncio loop's selector holds one)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the fd that listed the directory, closed since
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventpoll]"
    return count


@pytest.fixture
def loop_fails_once(monkeypatch: pytest.MonkeyPatch) -> list[weakref.ref[threading.Thread]]:
    """The next Guard loop made cannot open its self-pipe (EMFILE), after its selector opened: the failing loop
    thread is appended."""
    real = socket.socketpair
    failed: list[weakref.ref[threading.Thread]] = []

    def socketpair(*args: object, **kwargs: object) -> tuple[socket.socket, socket.socket]:
        thread = threading.current_thread()
        if thread.name.startswith("llmguard-sync-") and not failed:
            failed.append(weakref.ref(thread))
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "socketpair", socketpair)
    return failed


@pytest.fixture
def no_gc() -> Iterator[None]:
    """What a failure leaves must be released by its owner, not found later by the garbage collector."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_loop_that_could_not_start_fails_its_call_as_a_connection_error_and_the_next_call_starts_one(
    servers: list[LoopbackServer], make_guard: MakeGuard, loop_fails_once: list[weakref.ref[threading.Thread]]
) -> None:
    guard = make_guard(hedge=None)
    with guard.sync_http_client() as client:
        with pytest.raises(httpx.ConnectError) as caught:
            client.post(servers[0].url + "/v1/chat/completions", json=BODY)
        assert loop_fails_once and _sync_thread(guard) not in [t.name for t in threading.enumerate()]
        served = [client.post(servers[0].url + "/v1/chat/completions", json=BODY).status_code for _ in range(2)]
    error = caught.value
    assert isinstance(error, GuardUnavailable) and guard_failure(error) == "unavailable"
    assert isinstance(error.__cause__, OSError) and error.__cause__.errno == errno.EMFILE
    assert "could not start" in str(error) and "Too many open files" in str(error)
    assert served == [200, 200] and sum(len(s.received) for s in servers) == 2


def test_a_loop_that_could_not_start_leaves_no_fd_loop_nor_thread_behind(
    servers: list[LoopbackServer],
    make_guard: MakeGuard,
    loop_fails_once: list[weakref.ref[threading.Thread]],
    no_gc: None,
) -> None:
    """Its selector's epoll fd is closed as the call fails (asyncio's half-made loop would leave it to the garbage
    collector), and neither the call's error nor the Guard keeps the runner (its ended thread) alive; collecting
    the half-made loop prints nothing (pytest turns what a ``__del__`` raises into an error)."""
    guard = make_guard(hedge=None)
    polls = _eventpolls()
    with guard.sync_http_client() as client:
        with pytest.raises(httpx.ConnectError):
            client.post(servers[0].url + "/v1/chat/completions", json=BODY)
        assert _eventpolls() <= polls  # (a Guard of an earlier test may close its loop meanwhile)
        gc.collect()
        assert loop_fails_once[0]() is None  # the failed runner's thread object, freed
        assert client.post(servers[0].url + "/v1/chat/completions", json=BODY).status_code == 200


def test_a_thread_that_could_not_start_fails_its_call_as_a_connection_error_and_the_next_call_starts_one(
    servers: list[LoopbackServer], make_guard: MakeGuard, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = threading.Thread.start
    refused: list[str] = []

    def start(thread: threading.Thread) -> None:
        if thread.name.startswith("llmguard-sync-") and not refused:
            refused.append(thread.name)
            raise RuntimeError("can't start new thread")
        real(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    guard = make_guard(hedge=None)
    with guard.sync_http_client() as client:
        with pytest.raises(httpx.ConnectError) as caught:
            client.post(servers[0].url + "/v1/chat/completions", json=BODY)
        served = client.post(servers[0].url + "/v1/chat/completions", json=BODY).status_code
    assert refused == [_sync_thread(guard)]
    assert isinstance(caught.value, GuardUnavailable) and isinstance(caught.value.__cause__, RuntimeError)
    assert served == 200 and sum(len(s.received) for s in servers) == 1


def test_openai_gets_its_connection_error_then_is_served(
    servers: list[LoopbackServer], make_guard: MakeGuard, loop_fails_once: list[weakref.ref[threading.Thread]]
) -> None:
    """``except openai.APIConnectionError`` catches it, as with a plain client out of file descriptors."""
    openai = pytest.importorskip("openai")
    guard = make_guard(hedge=None)
    client = openai.OpenAI(
        base_url=servers[0].url + "/v1", api_key="k", max_retries=0, http_client=guard.http_client_for(openai.OpenAI)
    )
    with client:
        with pytest.raises(openai.APIConnectionError) as caught:
            client.chat.completions.create(model="m", messages=MESSAGES)
        answer = client.chat.completions.create(model="m", messages=MESSAGES)
    assert guard_failure(caught.value) == "unavailable"
    assert answer.choices[0].message.content == "hello" and sum(len(s.received) for s in servers) == 1


def test_a_close_while_the_first_sync_call_cannot_start_the_loop_closes_the_guard(
    servers: list[LoopbackServer], make_guard: MakeGuard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``guard.close()`` from another thread while the first sync call's loop is failing to start (its runner is the
    Guard's until the call learns that it failed) closes the Guard itself: the runner closed nothing. An async call
    after it is refused, as after any close."""
    making, fail = threading.Event(), threading.Event()
    real = socket.socketpair

    def socketpair(*args: object, **kwargs: object) -> tuple[socket.socket, socket.socket]:
        if threading.current_thread().name.startswith("llmguard-sync-") and not making.is_set():
            making.set()
            fail.wait()
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "socketpair", socketpair)
    guard = make_guard(hedge=None)
    failed: list[BaseException] = []

    def call() -> None:
        with guard.sync_http_client() as client:
            try:
                client.post(servers[0].url + "/v1/chat/completions", json=BODY)
            except httpx.HTTPError as exc:
                failed.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    assert making.wait(30.0) and eventually(lambda: isinstance(_registry._runners.get(guard), SyncRunner))
    closer = threading.Thread(target=guard.close, daemon=True)
    closer.start()
    assert eventually(lambda: not isinstance(_registry._runners.get(guard), SyncRunner))  # the close has begun
    fail.set()
    caller.join(30.0)
    closer.join(30.0)

    async def async_call() -> None:
        async with guard.http_client() as client:
            await client.post(servers[0].url + "/v1/chat/completions", json=BODY)

    with pytest.raises(GuardClosed):
        anyio.run(async_call)
    assert [(type(e).__name__, isinstance(e, httpx.ConnectError)) for e in failed] == [("GuardUnavailable", True)]
    assert not any(s.received for s in servers)
