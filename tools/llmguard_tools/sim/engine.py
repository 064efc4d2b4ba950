"""The reference simulation's inference engine as a pure, deterministic, step-driven model (no I/O, no clock).

One `Engine.step` is one scheduler iteration of ``config.step_s`` seconds (times ``step_time_factor`` for a
slow replica; the driver owns the clock and passes ``now``):

1. decode first: every running, prefilled, unpaused request gets one token (1 budget unit each, ``tbud``
   units per step);
2. then chunked prefill with the remaining budget, at most ``prefill_chunk`` tokens per request per step:
   first the running requests still prefilling, then the waiting queue in FIFO order (the head waits until
   its first chunk fits in the free KV: head-of-line blocking, no skipping).

KV is allocated as tokens are computed (one slot per prefilled or decoded token, like vLLM v1). When a running
request's token or chunk does not fit, the most recently scheduled running request is preempted: its KV is
dropped and it goes back to the head of the waiting queue, to re-prefill its prompt plus the tokens it had
generated later (``recompute_tokens`` counts that redone work; ``prefill_tokens`` includes it).

With ``prefix_cache_tokens`` > 0 the engine keeps a `PrefixCache`: an admitted request's leading cached blocks
(``EngineRequest.block_hashes``) are skipped by prefill (they take KV when it is scheduled, but no budget), and
its prompt's blocks are cached once its prefill is done; ``prefix_cache.counters`` count queried and hit tokens.

Admission (`llmguard_tools.sim.admission`) happens in `Engine.submit`; every reservation and every KV token
is released on every way out: finish, `Engine.abort` (disconnect, error) or preemption (KV only). The types
the engine works on live in `llmguard_tools.sim.engine_types` and are re-exported here.
"""

from __future__ import annotations

import math
import random
from collections import deque

from llmguard_tools.sim.admission import Admitter, retry_after_seconds
from llmguard_tools.sim.engine_types import (
    EngineConfig,
    EngineRequest,
    EngineStats,
    Rates,
    Rejected,
    RequestTooLarge,
    SeqState,
    Sequence,
)
from llmguard_tools.sim.prefix_cache import PrefixCache

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineRequest",
    "EngineStats",
    "Rejected",
    "RequestTooLarge",
    "SeqState",
    "Sequence",
]


