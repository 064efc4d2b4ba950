"""The calls waiting for a cool-down's change are woken together when it comes, or look again when their own wait
ends; in virtual time on asyncio and trio."""

from __future__ import annotations

import anyio

from llmguard_client._routing.wakeup import Wakeup
from tests.virtual import BACKENDS, now, run_virtual


@BACKENDS
def test_notify_wakes_every_call_waiting_and_a_wait_ends_after_its_seconds_otherwise(backend: str) -> None:
    woken: list[tuple[str, float]] = []

    async def main() -> None:
        wakeup = Wakeup()
        start = now()

        async def waiter(name: str, seconds: float) -> None:
            await wakeup.wait(seconds)
            woken.append((name, round(now() - start, 6)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter, "a", 5.0)
            tg.start_soon(waiter, "b", 5.0)
            tg.start_soon(waiter, "short", 0.5)
            await anyio.sleep(1.0)
            wakeup.notify()
            await anyio.sleep(1.0)
            tg.start_soon(waiter, "later", 3.0)  # a wait begun after the notify is not woken by it
        with anyio.move_on_after(1.0) as cancelled:  # a wait cancelled leaves nothing behind for the next notify
            await wakeup.wait(5.0)
        assert cancelled.cancelled_caught
        wakeup.notify()

    run_virtual(main, backend)
    assert sorted(woken) == [("a", 1.0), ("b", 1.0), ("later", 5.0), ("short", 0.5)]
