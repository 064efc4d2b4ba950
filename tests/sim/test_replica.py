"""`Replica.run`, the engine's real-time step loop, in virtual time."""

from __future__ import annotations

import dataclasses

import trio
import trio.testing

from llmguard_tools.sim.engine import EngineRequest
from llmguard_tools.sim.replica import MAX_CATCH_UP_STEPS, Replica
from tests.sim.conftest import ENGINE


def test_a_loop_that_fell_behind_runs_at_most_the_catch_up_steps_and_counts_the_rest_missed() -> None:
    engine = dataclasses.replace(ENGINE, step_s=1 / 64)  # binary-exact step instants
    clock = trio.testing.MockClock()  # time moves only when the test jumps it

    async def main() -> None:
        replica = Replica(0, engine)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(replica.run)
            replica.submit(EngineRequest(prompt_tokens=8, max_tokens=400, output_tokens=400))
            await trio.testing.wait_all_tasks_blocked()  # stepped once at 0, now sleeping until 1/64 s
            assert (replica.engine.stats.steps, replica.counters.missed_steps) == (1, 0)
            clock.jump(200 / 64)  # the event loop was blocked for 200 steps
            await trio.testing.wait_all_tasks_blocked()
            # Steps due at 1/64 ... 200/64: 50 run back to back, the other 150 skipped and counted.
            assert replica.engine.stats.steps == 1 + MAX_CATCH_UP_STEPS
            assert replica.counters.missed_steps == 200 - MAX_CATCH_UP_STEPS
            clock.jump(1 / 64)  # back on schedule: the next step runs on time
            await trio.testing.wait_all_tasks_blocked()
            assert (replica.engine.stats.steps, replica.counters.missed_steps) == (2 + MAX_CATCH_UP_STEPS, 150)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)
