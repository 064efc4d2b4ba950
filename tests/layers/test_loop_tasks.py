"""LoopTasks: hedges as asyncio loop tasks, kept structured by hand (started, cancelled, joined)."""

from __future__ import annotations

import asyncio

import anyio
import anyio.lowlevel
import pytest

from llmguard_client.layers.loop_tasks import LoopTasks


def _tasks(stopped: list[str] | None = None) -> LoopTasks:
    return LoopTasks(asyncio.get_running_loop(), lambda: (stopped if stopped is not None else []).append("stop"))


async def test_join_waits_for_every_task() -> None:
    tasks, done = _tasks(), []

    async def work(name: str, seconds: float) -> None:
        await anyio.sleep(seconds)
        done.append(name)

    tasks.start_soon(work, "slow", 0.05)
    tasks.start_soon(work, "fast", 0.0)
    await tasks.join()
    assert done == ["fast", "slow"]


async def test_cancel_ends_each_task_through_its_scope_and_join_waits_for_the_cleanup() -> None:
    tasks, events = _tasks(), []

    async def work() -> None:
        try:
            await anyio.sleep(10)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0.01)  # cleanup that takes a while
            events.append("cleaned up")

    tasks.start_soon(work)
    await anyio.lowlevel.checkpoint()
    tasks.cancel()
    await tasks.join()
    assert events == ["cleaned up"]


async def test_a_task_cancelled_before_it_ran_never_runs_its_body() -> None:
    tasks, ran = _tasks(), []

    async def work() -> None:
        await anyio.lowlevel.checkpoint()
        ran.append(True)

    tasks.start_soon(work)
    tasks.cancel()
    await tasks.join()
    assert ran == []


async def test_join_is_shielded_from_the_callers_cancellation() -> None:
    tasks, events = _tasks(), []

    async def work() -> None:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.05)
        events.append("finished")

    tasks.start_soon(work)
    with anyio.move_on_after(0.01):
        await tasks.join()  # the caller's deadline passes while it waits: it still waits for the task
    assert events == ["finished"]


async def test_an_error_stops_the_round_once_and_join_raises_it() -> None:
    stopped: list[str] = []
    tasks = _tasks(stopped)

    async def fail(message: str) -> None:
        raise LookupError(message)

    tasks.start_soon(fail, "first")
    tasks.start_soon(fail, "second")
    with pytest.raises(LookupError, match="first"):
        await tasks.join()
    assert stopped == ["stop"]
    await tasks.join()  # the error was handed over once; nothing left to wait for
