"""Optional server hints: vLLM /metrics parsed, polled at a bounded rate, and used by the router."""

from __future__ import annotations

import asyncio
import base64
import functools
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest

from llmguard_client import Guard, GuardClosed, GuardConfigError, Replica, Tier, WrongEventLoop
from llmguard_client._core.clock import loop_clock
from llmguard_client.server_hints import (
    ServerLoad,
    _poll_round,
    metrics_url,
    parse_vllm_metrics,
    poll_once,
    poll_vllm_metrics,
    vllm_metrics_polled,
)
from llmguard_tools.sim.cluster import SimCluster
from llmguard_tools.sim.launch import spawn_cluster
from tests.edges.conftest import eventually
from tests.sim.conftest import one_off
from tests.virtual import BACKENDS, run_virtual

VLLM = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
vllm:num_requests_running{engine="0",model_name="m"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.97
vllm:num_requests_waiting_by_reason{reason="x"} 9.0
"""


def test_parse_sums_the_queue_and_takes_the_fullest_kv_cache() -> None:
    assert parse_vllm_metrics(VLLM) == ServerLoad(waiting=5.0, kv_usage=0.97)
    old = 'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\nvllm:num_requests_waiting 1\n'
    assert parse_vllm_metrics(old) == ServerLoad(waiting=1.0, kv_usage=0.5)
    assert parse_vllm_metrics("") == ServerLoad(None, None)
    assert parse_vllm_metrics("vllm:num_requests_waiting{} NaN\nvllm:kv_cache_usage_perc oops\n") == ServerLoad(
        None, None
    )


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("http://h:8000/v1", "http://h:8000/metrics"),
        ("http://h:8000/v1/", "http://h:8000/metrics"),
        ("http://h:8000", "http://h:8000/metrics"),
        ("https://h/prefix/v1", "https://h/prefix/metrics"),
        ("http://h/gw%2Fx/v1", "http://h/gw%2Fx/metrics"),  # a base path's escapes as the URL spells them
        ("http://h/dep%3Fx/a%2541/v1", "http://h/dep%3Fx/a%2541/metrics"),
    ],
)
def test_metrics_url_sits_next_to_the_api(base: str, expected: str) -> None:
    assert str(metrics_url(httpx.URL(base.rstrip("/")))) == expected


class Metrics:
    """A transport per replica answering /metrics with a script; counts the polls."""

    def __init__(self) -> None:
        self.bodies: dict[str, tuple[int, str]] = {}
        self.polls: dict[str, int] = {}
        self.headers: list[httpx.Headers] = []
        self.times: list[float] = []

    def factory(self, replica: Replica) -> httpx.AsyncBaseTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            assert request.url.path.endswith("/metrics")
            self.polls[replica.name] = self.polls.get(replica.name, 0) + 1
            self.headers.append(request.headers)
            self.times.append(anyio.current_time())
            status, text = self.bodies.get(replica.name, (200, ""))
            return httpx.Response(status, text=text)

        return httpx.MockTransport(handle)

    def chatting(self, replica: Replica) -> httpx.AsyncBaseTransport:
        """`factory`'s transport, which also answers chat completions (for calls beside the polls)."""
        polled = self.factory(replica)

        def handle(request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/chat/completions"):
                return httpx.Response(200, json={"choices": [{"index": 0, "message": {"content": "hi"}}]})
            return polled.handle_request(request)

        return httpx.MockTransport(handle)


async def test_a_queue_at_the_server_counts_as_load_and_a_full_kv_cache_ranks_last() -> None:
    metrics = Metrics()
    replicas = [Replica("http://a:1/v1", headers={"authorization": "Bearer A"}), Replica("http://b:1/v1")]
    metrics.bodies = {"http://a:1/v1": (200, "vllm:num_requests_waiting 4\n"), "http://b:1/v1": (200, "")}
    async with Guard(replicas, transport_factory=metrics.factory, instrumentation=None) as guard:
        rs = guard._replica_set
        a, b = rs.states
        hints = await poll_once(guard, clock=lambda: 100.0, fresh_for=6.0)
        assert hints == {"http://a:1/v1": ServerLoad(4.0, None), "http://b:1/v1": ServerLoad(None, None)}
        assert metrics.headers[0]["authorization"] == "Bearer A" or metrics.headers[1]["authorization"] == "Bearer A"
        b.in_flight = 3  # 4 queued at a's server weigh more than the guard's own 3 at b
        assert rs.pick(101.0) is b
        assert rs.pick(106.1) is a  # the hint is stale: only what the guard sees counts
        metrics.bodies["http://b:1/v1"] = (200, "vllm:kv_cache_usage_perc 0.99\n")
        await poll_once(guard, clock=lambda: 200.0, fresh_for=6.0)
        b.in_flight = 0
        assert rs.pick(201.0) is a and rs.pick_ready(201.0) is a and rs.pick_hedge(201.0, exclude=[]) is a
        assert rs.pick(206.1) is b


async def test_a_poll_carries_the_replicas_own_host_and_the_credential_its_url_gives() -> None:
    """A replica's ``Host`` and its URL's ``user:password`` (as ``Authorization: Basic``) go with its polls as with
    its calls; the URL polled carries no userinfo."""
    metrics = Metrics()
    replicas = [Replica("http://u%40x:p%3Aw@a:1/v1", headers={"Host": "llm.internal"}), Replica("http://b:1/v1")]
    async with Guard(replicas, transport_factory=metrics.factory, instrumentation=None) as guard:
        await poll_once(guard, clock=lambda: 100.0, fresh_for=6.0)
    got = sorted((h["host"], h.get("authorization")) for h in metrics.headers)
    assert got == [("b:1", None), ("llm.internal", "Basic " + base64.b64encode(b"u@x:p:w").decode())]


async def test_one_round_refuses_bad_numbers_before_polling() -> None:
    metrics = Metrics()
    async with Guard(["http://a:1"], transport_factory=metrics.factory, instrumentation=None) as guard:
        with pytest.raises(GuardConfigError, match="request_timeout > 0 and fresh_for > 0"):
            await poll_once(guard, request_timeout=0)
        with pytest.raises(GuardConfigError, match=r"got 1\.0, -1"):
            await poll_once(guard, fresh_for=-1)
    assert metrics.polls == {}


async def test_one_round_from_another_running_loop_is_refused_naming_why() -> None:
    metrics = Metrics()
    async with Guard(["http://a:1"], transport_factory=metrics.chatting, instrumentation=None) as guard:
        async with guard.http_client() as client:  # this loop now holds the Guard's connections
            assert (await client.post("http://a:1/chat/completions", json={"model": "m"})).status_code == 200

        def elsewhere() -> BaseException | None:
            try:
                asyncio.run(poll_once(guard))
            except WrongEventLoop as exc:
                return exc
            return None

        refused = await asyncio.to_thread(elsewhere)
        assert isinstance(refused, WrongEventLoop) and "still running" in str(refused)
        assert metrics.polls == {}  # nothing was read from the other loop
        assert await poll_once(guard) == {"http://a:1": ServerLoad(None, None)}


async def test_a_replica_without_metrics_is_not_polled_again() -> None:
    metrics = Metrics()
    metrics.bodies = {"http://a:1": (404, "not found"), "http://b:1": (500, "oops")}
    async with Guard(["http://a:1", "http://b:1"], transport_factory=metrics.factory, instrumentation=None) as guard:
        rs = guard._replica_set
        skip: set[str] = set()
        hints = await _poll_round(rs, request_timeout=1.0, fresh_for=6.0, skip=skip)
        assert hints == {"http://a:1": None, "http://b:1": None}
        assert skip == {"http://a:1"}
        await _poll_round(rs, request_timeout=1.0, fresh_for=6.0, skip=skip)
        assert metrics.polls == {"http://a:1": 1, "http://b:1": 2}


@BACKENDS
def test_ctrl_c_in_one_replicas_poll_reaches_the_caller_as_keyboard_interrupt(backend: str) -> None:
    """Trio delivers Ctrl-C to any task, here one polling a replica: the poller's task group hands it on as it
    came, not in a group (the caller's own task group, where the poller runs, is the one that groups)."""
    metrics = Metrics()
    interrupt = KeyboardInterrupt()

    def factory(replica: Replica) -> httpx.AsyncBaseTransport:
        if replica.name == "http://b:1":

            def handle(request: httpx.Request) -> httpx.Response:
                raise interrupt

            return httpx.MockTransport(handle)
        return metrics.factory(replica)

    async def main() -> None:
        async with Guard(["http://a:1", "http://b:1"], transport_factory=factory, instrumentation=None) as guard:
            await poll_once(guard)

    try:
        run_virtual(main, backend)
    except BaseException as exc:  # a KeyboardInterrupt must not end the test session
        caught: BaseException | None = exc
    else:
        caught = None
    assert caught is interrupt, repr(caught)


def test_the_poller_runs_about_ten_times_a_second_by_default_in_your_task_group_and_stops_when_cancelled() -> None:
    metrics = Metrics()

    async def main() -> None:  # in virtual time: the poller sleeps on the event loop's clock
        guard = Guard(["http://a:1", "http://b:1"], transport_factory=metrics.factory, instrumentation=None)
        async with guard:
            async with anyio.create_task_group() as tg:
                tg.start_soon(poll_vllm_metrics, guard)
                await anyio.sleep(0.445)
                tg.cancel_scope.cancel()
            # at 0 s, 0.09-0.11 s, ... and 0.36-0.44 s (the next at 0.45 s or later): each interval is 0.1 s within 10 %
            assert metrics.polls == {"http://a:1": 5, "http://b:1": 5}
            with pytest.raises(GuardConfigError, match=r"every must be at least 0\.1 seconds, got 0\.05"):
                await poll_vllm_metrics(guard, every=0.05)
            with pytest.raises(GuardConfigError, match="request_timeout must be > 0 and <= every"):
                await poll_vllm_metrics(guard, every=1.0, request_timeout=2.0)

    run_virtual(main)


def test_sync_code_polls_on_the_guards_loop_thread_while_its_block_runs_and_not_after() -> None:
    metrics = Metrics()
    metrics.bodies = {"http://a:1": (200, "vllm:num_requests_waiting 4\n"), "http://b:1": (200, "")}
    guard = Guard(["http://a:1", "http://b:1"], transport_factory=metrics.factory, instrumentation=None)
    try:
        with pytest.raises(GuardConfigError, match=r"every must be at least 0\.1 seconds, got 0\.05"):
            with vllm_metrics_polled(guard, every=0.05):
                pass
        assert metrics.polls == {}  # nothing started
        with vllm_metrics_polled(guard, every=0.1):
            waited_until = time.monotonic() + 30
            while guard.snapshot().replicas[0].server_waiting is None and time.monotonic() < waited_until:
                time.sleep(0.01)
            assert [r.server_waiting for r in guard.snapshot().replicas] == [4.0, None]
        polls = dict(metrics.polls)
        time.sleep(0.3)  # three intervals
        assert metrics.polls == polls  # the poller had stopped when the block ended
        with vllm_metrics_polled(guard):  # a block that ends at once: the poller is stopped, started or not
            pass
    finally:
        guard.close()
    with pytest.raises(GuardClosed), vllm_metrics_polled(guard):
        pass
    closing = Guard(["http://a:1"], transport_factory=metrics.factory, instrumentation=None)
    with vllm_metrics_polled(closing):
        closing.close()  # the poller ends with the Guard's loop; leaving the block raises nothing


def test_async_code_run_inside_a_sync_pollers_block_is_served_and_the_poller_goes_on_after() -> None:
    """The sync poller does not keep the Guard on its own thread: an ``asyncio.run`` inside the block takes it
    over at once (before: its call waited out its whole ttft, then was refused: 600 s with the default tier), and
    the poller, which skips its rounds meanwhile, polls again once that loop has ended."""
    metrics = Metrics()

    def polls() -> int:
        return sum(metrics.polls.values())

    async def async_code(guard: Guard) -> int:
        async with guard.http_client() as client:
            return (await client.post("http://a:1/v1/chat/completions", json={"model": "m"})).status_code

    tiers = {"t": Tier(ttft=5, total=10)}
    guard = Guard(["http://a:1"], transport_factory=metrics.chatting, instrumentation=None, tiers=tiers)
    try:
        with vllm_metrics_polled(guard):
            assert eventually(lambda: polls() >= 2)
            assert asyncio.run(async_code(guard)) == 200
            before = polls()
            assert eventually(lambda: polls() >= before + 2)  # polling again, on the Guard's own thread
    finally:
        guard.close()


async def test_a_sync_poller_beside_async_code_polls_on_the_loop_that_owns_the_guard() -> None:
    """From a worker thread of an app whose async code uses the Guard, the poller runs on the app's loop (the
    connections the calls use), not on a loop thread of the Guard's own."""
    metrics = Metrics()
    metrics.bodies = {"http://a:1": (200, "vllm:num_requests_waiting 4\n"), "http://b:1": (200, "")}

    async with Guard(["http://a:1", "http://b:1"], transport_factory=metrics.chatting, instrumentation=None) as guard:
        async with guard.http_client() as client:  # a first call: this loop owns the Guard
            assert (await client.post("http://a:1/v1/chat/completions", json={"model": "m"})).status_code == 200

        def sync_code() -> tuple[float | None, list[str]]:
            with vllm_metrics_polled(guard):
                waited_until = time.monotonic() + 30
                while guard.snapshot().replicas[0].server_waiting is None and time.monotonic() < waited_until:
                    time.sleep(0.01)
                return guard.snapshot().replicas[0].server_waiting, [
                    t.name for t in threading.enumerate() if t.name.startswith("llmguard-sync-")
                ]

        assert await anyio.to_thread.run_sync(sync_code) == (4.0, [])
        assert sum(metrics.polls.values()) >= 2


def test_a_sync_openai_client_streams_while_the_simulated_servers_queues_are_polled() -> None:
    openai = pytest.importorskip("openai")
    with spawn_cluster("healthy", replicas=2) as urls:
        guard = Guard(urls, instrumentation=None)
        try:
            client = openai.OpenAI(base_url=urls[0] + "/v1", api_key="sim", http_client=guard.sync_http_client())
            with vllm_metrics_polled(guard):
                stream = client.chat.completions.create(
                    model="sim-model", messages=[{"role": "user", "content": "Hi"}], max_tokens=5, stream=True
                )
                text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
                waited_until = time.monotonic() + 30
                while time.monotonic() < waited_until and None in [r.server_waiting for r in guard.snapshot().replicas]:
                    time.sleep(0.01)
                reported = [r.server_waiting for r in guard.snapshot().replicas]
        finally:
            guard.close()
    assert text
    assert None not in reported, reported  # both servers' queues reached the router through the sync loop


ASK: Any = {"model": "sim-model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
Cells = Callable[[Any, Any, Callable[[], None]], Awaitable[None]]
"""A notebook's cells: given its async and sync openai clients (one Guard) and what starts the poller."""


def run_notebook(cells: Cells) -> None:
    """A kernel's loop running ``cells`` against a simulated cluster of two replicas; then every replica's queue
    must have reached the router, and the poller must still run (a dead one would have ended the task group)."""
    openai = pytest.importorskip("openai")

    async def kernel(urls: list[str]) -> None:
        async with Guard(urls, instrumentation=None) as guard:
            aclient = openai.AsyncOpenAI(base_url=urls[0] + "/v1", api_key="sim", http_client=guard.http_client())
            client = openai.OpenAI(base_url=urls[0] + "/v1", api_key="sim", http_client=guard.sync_http_client())
            async with anyio.create_task_group() as group:
                await cells(aclient, client, functools.partial(group.start_soon, poll_vllm_metrics, guard))
                for replica in guard.snapshot().replicas:
                    assert replica.server_waiting is not None, replica
                group.cancel_scope.cancel()

    with spawn_cluster("healthy", replicas=2) as urls:
        anyio.run(kernel, urls)


def test_the_poller_goes_on_when_a_notebook_cell_moves_the_guard_to_its_own_thread_and_back() -> None:
    """A sync call on the loop's own thread (a notebook cell) moves the Guard to its own thread while it runs; the
    poller, a task of that loop, takes the Guard back at its next round instead of polling over connections of
    another loop (before: the poller's task died, leaving a socket unclosed)."""

    async def cells(aclient: Any, client: Any, start_poller: Callable[[], None]) -> None:
        start_poller()
        for _ in range(3):
            assert (await aclient.chat.completions.create(**ASK)).choices
            assert client.chat.completions.create(**ASK).choices  # blocks this loop while it runs
            await anyio.sleep(0.3)  # a few of the poller's rounds

    run_notebook(cells)


def test_a_round_the_notebook_cell_moved_the_guard_away_from_sends_nothing_on_the_other_loops_connections() -> None:
    """The poller's round began on the loop that owns the Guard; before its requests left, a sync cell on that
    loop's thread moved the Guard to its own thread, whose call left a connection in the pools. The round sends
    nothing (before: it used that connection from the wrong loop and its task died with ``RuntimeError: ... bound
    to a different event loop``, or opened connections in the other loop's pools, left unclosed)."""

    async def cells(aclient: Any, client: Any, start_poller: Callable[[], None]) -> None:
        assert (await aclient.chat.completions.create(**ASK)).choices  # this loop owns the Guard
        start_poller()
        await anyio.lowlevel.checkpoint()  # the poller's round begins: its requests are tasks not yet run
        assert client.chat.completions.create(**ASK).choices  # the cell moves the Guard to its thread
        await anyio.sleep(0.3)  # that round ends, the next one takes the Guard back and polls

    run_notebook(cells)


async def test_async_code_is_sent_to_the_coroutine() -> None:
    async with Guard(["http://a:1"], instrumentation=None) as guard:
        with pytest.raises(GuardConfigError, match=r"for sync code; in async code run poll_vllm_metrics"):
            with vllm_metrics_polled(guard):
                pass


def test_each_interval_between_polls_is_drawn_within_ten_percent_so_pollers_drift_apart() -> None:
    metrics = Metrics()

    async def main() -> None:  # in virtual time
        async with Guard(["http://a:1"], transport_factory=metrics.factory, instrumentation=None) as guard:
            with anyio.move_on_after(2.0):
                await poll_vllm_metrics(guard)

    run_virtual(main)
    gaps = [b - a for a, b in zip(metrics.times, metrics.times[1:], strict=False)]
    assert len(gaps) >= 17 and all(0.09 - 1e-9 <= gap <= 0.11 + 1e-9 for gap in gaps)
    assert max(gaps) - min(gaps) > 0.005  # not one period: 19 draws within 0.005 of each other are next to impossible


@BACKENDS
@pytest.mark.parametrize("offset", [None, 500.0])
def test_hints_are_stamped_on_the_guards_clock(backend: str, offset: float | None) -> None:
    """The router reads hints against the Guard's clock (the loop's, or an injected one): a hint is
    believed right after the poll and stale three polling intervals later, in virtual time too."""
    metrics = Metrics()
    metrics.bodies = {"http://a:1": (200, "vllm:num_requests_waiting 4\n"), "http://b:1": (200, "")}

    async def main() -> None:
        kwargs: dict[str, Any] = {} if offset is None else {"clock": lambda: loop_clock() + offset}
        guard = Guard(["http://a:1", "http://b:1"], transport_factory=metrics.factory, instrumentation=None, **kwargs)
        async with guard:
            rs = guard._replica_set
            a, b = rs.states
            b.in_flight = 3  # 4 queued at a's server weigh more than the guard's own 3 at b
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(functools.partial(poll_vllm_metrics, guard, every=0.5, request_timeout=0.1))
                    await anyio.sleep(0.2)
                    assert rs.pick(guard._clock()) is b  # the hint steers
                    assert [r.server_waiting for r in guard.snapshot().replicas] == [4.0, None]
                    tg.cancel_scope.cancel()  # the last poll was at 0 s: believed until 1.5 s
                await anyio.sleep(1.31)
                assert rs.pick(guard._clock()) is a  # stale: only what the guard sees counts
                assert [r.server_waiting for r in guard.snapshot().replicas] == [None, None]
            finally:
                b.in_flight = 0

    run_virtual(main, backend)


class SlowMetrics(Metrics):
    """`Metrics` whose answers take ``delay`` seconds (virtual time); notes when each request came and was answered."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.answered: list[float] = []
        self.waiting: anyio.Event | None = None
        """Set by the next request to come (a poll then in flight), once a test asks for it."""

    def factory(self, replica: Replica) -> httpx.AsyncBaseTransport:
        answer = super().factory(replica)

        async def handle(request: httpx.Request) -> httpx.Response:
            response = await answer.handle_async_request(request)  # counted and stamped as it comes
            if self.waiting is not None:
                self.waiting.set()
            await anyio.sleep(self.delay)
            self.answered.append(anyio.current_time())
            return response

        return httpx.MockTransport(handle)


@BACKENDS
def test_the_poller_returns_as_the_guard_closes_and_sends_nothing_after(backend: str) -> None:
    """``await guard.aclose()`` ends a running poller: the coroutine returns (the task group it runs in ends
    without being cancelled), the poll in flight is cancelled, and no request leaves after the close began
    (before: it polled on, at its full rate, over the closed Guard's pools, until the caller cancelled it)."""
    metrics = SlowMetrics(delay=0.05)

    async def main() -> None:
        guard = Guard(["http://a:1", "http://b:1"], transport_factory=metrics.factory, instrumentation=None)
        returned: list[float] = []

        async def poller() -> None:
            await poll_vllm_metrics(guard)
            returned.append(anyio.current_time())

        with anyio.fail_after(5):  # the group ends only once the poller has returned on its own
            async with anyio.create_task_group() as tg:
                tg.start_soon(poller)
                await anyio.sleep(0.3)  # a few rounds, 0.1 s apart within a random 10 %
                metrics.waiting = anyio.Event()
                await metrics.waiting.wait()  # the next round's requests came: its answers are due in 0.05 s
                assert max(metrics.times) > max(metrics.answered)  # a poll is in flight
                closing = anyio.current_time()
                await guard.aclose()
                closed = anyio.current_time()
        sent = len(metrics.times)
        await anyio.sleep(1.0)  # ten intervals
        assert len(metrics.times) == sent and max(metrics.times) <= closing  # nothing sent after the close began
        assert all(t < closing + 1e-9 for t in metrics.answered)  # the poll in flight was cancelled, not answered
        assert returned and closing <= returned[0] <= closed + 1e-9  # returned within the close, not later

    run_virtual(main, backend)


@BACKENDS
def test_a_closed_guard_is_not_polled(backend: str) -> None:
    """On a closed Guard the poller returns at once, sending nothing, and `poll_once` raises `GuardClosed`; so
    does a `poll_once` whose Guard closes while it polls (its polls cancelled)."""
    metrics = SlowMetrics(delay=0.5)

    async def main() -> None:
        guard = Guard(["http://a:1"], transport_factory=metrics.factory, instrumentation=None)
        result: list[dict[str, ServerLoad | None] | BaseException] = []

        async def one_round() -> None:
            try:
                result.append(await poll_once(guard))
            except GuardClosed as exc:
                result.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one_round)
            await anyio.sleep(0.1)  # its request is in flight
            await guard.aclose()
        assert len(result) == 1 and isinstance(result[0], GuardClosed), result
        assert "closed" in str(result[0]) and metrics.answered == []
        sent = len(metrics.times)
        started = anyio.current_time()
        with anyio.fail_after(1):
            await poll_vllm_metrics(guard)
        assert anyio.current_time() == started  # at once: no round, no sleep
        with pytest.raises(GuardClosed, match="closed"):
            await poll_once(guard)
        assert len(metrics.times) == sent == 1

    run_virtual(main, backend)


def test_the_poller_ends_when_no_replica_serves_metrics() -> None:
    metrics = Metrics()
    metrics.bodies = {"http://a:1": (404, "")}

    async def main() -> None:  # in virtual time
        async with Guard(["http://a:1"], transport_factory=metrics.factory, instrumentation=None) as guard:
            with anyio.fail_after(2):
                await poll_vllm_metrics(guard, every=0.5)
            assert metrics.polls == {"http://a:1": 1}

    run_virtual(main)


async def test_polling_the_simulated_cluster_over_http() -> None:
    async with SimCluster(one_off(replicas=2)) as cluster:
        async with Guard([u + "/v1" for u in cluster.urls], instrumentation=None) as guard:
            hints = await poll_once(guard)
    assert list(hints.values()) == [ServerLoad(0.0, 0.0), ServerLoad(0.0, 0.0)]
