"""`Replica.run`, the engine's real-time step loop, and `Replica.neighbour`, in virtual time."""

from __future__ import annotations

import dataclasses

import trio
import trio.testing

from llmguard_tools.sim.engine import EngineRequest
from llmguard_tools.sim.faults import FaultConfig, NeighbourBursts
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


def test_a_neighbours_bursts_land_on_time_and_queue_ahead_of_later_requests() -> None:
    """Every ``every_s`` from ``offset_s``, the bursts join the engine (not through HTTP): a request that comes
    right after one waits behind it, one that comes once it has drained does not."""
    engine = dataclasses.replace(ENGINE, policy="none", step_s=1 / 64, tbud=128, kv_tokens=4096)
    bursts = NeighbourBursts(every_s=4.0, requests=32, prompt_tokens=256, output_tokens=16, offset_s=1.0)
    clock = trio.testing.MockClock(autojump_threshold=0)  # virtual time jumps to the next timer when all block

    async def first_token_after(replica: Replica) -> float:
        start = trio.current_time()
        seq = replica.submit(EngineRequest(prompt_tokens=60, max_tokens=20, output_tokens=20))
        await replica.wait_progress(seq, 0)
        return trio.current_time() - start

    async def main() -> None:
        replica = Replica(0, engine, FaultConfig(neighbour=bursts))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(replica.run)
            nursery.start_soon(replica.neighbour)
            quiet = await first_token_after(replica)  # at 0: before the first burst
            await trio.sleep_until(1.0 + 1 / 128)  # just after the burst at 1 s
            assert replica.counters.neighbour_requests == 32 and replica.engine.waiting > 0
            queued = await first_token_after(replica)
            await trio.sleep_until(4.5)  # drained long before the next burst, at 5 s
            assert replica.engine.waiting == 0
            drained = await first_token_after(replica)
            await trio.sleep_until(5.0 + 1 / 128)
            assert replica.counters.neighbour_requests == 64
            nursery.cancel_scope.cancel()
        assert quiet < 0.1 and drained < 0.1
        assert queued > 0.5  # behind 32 x 256 prompt tokens, at 128 tokens per step

    trio.run(main, clock=clock)
