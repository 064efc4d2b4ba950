"""The sync httpx edge against real loopback servers: bodies, early close, back-pressure, shutdown."""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from llmguard_client import Guard, GuardClosed, Tier, TTFTTimeout, guard_failure
from llmguard_client.edges._runner import READ_AHEAD
from tests.edges.conftest import BODY, client_sockets, eventually, pools, sync_threads
from tests.loopback import LoopbackServer, Script
from tests.virtual import FakeReplica, Plan

MakeGuard = Callable[..., Guard]


def test_non_streamed_and_streamed_bodies_arrive_whole(servers: list[LoopbackServer], make_guard: MakeGuard) -> None:
    guard = make_guard(hedge=None)
    with guard.sync_http_client() as client, guard.capture() as calls:
        plain = client.post(servers[0].url + "/v1/chat/completions", json=BODY)
        with client.stream("POST", servers[0].url + "/v1/chat/completions", json={**BODY, "stream": True}) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["content"] == "hello"
    assert plain.extensions["llmguard"] is calls[0]
    assert events[-1] == "data: [DONE]" and len(events) == 1 + 5 + 1 + 1  # role, 5 tokens, finish, DONE
    assert [(c.status, c.stream) for c in calls] == [("ok", False), ("ok", True)]


def test_a_stream_closed_midway_closes_the_upstream(servers: list[LoopbackServer], make_guard: MakeGuard) -> None:
    for server in servers:
        server.script = Script(tokens=200, gap=0.01)
    guard = make_guard(hedge=None)
    with guard.sync_http_client() as client, guard.capture() as calls:
        with client.stream("POST", servers[0].url + "/v1/chat/completions", json={**BODY, "stream": True}) as r:
            for i, _ in enumerate(r.iter_raw()):
                if i == 3:
                    break
        assert calls[0].status == "abandoned" and calls[0].cause == "closed_by_caller"
    assert eventually(lambda: sum(s.disconnects for s in servers) == 1)
    assert sum(s.completed for s in servers) == 0


@pytest.mark.parametrize("rollout", [1.0, 0.0], ids=["guarded", "control"])
def test_a_stream_closed_while_the_edge_waits_for_its_next_chunk_is_abandoned_not_cancelled(
    servers: list[LoopbackServer], make_guard: MakeGuard, rollout: float
) -> None:
    """The sync edge ends a closed body by cancelling the read it waits in: the caller closed it, it cancelled
    nothing."""
    servers[0].script = Script(tokens=3, gap=30.0)  # the edge's next read waits for the second token
    guard = make_guard(hedge=None, rollout=rollout, tiers={"interactive": Tier(ttft=5.0, total=60.0, stall=60.0)})
    with guard.sync_http_client() as client, guard.capture() as calls:
        with client.stream("POST", servers[0].url + "/v1/chat/completions", json={**BODY, "stream": True}) as r:
            next(r.iter_raw())
        assert [(c.cohort, c.status, c.cause) for c in calls] == [
            ("guarded" if rollout else "control", "abandoned", "closed_by_caller")
        ]
    assert eventually(lambda: servers[0].disconnects == 1)


def test_the_body_is_read_at_most_read_ahead_chunks_before_the_caller() -> None:
    """Bounded back-pressure: the edge reads at most READ_AHEAD chunks beyond those the caller took, and
    goes on reading as the caller takes them (a caller behind takes what piled up joined, in one step)."""
    produced = 0

    async def events() -> AsyncIterator[bytes]:
        nonlocal produced
        for i in range(1000):
            produced += 1
            yield b'data: {"choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n' % i
        yield b"data: [DONE]\n\n"

    def replica(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events())

    guard = Guard(["http://a"], transport_factory=lambda r: httpx.MockTransport(replica), instrumentation=None)
    try:
        with guard.sync_http_client() as client:
            with client.stream("POST", "http://a/v1/chat/completions", json={**BODY, "stream": True}) as r:
                chunks = r.iter_raw()
                taken = b""
                while taken.count(b"data: ") < 10:
                    taken += next(chunks)
                first = taken.count(b"data: ")  # 10, or more when several had piled up
                assert eventually(lambda: produced == first + READ_AHEAD)  # the window fills while the caller waits
                threading.Event().wait(0.2)
                assert produced == first + READ_AHEAD  # and no further
                taken += next(chunks)
                assert taken.count(b"data: ") == first + READ_AHEAD  # what piled up comes in one step, joined
                more = taken.count(b"data: ")
                assert eventually(lambda: produced == more + READ_AHEAD)  # each chunk taken makes room for one
            assert produced == more + READ_AHEAD  # closing early reads nothing more
    finally:
        guard.close()


