"""One simulated replica: an `Engine` stepped in real time, per-request progress signals, faults, stats."""

from __future__ import annotations

import dataclasses
import itertools
import random
from dataclasses import dataclass
from typing import Any

import anyio

from llmguard_tools.sim.engine import Engine, EngineConfig, EngineRequest, Sequence
from llmguard_tools.sim.faults import FaultConfig, FaultPlan, draw_faults

__all__ = ["Replica", "ReplicaCounters"]

MAX_CATCH_UP_STEPS = 50
"""Steps run back to back when the loop falls behind; further behind than this, steps are skipped."""


@dataclass(slots=True)
class ReplicaCounters:
    """HTTP-level counters of one replica (the engine keeps its own in `EngineStats`)."""

    received: int = 0
    bad_requests: int = 0
    stalled_first: int = 0
    stalled_mid: int = 0
    resets: int = 0
    malformed: int = 0
    html_500: int = 0
    blackholed: int = 0
    missed_steps: int = 0
    overload_in_stream: int = 0
    """Admission rejections answered as an error inside a 200 stream (``overload_signal="in_stream"``)."""
    error_first: int = 0
    error_mid: int = 0
    truncated: int = 0
    rate_limited: int = 0
    """Requests refused with a 429 inside ``faults.rate_limited_between``."""
    neighbour_requests: int = 0
    """Requests of ``faults.neighbour``'s bursts submitted to the engine (not received over HTTP)."""
    metrics_requests: int = 0
    """``GET /metrics`` answered (a client's server hints), not counted in ``received``."""


