"""The time source, on both backends in virtual time: timers at their exact instants, a round's tasks
started, cancelled, aborted with the call's lease and joined; asyncio's loop tasks re-raise an error once."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import anyio.lowlevel
import httpx
import pytest
import trio
import trio.testing

from llmguard_client._core.clock import AsyncioTime, LoopTasks, current_time_source, loop_clock
from llmguard_client._core.lease import CallLease, LeaseRegistry
from tests.virtual import BACKENDS, FakeReplica, Plan, now, run_virtual, virtual_guard

if sys.version_info < (3, 11):
    from exceptiongroup import ExceptionGroup

T = TypeVar("T")


def _never() -> None:
    raise AssertionError("no task here ends with an error")


@BACKENDS
def test_timers_fire_at_their_exact_instants_and_a_cancelled_one_never(backend: str) -> None:
    fired: list[tuple[str, float]] = []

    async def main() -> None:
        time_source = current_time_source()
        start = now()
        async with time_source.tasks(CallLease(LeaseRegistry()), _never) as tasks:
            tasks.call_at(time_source.now() + 0.2, lambda: fired.append(("b", now() - start)))
            tasks.call_at(time_source.now() + 0.1, lambda: fired.append(("a", now() - start)))
            tasks.call_at(time_source.now() + 0.15, lambda: fired.append(("never", 0.0))).cancel()
            await anyio.sleep(0.3)

    run_virtual(main, backend)
    assert [name for name, _ in fired] == ["a", "b"]
    assert [at for _, at in fired] == [pytest.approx(0.1, abs=1e-9), pytest.approx(0.2, abs=1e-9)]


@BACKENDS
def test_the_exit_waits_for_every_task_even_when_the_caller_is_cancelled(backend: str) -> None:
    done: list[tuple[str, float]] = []

    async def main() -> None:
        start = now()

        async def work(name: str, seconds: float) -> None:
            with anyio.CancelScope(shield=True):
                await anyio.sleep(seconds)
            done.append((name, now() - start))

        with anyio.move_on_after(0.01):  # the caller's deadline passes first: the exit still waits
            async with current_time_source().tasks(CallLease(LeaseRegistry()), _never) as tasks:
                tasks.start_soon(work, "slow", 0.05)
                tasks.start_soon(work, "fast", 0.02)
        assert now() - start == pytest.approx(0.05, abs=1e-9)

    run_virtual(main, backend)
    assert [name for name, _ in done] == ["fast", "slow"]


@BACKENDS
def test_cancel_ends_each_task_and_one_cancelled_before_it_ran_never_runs(backend: str) -> None:
    events: list[str] = []

    async def main() -> None:
        async def sleeper() -> None:
            try:
                await anyio.sleep(10)
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(0.01)  # cleanup that takes a while: the exit waits for it
                events.append("cleaned up")

        async def late() -> None:
            await anyio.lowlevel.checkpoint()
            events.append("late ran")

        async with current_time_source().tasks(CallLease(LeaseRegistry()), _never) as tasks:
            tasks.start_soon(sleeper)
            await anyio.sleep(0.001)
            tasks.start_soon(late)
            tasks.cancel()

    run_virtual(main, backend)
    assert events == ["cleaned up"]


@BACKENDS
def test_the_leases_abort_cancels_a_task_at_once(backend: str) -> None:
    """``Guard.aclose()`` aborts each call's lease: a hedge's task ends then, whatever task runs the round."""
    ended: list[float] = []

    async def main() -> None:
        lease = CallLease(LeaseRegistry())
        start = now()

        async def hedge() -> None:
            try:
                await anyio.sleep(10)
            finally:
                ended.append(now() - start)

        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.sleep, 0.5)
            tg.start_soon(_abort_later, lease, 0.3)
            with anyio.CancelScope(shield=True):  # not the round's own cancellation: the lease's
                async with current_time_source().tasks(lease, _never) as tasks:
                    tasks.start_soon(hedge)
        await lease.aclose("error", "guard_closed")

    run_virtual(main, backend)
    assert ended == [pytest.approx(0.3, abs=1e-9)]


async def _abort_later(lease: CallLease, seconds: float) -> None:
    await anyio.sleep(seconds)
    lease.abort()


@BACKENDS
def test_an_injected_clock_maps_deadlines_onto_the_loops_time_line(backend: str) -> None:
    async def main() -> None:
        time_source = current_time_source(lambda: anyio.current_time() + 500.0)
        assert time_source.now() == pytest.approx(anyio.current_time() + 500.0)
        assert time_source.loop_deadline(time_source.now() + 2.0) == pytest.approx(anyio.current_time() + 2.0)
        start = now()
        await time_source.sleep_until(time_source.now() + 1.5)
        assert now() - start == pytest.approx(1.5, abs=1e-9)
        default = current_time_source()
        # The default clock is the loop's own on asyncio, trio's plus a fixed offset: no mapping per read.
        assert (default.now is default.loop_time) == (backend == "asyncio")
        assert default.loop_deadline(default.now() + 2.0) == pytest.approx(anyio.current_time() + 2.0)
        # Task-free timers (a stream's read watchdog) on asyncio only; trio's timers are sleeping tasks.
        assert (default.loop_timers() is not None) == (backend == "asyncio")

    run_virtual(main, backend)


async def test_asyncio_loop_tasks_stop_the_round_once_and_raise_the_first_error() -> None:
    stopped: list[str] = []
    time_source = current_time_source()
    assert isinstance(time_source, AsyncioTime)
    tasks = time_source.tasks(CallLease(LeaseRegistry()), lambda: stopped.append("stop"))
    assert isinstance(tasks, LoopTasks)

    async def fail(message: str) -> None:
        raise LookupError(message)

    with pytest.raises(LookupError, match="first"):
        async with tasks:
            tasks.start_soon(fail, "first")
            tasks.start_soon(fail, "second")
    assert stopped == ["stop"]
    await tasks.join()  # the error was handed over once; nothing left to wait for


def test_the_default_clock_works_outside_a_loop() -> None:
    """``Guard.snapshot()`` from sync code reads the default clock with no loop running."""
    assert isinstance(loop_clock(), float)


def _trio_run(main: Callable[[], Awaitable[T]], start: float) -> T:
    """``main()`` in a trio run whose (virtual) clock starts at ``start``, as each run's starts somewhere else."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    clock.jump(start)
    return trio.run(main, clock=clock)