def test_a_core_failure_reaches_the_sync_caller_typed(servers: list[LoopbackServer], make_guard: MakeGuard) -> None:
    for server in servers:
        server.script = Script(stall_before_first=5.0)
    guard = make_guard(hedge=None, retry=None, tiers={"fast": Tier(ttft=0.2, total=5.0)}, failure_mode="raise")
    with guard.sync_http_client() as client, pytest.raises(TTFTTimeout) as caught:
        client.post(servers[0].url + "/v1/chat/completions", json={**BODY, "stream": True})
    assert caught.value.cause == "ttft_timeout" and caught.value.record is not None
    assert eventually(lambda: sum(s.disconnects for s in servers) == 1)


def test_the_tier_chosen_in_the_callers_thread_applies(servers: list[LoopbackServer], make_guard: MakeGuard) -> None:
    guard = make_guard(tiers={"a": Tier(ttft=2.0, total=10.0), "b": Tier(ttft=3.0, total=10.0)})
    with guard.sync_http_client() as client, guard.capture() as calls:
        client.post(servers[0].url + "/v1/chat/completions", json=BODY)
        with guard.tier("b"):
            client.post(servers[0].url + "/v1/chat/completions", json=BODY)
    assert [c.tier for c in calls] == ["a", "b"]


def test_many_threads_share_one_event_loop_thread(servers: list[LoopbackServer], make_guard: MakeGuard) -> None:
    guard = make_guard()
    client = guard.sync_http_client()
    statuses: list[int] = []

    def work() -> None:
        for _ in range(5):
            statuses.append(client.post(servers[0].url + "/v1/chat/completions", json=BODY).status_code)

    workers = [threading.Thread(target=work) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert statuses == [200] * 40
    assert len(sync_threads()) == 1


def test_close_from_sync_code_leaves_no_thread_no_socket(servers: list[LoopbackServer]) -> None:
    # What earlier tests of this process left (threads ending, sockets closing) is not this Guard's.
    before, sockets_before = set(threading.enumerate()), client_sockets(servers)
    guard = Guard([s.url for s in servers], instrumentation=None, transport_factory=pools)
    client = guard.sync_http_client()
    for _ in range(6):
        assert client.post(servers[0].url + "/v1/chat/completions", json=BODY).status_code == 200
    assert client_sockets(servers) > sockets_before and "llmguard-sync-" in " ".join(sync_threads())
    guard.close()
    assert not set(threading.enumerate()) - before
    assert eventually(lambda: client_sockets(servers) <= sockets_before)
    with pytest.raises(GuardClosed, match="closed") as caught:
        client.post(servers[0].url + "/v1/chat/completions", json=BODY)
    assert guard_failure(caught.value) == "guard_closed"
    assert not set(threading.enumerate()) - before  # the call refused started no thread either


@pytest.mark.parametrize("behind", [False, True], ids=["keeping_up", "read_behind"])
def test_close_with_a_stream_open_ends_it_with_guard_closed_and_closes_the_upstream(
    servers: list[LoopbackServer], behind: bool
) -> None:
    """A caller that has not taken the chunks read ahead for it (a SIGTERM handler closing the Guard on the thread
    reading the stream) gets them, then `GuardClosed`, as a caller keeping up does: not a bare read error."""
    for server in servers:
        server.script = Script(tokens=2000, gap=0.002)
    guard = Guard([s.url for s in servers], hedge=None, instrumentation=None, transport_factory=pools)
    client = guard.sync_http_client()
    with client.stream("POST", servers[0].url + "/v1/chat/completions", json={**BODY, "stream": True}) as r:
        chunks = r.iter_raw()
        next(chunks)
        if behind:
            assert eventually(lambda: len(servers[0].token_times) >= 10 * READ_AHEAD)  # the read-ahead is full
        guard.close()
        with pytest.raises(httpx.TransportError) as caught:
            for _ in chunks:
                pass
    assert isinstance(caught.value, GuardClosed) and guard_failure(caught.value) == "guard_closed"
    assert sync_threads() == []
    assert eventually(lambda: client_sockets(servers) == 0 and servers[0].disconnects == 1)


def test_a_guard_dropped_without_close_stops_its_thread(servers: list[LoopbackServer]) -> None:
    guard = Guard([s.url for s in servers], instrumentation=None, transport_factory=pools)
    client = guard.sync_http_client()
    assert client.post(servers[0].url + "/v1/chat/completions", json=BODY).status_code == 200
    assert len(sync_threads()) == 1
    del guard, client
    import gc

    gc.collect()
    assert eventually(lambda: sync_threads() == [])


async def test_aclose_from_async_code_stops_the_sync_thread(servers: list[LoopbackServer]) -> None:
    import anyio

    guard = Guard([s.url for s in servers], instrumentation=None, transport_factory=pools)
    client = guard.sync_http_client()

    def call() -> int:
        return client.post(servers[0].url + "/v1/chat/completions", json=BODY).status_code

    assert await anyio.to_thread.run_sync(call) == 200
    assert len(sync_threads()) == 1
    await guard.aclose()
    assert sync_threads() == []
    assert eventually(lambda: client_sockets(servers) == 0)


def test_the_record_extension_and_headers_survive(servers: list[LoopbackServer], make_guard: MakeGuard) -> None:
    for server in servers:
        server.script = Script(headers={"x-server": "yes"})
    guard = make_guard()
    with guard.sync_http_client() as client:
        response = client.post(servers[0].url + "/v1/chat/completions", json=BODY)
    assert response.headers["x-server"] == "yes"
    assert response.extensions["llmguard"].status == "ok"
    assert json.loads(response.content)["object"] == "chat.completion"


def test_close_with_grace_lets_a_running_stream_finish(servers: list[LoopbackServer]) -> None:
    for server in servers:
        server.script = Script(tokens=20, gap=0.02)
    guard = Guard([s.url for s in servers], hedge=None, instrumentation=None, transport_factory=pools)
    client = guard.sync_http_client()
    events: list[str] = []

    def read() -> None:
        with client.stream("POST", servers[0].url + "/v1/chat/completions", json={**BODY, "stream": True}) as r:
            events.extend(line for line in r.iter_lines() if line.startswith("data: "))

    reader = threading.Thread(target=read)
    reader.start()
    assert eventually(lambda: len(events) > 0 or servers[0].started_streams == 1)
    guard.close(grace=3.0)
    reader.join()
    assert events[-1] == "data: [DONE]" and sync_threads() == []
    assert eventually(lambda: client_sockets(servers) == 0)


def test_a_call_made_while_close_runs_is_refused_once_the_close_has_ended(servers: list[LoopbackServer]) -> None:
    # Threads calling again at once on each refusal held the GIL from the threads closing the Guard for seconds: a
    # call made during the close waits for its end (blocked), then is refused.
    for server in servers:
        server.script = Script(tokens=500, gap=0.01)
    guard = Guard([s.url for s in servers], hedge=None, instrumentation=None, transport_factory=pools)
    client = guard.sync_http_client()
    seen: list[tuple[bool, list[str]]] = []
    stream_closed = threading.Event()

    def call() -> None:
        with pytest.raises(GuardClosed):
            client.post(servers[0].url + "/v1/chat/completions", json=BODY)
        seen.append((stream_closed.is_set(), sync_threads()))

    with client.stream("POST", servers[0].url + "/v1/chat/completions", json={**BODY, "stream": True}) as r:
        next(r.iter_raw())  # in flight: the close waits for it (its grace)
        closer = threading.Thread(target=guard.close, kwargs={"grace": 60.0})
        closer.start()
        assert eventually(lambda: guard.closed)
        caller = threading.Thread(target=call)
        caller.start()
        caller.join(1.0)  # refused at once, it would be over by now (were it not, the assertion below still holds)
        stream_closed.set()
    closer.join()
    caller.join()
    assert seen == [(True, [])]  # refused after the stream ended, the close with it, the Guard's thread gone


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")
def test_a_call_from_a_signal_handler_on_the_closing_thread_is_refused_at_once(servers: list[LoopbackServer]) -> None:
    """A SIGTERM hook making a sync call while its thread runs ``guard.close(grace)``: that call cannot wait for the
    close (its own thread's), so it is refused at once, and the close ends (before: both waited for ever)."""
    for server in servers:
        server.script = Script(tokens=500, gap=0.01)
    guard = Guard([s.url for s in servers], hedge=None, instrumentation=None, transport_factory=pools)
    client = guard.sync_http_client()
    refused: list[bool] = []

    def on_alarm(signum: int, frame: object) -> None:
        try:
            client.post(servers[0].url + "/v1/chat/completions", json=BODY)
        except GuardClosed:
            refused.append(guard.closed)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        with client.stream("POST", servers[0].url + "/v1/chat/completions", json={**BODY, "stream": True}) as r:
            next(r.iter_raw())  # in flight: the close waits its grace for it, and the alarm comes meanwhile
            faulthandler.dump_traceback_later(60, exit=True)  # a deadlock fails the run instead of hanging it
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            guard.close(grace=2.0)
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert refused == [True]


_FREEZEGUN_SKIPS = ("threading", "multiprocessing", "queue", "_pytest.terminal.", "_pytest.runner.")
"""Modules freezegun's ``freeze_time`` leaves alone by default (of those a test run has)."""


def _freeze_monotonic(monkeypatch: pytest.MonkeyPatch) -> None:
    """Freeze ``time.monotonic`` as freezegun's ``freeze_time`` does: in the time module, and in every module
    attribute that holds the real function (``from time import monotonic``)."""
    real = time.monotonic

    def frozen() -> float:
        return 1_000_000.0

    monkeypatch.setattr(time, "monotonic", frozen)
    for name, module in list(sys.modules.items()):
        if module is None or name in ("time", "datetime") or name.startswith(_FREEZEGUN_SKIPS):
            continue
        for attribute, value in list(getattr(module, "__dict__", {}).items()):
            if value is real:
                monkeypatch.setattr(module, attribute, frozen)


@pytest.mark.parametrize("first", [500, 429])
def test_a_retry_waits_on_the_guards_own_clock_which_a_test_freezing_time_leaves_running(
    monkeypatch: pytest.MonkeyPatch, first: int
) -> None:
    """A sync call under a frozen ``time.monotonic`` (freezegun) whose first answer asks for a retry: the retry's
    backoff waits on the Guard's own loop, whose timers must still fire (the SDK's own ``time.sleep`` does). The
    replica is in memory, on the Guard's loop: a loopback server's loop would be frozen too."""
    fake = FakeReplica("a", [Plan(status=first), Plan()])
    guard = Guard(["http://a.test"], instrumentation=None, hedge=None, transport_factory=lambda replica: fake)
    outcome: list[int] = []

    def call() -> None:
        with guard.sync_http_client() as client:
            outcome.append(client.post("http://a.test/v1/chat/completions", json=BODY).status_code)

    _freeze_monotonic(monkeypatch)
    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(30.0)  # an upper bound only: served in about a second
    monkeypatch.undo()  # a call left waiting can end now, and the guard close
    caller.join(30.0)
    guard.close()
    assert outcome == [200] and fake.requests == 2