class Replica:
    """An engine plus the real-time loop that steps it every ``step_s * slow_factor`` seconds.

    `run` must be running (in a task) for requests to make progress. When the engine is idle the loop sleeps
    until `submit` wakes it, so an idle replica costs (almost) no CPU.
    """

    def __init__(
        self,
        index: int,
        engine_config: EngineConfig,
        faults: FaultConfig | None = None,
        *,
        seed: int = 0,
        model: str = "sim-model",
    ) -> None:
        self.index = index
        self.faults = faults or FaultConfig()
        self.model = model
        # A slowdown limited to a window is applied per step by `run`; an unlimited one is the engine's own.
        factor = self.faults.slow_factor if self.faults.slow_between is None else 1.0
        config = dataclasses.replace(engine_config, step_time_factor=factor)
        self.engine = Engine(config, random.Random(f"{seed}:{index}:engine"))
        self._started: float | None = None
        self.counters = ReplicaCounters()
        self._fault_rng = random.Random(f"{seed}:{index}:faults")
        self._waiters: dict[int, anyio.Event] = {}
        self._kick = anyio.Event()

    # -- requests ----------------------------------------------------------------------------------

    def draw_faults(self) -> FaultPlan:
        """The faults of the next request."""
        return draw_faults(self.faults, self._fault_rng)

    def submit(self, request: EngineRequest) -> Sequence:
        """Submit to the engine (may raise `Rejected` / `RequestTooLarge`) and wake the step loop."""
        seq = self.engine.submit(request, anyio.current_time())
        self._kick.set()
        return seq

    def slow_now(self) -> bool:
        """Whether the replica's slowdown applies now (always, unless ``faults.slow_between`` limits it)."""
        started = self._started if self._started is not None else anyio.current_time()
        return self.faults.slow_at(anyio.current_time() - started)

    def rate_limited_now(self) -> bool:
        """Whether the replica refuses every request now (``faults.rate_limited_between``)."""
        if self.faults.rate_limited_between is None:
            return False
        started = self._started if self._started is not None else anyio.current_time()
        return self.faults.rate_limited_at(anyio.current_time() - started)

    def _step_period(self, at: float) -> float:
        period = self.engine.config.step_period
        faults = self.faults
        if faults.slow_between is not None and self._started is not None and faults.slow_at(at - self._started):
            period *= faults.slow_factor
        return period

    def stall(self, seq: Sequence, seconds: float) -> None:
        """Hold ``seq`` for ``seconds`` from now; it keeps its slot."""
        self.engine.pause(seq, anyio.current_time() + seconds)

    async def wait_progress(self, seq: Sequence, seen: int) -> None:
        """Return once ``seq`` has more than ``seen`` tokens or is done."""
        while seq.generated <= seen and not seq.done:
            event = self._waiters.get(seq.id)
            if event is None:
                event = self._waiters[seq.id] = anyio.Event()
            await event.wait()

    def abort(self, seq: Sequence, *, by_disconnect: bool) -> None:
        """Abort ``seq`` now (no-op if it is done), releasing its reservation and KV."""
        self.engine.abort(seq, by_disconnect=by_disconnect)
        event = self._waiters.pop(seq.id, None)
        if event is not None:
            event.set()

    # -- the step loop -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Step the engine in real time, drift-corrected, until cancelled."""
        engine = self.engine
        next_t = self._started = anyio.current_time()
        while True:
            if engine.idle:
                self._kick = anyio.Event()
                with anyio.move_on_after(engine.config.history_every_s):
                    await self._kick.wait()
                next_t = anyio.current_time()
                engine.sample(next_t)
                continue
            now = anyio.current_time()
            if next_t > now:
                await anyio.sleep(next_t - now)
                now = anyio.current_time()
            steps = 0
            period = self._step_period(next_t)
            while next_t <= now and steps < MAX_CATCH_UP_STEPS:
                self._wake(engine.step(next_t))
                next_t += period
                steps += 1
            if next_t <= now:
                skipped = int((now - next_t) / period) + 1
                self.counters.missed_steps += skipped
                next_t += skipped * period

    async def neighbour(self) -> None:
        """Submit ``faults.neighbour``'s bursts on time, until cancelled (returns at once without one)."""
        bursts = self.faults.neighbour
        if bursts is None:
            return
        started = anyio.current_time()
        for index in itertools.count():
            await anyio.sleep(max(0.0, started + bursts.burst_at(index) - anyio.current_time()))
            for _ in range(bursts.requests):
                self.submit(EngineRequest(bursts.prompt_tokens, bursts.output_tokens, bursts.output_tokens))
            self.counters.neighbour_requests += bursts.requests

    def _wake(self, progressed: list[Sequence]) -> None:
        waiters = self._waiters
        if not waiters:
            return
        for seq in progressed:
            event = waiters.pop(seq.id, None)
            if event is not None:
                event.set()

    # -- stats -------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The ``/sim/stats`` document."""
        engine, s, c = self.engine, self.engine.stats, self.counters
        return {
            "replica": self.index,
            "policy": engine.config.policy,
            "received": c.received,
            "admitted": s.admitted,
            "rejected": s.rejected,
            "completed": s.completed,
            "aborted_by_disconnect": s.aborted_by_disconnect,
            "aborted_other": s.aborted_other,
            "bad_requests": c.bad_requests,
            "work_tokens": s.work_tokens,
            "prefill_tokens": s.prefill_tokens,
            "decode_tokens": s.decode_tokens,
            "recompute_tokens": s.recompute_tokens,
            "aborted_work_tokens": s.aborted_work_tokens,
            "preemptions": s.preemptions,
            "running": engine.running,
            "waiting": engine.waiting,
            "kv_used": engine.kv_used,
            "kv_total": engine.config.kv_tokens,
            "reserved": engine.reserved,
            "prefix_cache_queries": engine.prefix_cache.counters.queries,
            "prefix_cache_hits": engine.prefix_cache.counters.hits,
            "steps": s.steps,
            "missed_steps": c.missed_steps,
            "metrics_requests": c.metrics_requests,
            "faults": {
                "stalled_first": c.stalled_first,
                "stalled_mid": c.stalled_mid,
                "resets": c.resets,
                "malformed": c.malformed,
                "html_500": c.html_500,
                "blackholed": c.blackholed,
                "overload_in_stream": c.overload_in_stream,
                "error_first": c.error_first,
                "error_mid": c.error_mid,
                "truncated": c.truncated,
                "rate_limited": c.rate_limited,
            },
            "neighbour_requests": c.neighbour_requests,
            "history": engine.history,
        }

    def reset_stats(self) -> None:
        """Zero the counters and the history and empty the prefix cache (in-flight requests are kept)."""
        self.engine.reset_stats()
        self.counters = ReplicaCounters()