class Engine:
    """The step-driven engine of one replica. Deterministic given ``config``, ``rng`` and the call sequence."""

    def __init__(self, config: EngineConfig, rng: random.Random) -> None:
        self.config = config
        self._rng = rng
        self._admitter = Admitter(
            config.policy,
            kv_tokens=config.kv_tokens,
            headroom=config.headroom,
            out_reserve=config.out_reserve,
            concurrency_limit=config.concurrency_limit,
        )
        self._running: list[Sequence] = []
        self._waiting: deque[Sequence] = deque()
        self._kv_used = 0
        self._next_id = 0
        self._t0: float | None = None
        self._next_sample = 0.0
        self._watermark = int(config.kv_tokens * config.kv_watermark)
        self.stats = EngineStats()
        self.prefix_cache = PrefixCache(config.prefix_cache_tokens, config.cache_block_tokens)
        self._rates = Rates(
            work_per_s=config.tbud / config.step_period,
            avg_cost=float(config.out_reserve),
            history=deque(maxlen=config.history_len),
        )

    # -- observation -------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Requests holding a running slot (prefilling, decoding or paused)."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Requests in the waiting queue (never scheduled yet, or preempted)."""
        return len(self._waiting)

    @property
    def kv_used(self) -> int:
        """KV tokens allocated to running requests."""
        return self._kv_used

    @property
    def reserved(self) -> int:
        """KV tokens reserved by the ``token`` admission ledger."""
        return self._admitter.reserved

    @property
    def idle(self) -> bool:
        """Nothing to schedule: no running and no waiting request."""
        return not self._running and not self._waiting

    @property
    def work_rate(self) -> float:
        """Measured work tokens per second (EWMA over ``rate_tau_s``)."""
        return self._rates.work_per_s

    @property
    def history(self) -> list[list[float]]:
        """Samples ``[t, running, waiting, kv_used]`` every ``history_every_s`` of engine time."""
        return list(self._rates.history)

    def reset_stats(self) -> None:
        """Zero the counters and the history, whose clock restarts at the next step, and empty the prefix cache
        (so that a bench's next client starts cold); in-flight requests stay."""
        self.stats = EngineStats()
        self.prefix_cache.clear()
        self._rates.history.clear()
        self._t0 = None
        self._next_sample = 0.0

    # -- requests ----------------------------------------------------------------------------------

    def submit(self, request: EngineRequest, now: float) -> Sequence:
        """Admit a request into the waiting queue, or raise `Rejected` / `RequestTooLarge`."""
        cfg = self.config
        if request.prompt_tokens < 1 or request.max_tokens < 1:
            raise RequestTooLarge("prompt_tokens and max_tokens must be >= 1")
        if request.prompt_tokens + request.max_tokens > cfg.model_len:
            raise RequestTooLarge(
                f"prompt ({request.prompt_tokens}) + max_tokens ({request.max_tokens}) exceeds the model "
                f"length {cfg.model_len}"
            )
        self.stats.submitted += 1
        in_system = len(self._running) + len(self._waiting)
        cost = self._admitter.cost(request.prompt_tokens, request.max_tokens)
        self._rates.avg_cost += 0.05 * (cost - self._rates.avg_cost)
        reservation = self._admitter.try_acquire(request.prompt_tokens, request.max_tokens, in_system)
        if reservation is None:
            self.stats.rejected += 1
            delay = self._retry_after(request, in_system)
            self._rates.reject_pressure += cost
            raise Rejected(cfg.policy, delay)
        output = request.output_tokens
        if output is None:
            output = cfg.output_lengths.sample(self._rng)
        seq = Sequence(
            id=self._next_id,
            prompt_tokens=request.prompt_tokens,
            max_tokens=request.max_tokens,
            output_tokens=max(1, min(output, request.max_tokens)),
            arrival=now,
            reservation=reservation,
            expected_output=min(request.max_tokens, cfg.out_reserve),
            prefill_target=request.prompt_tokens,
        )
        if self.prefix_cache.enabled:
            seq.cached = self.prefix_cache.lookup(request.block_hashes, request.prompt_tokens)
            seq.block_hashes = request.block_hashes
        self._next_id += 1
        self.stats.admitted += 1
        self._waiting.append(seq)
        return seq

    def _retry_after(self, request: EngineRequest, in_system: int) -> float:
        """Backlog / measured work rate, as in the reference; the backlog is the expected work still queued, the
        admitted work that must drain before this request fits, and the demand rejected over the last
        ``rate_tau_s`` (so that a crowd of rejected clients is told to come back spread out, not at once)."""
        waiting_work = sum(seq.expected_remaining for seq in self._waiting)
        deficit = self._admitter.deficit_tokens(
            request.prompt_tokens, request.max_tokens, in_system, self._rates.avg_cost
        )
        backlog = waiting_work + deficit + self._rates.reject_pressure
        cfg = self.config
        return retry_after_seconds(backlog, self._rates.work_per_s, cfg.retry_after_min_s, cfg.retry_after_max_s)

    def pause(self, seq: Sequence, until: float) -> None:
        """Stall a request until ``until``: it keeps its slot (reservation, KV) but is not scheduled."""
        seq.paused_until = max(seq.paused_until, until)

    def stall_after(self, seq: Sequence, tokens: int, seconds: float) -> None:
        """Stall a request for ``seconds`` right after it has generated ``tokens`` tokens."""
        seq.stall_after = tokens
        seq.stall_s = seconds

    def abort(self, seq: Sequence, *, by_disconnect: bool = False) -> bool:
        """Remove a request (client gone, error); release its KV and reservation. False if already done."""
        if seq.done:
            return False
        if seq.state is SeqState.RUNNING:
            self._running.remove(seq)
        else:
            self._waiting.remove(seq)
        self._release(seq, SeqState.ABORTED)
        if by_disconnect:
            self.stats.aborted_by_disconnect += 1
            self.stats.aborted_work_tokens += seq.work
        else:
            self.stats.aborted_other += 1
        return True

    # -- scheduling --------------------------------------------------------------------------------

    def step(self, now: float) -> list[Sequence]:
        """Run one scheduler iteration at time ``now``; return the requests that made progress or finished."""
        progressed: list[Sequence] = []
        budget = self._decode(now, self.config.tbud, progressed)
        budget = self._prefill(now, budget)
        work = self.config.tbud - budget
        self._account(now, work)
        return progressed

    def _decode(self, now: float, budget: int, progressed: list[Sequence]) -> int:
        running = self._running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            if seq.prefilled < seq.prefill_target or seq.paused_until > now:
                i += 1
                continue
            if self.config.kv_tokens - self._kv_used < 1 and not self._make_room(seq, 1):
                break  # seq itself was the last running request and got preempted
            budget -= 1
            seq.generated += 1
            seq.kv += 1
            seq.work += 1
            self._kv_used += 1
            self.stats.decode_tokens += 1
            if seq.first_token_at is None:
                seq.first_token_at = now
            progressed.append(seq)
            if seq.generated >= seq.output_tokens:
                running.pop(i)
                seq.finish_reason = "length" if seq.output_tokens >= seq.max_tokens else "stop"
                seq.finished_at = now
                self.stats.completed += 1
                self._release(seq, SeqState.FINISHED)
                continue
            if seq.generated == seq.stall_after:
                seq.paused_until = now + seq.stall_s
            i += 1
        return budget

    def _make_room(self, seq: Sequence, tokens: int) -> bool:
        """Preempt from the tail of the running list until ``tokens`` KV slots are free; False if seq was."""
        while self.config.kv_tokens - self._kv_used < tokens:
            victim = self._running.pop()
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        decoding = seq.prefilled >= seq.prefill_target
        seq.computed = max(seq.computed, seq.prompt_tokens + seq.generated if decoding else seq.prefilled)
        self._kv_used -= seq.kv
        seq.kv = 0
        seq.prefilled = 0
        seq.prefill_target = seq.prompt_tokens + seq.generated
        seq.state = SeqState.WAITING
        seq.preemptions += 1
        self.stats.preemptions += 1
        self._waiting.appendleft(seq)

    def _prefill(self, now: float, budget: int) -> int:
        running = self._running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            i += 1
            if seq.prefilled >= seq.prefill_target or seq.paused_until > now:
                continue
            chunk = min(seq.prefill_target - seq.prefilled, self.config.prefill_chunk, budget)
            if self.config.kv_tokens - self._kv_used < chunk and not self._make_room(seq, chunk):
                break  # seq was the tail of the running list and got preempted
            budget -= self._prefill_chunk(seq, chunk)
        return self._schedule_waiting(now, budget)

    def _schedule_waiting(self, now: float, budget: int) -> int:
        cfg = self.config
        waiting = self._waiting
        while waiting and budget > 0 and len(self._running) < cfg.max_running:
            seq = waiting[0]
            paused = seq.paused_until > now
            skip = seq.cached  # waiting requests have nothing prefilled: the cached head is free of budget
            chunk = 0 if paused else min(seq.prefill_target - skip, cfg.prefill_chunk, budget)
            need = max(skip + chunk, 1)
            if cfg.kv_tokens - self._kv_used - need < (self._watermark if self._running else 0):
                break  # FIFO: the head waits until its first chunk fits
            waiting.popleft()
            seq.state = SeqState.RUNNING
            self._running.append(seq)
            if skip:
                seq.prefilled = seq.kv = skip
                self._kv_used += skip
            if chunk:
                budget -= self._prefill_chunk(seq, chunk)
        return budget

    def _prefill_chunk(self, seq: Sequence, chunk: int) -> int:
        """Prefill ``chunk`` tokens of ``seq``, allocating their KV; return the budget used."""
        recompute = max(0, min(seq.prefilled + chunk, seq.computed) - seq.prefilled)
        seq.prefilled += chunk
        seq.kv += chunk
        self._kv_used += chunk
        seq.work += chunk
        self.stats.prefill_tokens += chunk
        self.stats.recompute_tokens += recompute
        if seq.block_hashes and seq.prefilled >= seq.prompt_tokens:
            self.prefix_cache.insert(seq.block_hashes)
            seq.block_hashes = ()
        return chunk

    def _release(self, seq: Sequence, state: SeqState) -> None:
        self._kv_used -= seq.kv
        seq.kv = 0
        self._admitter.release(seq.reservation)
        seq.reservation = 0
        seq.state = state

    def _account(self, now: float, work: int) -> None:
        cfg = self.config
        self.stats.steps += 1
        alpha = min(1.0, cfg.step_period / cfg.rate_tau_s)
        rates = self._rates
        rates.work_per_s += alpha * (work / cfg.step_period - rates.work_per_s)
        rates.reject_pressure *= 1.0 - alpha
        self.sample(now)

    def sample(self, now: float) -> None:
        """Append a history sample if one is due (the driver may call it while the engine is idle)."""
        if self._t0 is None:
            self._t0 = now
        elapsed = now - self._t0
        if elapsed < self._next_sample:
            return
        self._rates.history.append([round(elapsed, 3), len(self._running), len(self._waiting), self._kv_used])
        every = self.config.history_every_s
        self._next_sample = (math.floor(elapsed / every) + 1) * every
