"""The fleet store's timeouts count the time its event loop ran: a loop stopped between two runs (kept for the
process, run once per invocation) or a frozen process does not make an answer late; a running loop gives up on
time."""

from __future__ import annotations

import asyncio

import looptime
import pytest

from llmguard_client._fleet.deadline import STEP, RunningDeadline
from tests.fleet.kept_loop import KeptLoop


def test_on_a_running_loop_it_expires_after_its_seconds() -> None:
    loop = looptime.new_event_loop(start=1000.0)  # virtual time: each check comes exactly when due

    async def never_answered() -> float:
        started = loop.time()
        with pytest.raises(TimeoutError), RunningDeadline(1.0):
            await asyncio.sleep(30)
        return loop.time() - started

    try:
        assert loop.run_until_complete(never_answered()) == pytest.approx(1.0)
    finally:
        loop.close()


def test_an_answer_within_the_deadline_is_timed() -> None:
    loop = looptime.new_event_loop(start=1000.0)

    async def answered() -> float:
        with RunningDeadline(1.0) as deadline:
            await asyncio.sleep(0.35)
        return deadline.elapsed

    try:
        assert loop.run_until_complete(answered()) == pytest.approx(0.35)
    finally:
        loop.close()


def test_the_time_its_loop_was_stopped_is_not_counted() -> None:
    """The wait started as one run ended, the loop was stopped for 30 s, and its answer comes as the next run
    starts (a second round trip of the operation): it is waited for, not timed out (``anyio.fail_after(1.0)``
    raised TimeoutError there)."""
    loop = KeptLoop()
    answer: asyncio.Future[str] = loop.create_future()
    waiting = asyncio.Event()

    async def wait_for_the_answer() -> tuple[str, float]:
        with RunningDeadline(1.0) as deadline:
            waiting.set()
            result = await answer
        return result, deadline.elapsed

    try:
        task = loop.create_task(wait_for_the_answer())
        loop.run_until_complete(waiting.wait())  # the run ends with the wait under way
        loop.stopped_for(30.0)
        loop.call_later(0.01, answer.set_result, "answered")
        result, elapsed = loop.run_until_complete(task)
        assert result == "answered"
        assert elapsed < 1.0
    finally:
        loop.close()


def test_after_a_stop_a_wait_that_gets_no_answer_still_runs_out() -> None:
    """The stop is forgiven, not the wait: a Redis that never answers is given up on once the loop has run the
    deadline's time again (at most one step of what ran before the stop is forgiven with it)."""
    loop = KeptLoop()
    waiting = asyncio.Event()

    async def wait_for_ever() -> None:
        with RunningDeadline(0.3):
            waiting.set()
            await asyncio.Event().wait()

    try:
        task = loop.create_task(wait_for_ever())
        loop.run_until_complete(waiting.wait())
        loop.stopped_for(30.0)
        resumed = loop.time()
        with pytest.raises(TimeoutError):
            loop.run_until_complete(task)
        assert loop.time() - resumed >= 0.3 - STEP  # a bound, not a timing: it ran at least that long again
    finally:
        loop.close()