def test_the_default_clock_is_one_time_line_across_trio_runs_and_asyncio() -> None:
    async def read() -> float:
        before = loop_clock()
        await trio.sleep(30.0)  # virtual: the clock advances at the run's rate
        assert loop_clock() - before == pytest.approx(30.0, abs=1e-6)
        return before

    first = _trio_run(read, 50_000.0)
    second = _trio_run(read, 0.0)
    third = asyncio.run(_read_asyncio())
    assert first <= second <= third  # one monotonic line, whatever each loop's clock said
    assert third - first < 30.0 + 60.0  # the time line is time.monotonic's: no run's offset on it


async def _read_asyncio() -> float:
    return loop_clock()


@pytest.mark.parametrize("first", ["trio", "asyncio"])
def test_a_cool_down_set_in_one_run_is_read_on_the_next_runs_time_line(first: str) -> None:
    # A module-level Guard used by one trio.run after another (or asyncio then trio): trio starts each run's clock
    # somewhere else, and the first run's cool-down must not be read as ending tens of thousands of seconds on.
    fake = FakeReplica("a", [Plan()])
    guard = virtual_guard({"http://a.test": fake}, [])

    async def call() -> int:
        async with httpx.AsyncClient(transport=guard.transport, base_url="http://a.test") as client:
            return (await client.post("/v1/chat/completions", json={"model": "m", "messages": []})).status_code

    async def cool() -> int:
        status = await call()
        guard._replica_set.cool_down(guard._replica_set.states[0], guard._clock(), 1.0)  # as a 429 does
        return status

    assert (_trio_run(cool, 50_000.0) if first == "trio" else asyncio.run(cool())) == 200
    assert _trio_run(call, 0.0) == 200  # the cool-down's second left, not ~50,000 s (or time.monotonic's)
    assert fake.requests == 2


def _raised_by(run: Callable[[], None]) -> BaseException | None:
    """What ``run()`` raised, whatever its type (a KeyboardInterrupt must not end the test session)."""
    try:
        run()
    except BaseException as exc:  # the test asserts on it
        return exc
    return None


_ERRORS: dict[str, Callable[[], BaseException]] = {
    "ctrl_c": KeyboardInterrupt,
    "exit": lambda: SystemExit(3),
    "callers_error": lambda: LookupError("the caller's"),
    "callers_group": lambda: ExceptionGroup("the caller's own group", [LookupError("inside")]),
}


@BACKENDS
@pytest.mark.parametrize("raised_in", ["task", "round"])
@pytest.mark.parametrize("kind", list(_ERRORS))
def test_an_error_leaves_a_rounds_tasks_as_it_was_raised_not_in_a_group(
    backend: str, raised_in: str, kind: str
) -> None:
    """Trio delivers Ctrl-C to any task, and a task group wraps what ends it in a group: the round's tasks
    hand the caller the error itself (``except KeyboardInterrupt`` matches), on either backend, from a
    hedge's task or the round's own; a group the caller raised stays that group (trio's cancel scopes copy a
    group as they take their cancellations out of it: the same type, message and exceptions)."""
    error = _ERRORS[kind]()
    context = LookupError("what it was raised while handling")

    async def main() -> None:
        async def raise_it() -> None:
            try:
                raise context
            except LookupError:
                raise error  # noqa: B904  # its context is part of what must come out unchanged

        async with current_time_source().tasks(CallLease(LeaseRegistry()), lambda: None) as tasks:
            try:
                tasks.start_soon(anyio.sleep, 10)  # another hedge, still waiting for its first token
                if raised_in == "task":
                    tasks.start_soon(raise_it)
                    await anyio.sleep(10)
                else:
                    await anyio.sleep(0.1)
                    await raise_it()
            finally:
                tasks.cancel()  # as the round's end does

    caught = _raised_by(lambda: run_virtual(main, backend))
    assert type(caught) is type(error) and caught.args == error.args, repr(caught)
    if isinstance(error, ExceptionGroup):
        assert isinstance(caught, ExceptionGroup) and caught.exceptions == error.exceptions
    else:
        assert caught is error
    assert caught.__context__ is context
