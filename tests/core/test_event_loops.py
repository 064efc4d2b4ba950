"""The event loop a call runs on: asyncio's loop as it is, a trio run as one object for as long as it runs, and a
task started on either from another thread."""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings
from concurrent.futures import CancelledError, Future

import pytest

from llmguard_client._core.event_loops import EventLoop, TrioRun, run_threadsafe, running_loop, start_soon
from tests.edges.conftest import eventually

trio = pytest.importorskip("trio")
trio_testing = pytest.importorskip("trio.testing")
trio_testing = pytest.importorskip("trio.testing")


def test_no_loop_outside_a_run_and_asyncios_own_inside_one() -> None:
    assert running_loop() is None

    async def main() -> None:
        assert running_loop() is asyncio.get_running_loop()

    asyncio.run(main())


def test_a_trio_run_is_one_object_while_it_runs_and_closed_once_it_ended() -> None:
    async def main() -> EventLoop | None:
        run = running_loop()
        assert run is not None and run is running_loop() and run.is_running() and not run.is_closed()
        await trio.sleep(5)
        assert run.time() == trio.current_time() == 5.0  # the run's clock
        return run

    first = trio.run(main, clock=trio_testing.MockClock(autojump_threshold=0))
    second = trio.run(main, clock=trio_testing.MockClock(autojump_threshold=0))
    assert isinstance(first, TrioRun) and isinstance(second, TrioRun) and first is not second
    assert first.is_closed() and not first.is_running()
    with pytest.raises(RuntimeError, match="ended"):
        first.call_soon_threadsafe(lambda: None)


def test_a_task_started_from_another_thread_runs_on_the_trio_run() -> None:
    """Its result and its exception reach the thread; a task still running as the run ends is cancelled; once
    the run has ended nothing more starts."""
    seen: dict[str, object] = {}

    async def on_the_run() -> object:
        return trio.lowlevel.current_trio_token()

    async def fails() -> None:
        raise ValueError("from the task")

    async def waits() -> None:
        await trio.sleep_forever()

    def from_a_thread(run: EventLoop) -> None:
        seen["token"] = run_threadsafe(on_the_run, run).result(10)
        with pytest.raises(ValueError, match="from the task"):
            run_threadsafe(fails, run).result(10)
        seen["waiting"] = run_threadsafe(waits, run)

    async def main() -> EventLoop:
        run = running_loop()
        assert run is not None
        await trio.to_thread.run_sync(from_a_thread, run)
        seen["own token"] = trio.lowlevel.current_trio_token()
        return run

    run = trio.run(main)
    assert seen["token"] is seen["own token"]
    waiting = seen["waiting"]
    assert isinstance(waiting, Future)
    with pytest.raises(CancelledError):
        waiting.result(10)
    with pytest.raises(RuntimeError):
        run_threadsafe(on_the_run, run)


def test_a_task_started_as_a_trio_run_ends_is_cancelled_without_crashing_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As a run ends, its system nursery takes no new task: the spawn, made in trio's own callback, raised there
    and trio ended the caller's run with a ``TrioInternalError``. The task's future is cancelled instead."""

    def closed(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Nursery is closed to new arrivals")

    async def never() -> None:
        raise AssertionError("not started")

    async def main() -> Future[None]:
        run = running_loop()
        assert run is not None
        monkeypatch.setattr(trio.lowlevel, "spawn_system_task", closed)
        started = await trio.to_thread.run_sync(run_threadsafe, never, run)
        await trio_testing.wait_all_tasks_blocked()  # the spawn callback has run
        return started

    started = trio.run(main)  # before: trio.TrioInternalError
    with pytest.raises(CancelledError):
        started.result(10)


def test_a_task_started_on_an_asyncio_loop_from_another_thread() -> None:
    async def on_the_loop() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        result: list[object] = []
        thread = threading.Thread(target=lambda: result.append(run_threadsafe(on_the_loop, loop).result(10)))
        thread.start()
        await asyncio.to_thread(thread.join, 10)
        assert result == [loop]

    asyncio.run(main())


def test_a_task_started_soon_on_a_stopped_loop_runs_when_the_loop_next_runs_and_is_never_made_if_it_does_not() -> None:
    """(A coroutine made for a loop that closes without running again would warn that it was never awaited.)"""
    ran: list[str] = []

    async def work() -> None:
        ran.append("ran")

    loop = asyncio.new_event_loop()
    try:
        start_soon(work, loop)  # stopped: nothing runs yet
        assert ran == []
        loop.run_until_complete(asyncio.sleep(0.01))
        assert ran == ["ran"]
        start_soon(work, loop)
    finally:
        loop.close()  # without running again: the second task was never made (no RuntimeWarning under -W error)
    assert ran == ["ran"]
    with pytest.raises(RuntimeError):
        start_soon(work, loop)


def test_a_call_dispatched_to_an_asyncio_loop_that_closes_first_leaves_no_coroutine_never_awaited() -> None:
    """Before: the coroutine was made at once, and collected unawaited with the loop (a RuntimeWarning)."""

    async def never() -> None:
        raise AssertionError("not started")

    loop = asyncio.new_event_loop()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started = run_threadsafe(never, loop)
        loop.close()  # before it ever ran
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
    assert not started.done()


def test_a_call_on_an_asyncio_loop_gives_its_future_its_outcome_and_is_cancelled_with_it() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:

        async def answer() -> int:
            return 42

        async def fails() -> None:
            raise ValueError("from the task")

        async def waits() -> None:
            await asyncio.sleep(3600)

        assert run_threadsafe(answer, loop).result(10) == 42
        with pytest.raises(ValueError, match="from the task"):
            run_threadsafe(fails, loop).result(10)
        waiting = run_threadsafe(waits, loop)
        assert eventually(lambda: len(asyncio.all_tasks(loop)) == 1)
        waiting.cancel()
        assert eventually(lambda: not asyncio.all_tasks(loop))
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
