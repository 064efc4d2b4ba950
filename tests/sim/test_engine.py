"""Unit tests of the step-driven engine: scheduling, KV, preemption, admission, release on every path."""

from __future__ import annotations

import random

import pytest

from llmguard_tools.sim.engine import Engine, EngineConfig, EngineRequest, Rejected, RequestTooLarge, SeqState


def make(**overrides: object) -> Engine:
    return Engine(EngineConfig(**overrides), random.Random(0))  # type: ignore[arg-type]


def run_until_idle(engine: Engine, start: float = 0.0, limit: int = 10_000) -> float:
    now = start
    for _ in range(limit):
        if engine.idle:
            return now
        engine.step(now)
        now += engine.config.step_period
    raise AssertionError("engine did not drain")


def test_chunked_prefill_then_decode_one_token_per_step() -> None:
    engine = make(tbud=2000, prefill_chunk=512)
    seq = engine.submit(EngineRequest(prompt_tokens=1000, max_tokens=3, output_tokens=3), 0.0)
    engine.step(0.00)
    assert (seq.prefilled, seq.generated, seq.kv) == (512, 0, 512)
    engine.step(0.01)
    assert (seq.prefilled, seq.generated) == (1000, 0)
    engine.step(0.02)
    assert seq.generated == 1 and seq.first_token_at == 0.02
    engine.step(0.03)
    engine.step(0.04)
    assert seq.state is SeqState.FINISHED and seq.finish_reason == "length"
    assert engine.kv_used == 0 and engine.stats.prefill_tokens == 1000 and engine.stats.decode_tokens == 3


def test_decode_first_takes_budget_before_prefill() -> None:
    engine = make(tbud=4)
    decoders = [engine.submit(EngineRequest(1, 10, 10), 0.0) for _ in range(3)]
    engine.step(0.0)  # prefill 3 x 1 token
    late = engine.submit(EngineRequest(100, 5, 5), 0.0)
    engine.step(0.01)  # decode 3 (3 units), 1 unit left for the new prompt
    assert [d.generated for d in decoders] == [1, 1, 1]
    assert late.prefilled == 1
    many = make(tbud=2)
    seqs = [many.submit(EngineRequest(1, 5, 5), 0.0) for _ in range(4)]
    many.step(0.0)
    many.step(0.01)
    many.step(0.02)
    assert sum(s.generated for s in seqs) <= 4  # at most tbud decode tokens per step


def test_preemption_recomputes_and_everything_drains() -> None:
    engine = make(tbud=400, kv_tokens=300)
    seqs = [engine.submit(EngineRequest(100, 150, 150), 0.0) for _ in range(3)]
    run_until_idle(engine)
    stats = engine.stats
    assert stats.preemptions > 0
    assert stats.recompute_tokens > 0
    assert stats.prefill_tokens == 3 * 100 + stats.recompute_tokens
    assert stats.work_tokens == stats.prefill_tokens + stats.decode_tokens
    assert all(s.state is SeqState.FINISHED and s.generated == 150 for s in seqs)
    assert engine.kv_used == 0 and engine.running == 0 and engine.waiting == 0


def test_recompute_counts_only_redone_tokens() -> None:
    engine = make(tbud=400, kv_tokens=260)
    first = engine.submit(EngineRequest(100, 100, 100), 0.0)
    second = engine.submit(EngineRequest(100, 100, 100), 0.0)
    run_until_idle(engine)
    redo = engine.stats.prefill_tokens - 200 - engine.stats.recompute_tokens
    # After a preemption the victim re-prefills prompt + generated tokens: all of it is recompute.
    assert redo == 0
    assert first.preemptions + second.preemptions == engine.stats.preemptions > 0


def test_token_admission_reserves_and_releases_on_finish_and_abort() -> None:
    engine = make(policy="token", kv_tokens=1000, headroom=0.5, out_reserve=100)
    a = engine.submit(EngineRequest(200, 500, 5), 0.0)
    assert engine.reserved == 300
    with pytest.raises(Rejected) as info:
        engine.submit(EngineRequest(201, 500), 0.0)
    assert info.value.reason == "token"
    assert engine.config.retry_after_min_s <= info.value.retry_after_s <= engine.config.retry_after_max_s
    b = engine.submit(EngineRequest(100, 50), 0.0)
    assert engine.reserved == 450
    assert engine.abort(b) is True and engine.abort(b) is False
    assert engine.reserved == 300
    run_until_idle(engine)
    assert a.state is SeqState.FINISHED and engine.reserved == 0
    assert engine.stats.rejected == 1 and engine.stats.aborted_other == 1


def test_abort_running_and_waiting_releases_kv_and_counts_disconnect_work() -> None:
    engine = make(policy="token", tbud=64, kv_tokens=1000, max_running=1)
    running = engine.submit(EngineRequest(100, 50, 50), 0.0)
    waiting = engine.submit(EngineRequest(100, 50, 50), 0.0)
    for i in range(4):
        engine.step(i * 0.01)
    assert running.state is SeqState.RUNNING and waiting.state is SeqState.WAITING
    work = running.work
    assert engine.abort(running, by_disconnect=True)
    assert engine.abort(waiting, by_disconnect=True)
    assert engine.kv_used == 0 and engine.reserved == 0 and engine.idle
    assert engine.stats.aborted_by_disconnect == 2 and engine.stats.aborted_work_tokens == work > 0
    engine.step(0.05)
    assert running.generated == 2 and engine.stats.decode_tokens == 2  # nothing after the abort


def test_concurrency_policy_counts_running_and_waiting() -> None:
    engine = make(policy="concurrency", concurrency_limit=2)
    engine.submit(EngineRequest(10, 10), 0.0)
    engine.step(0.0)
    engine.submit(EngineRequest(10, 10), 0.0)
    with pytest.raises(Rejected):
        engine.submit(EngineRequest(10, 10), 0.0)


def test_request_too_large() -> None:
    engine = make(kv_tokens=100)
    with pytest.raises(RequestTooLarge):
        engine.submit(EngineRequest(90, 20), 0.0)
    with pytest.raises(RequestTooLarge):
        engine.submit(EngineRequest(0, 20), 0.0)


def test_pause_keeps_the_slot_and_produces_nothing() -> None:
    engine = make(policy="token", kv_tokens=1000)
    seq = engine.submit(EngineRequest(10, 5, 5), 0.0)
    engine.pause(seq, 0.5)
    for i in range(40):
        engine.step(i * 0.01)
    assert seq.state is SeqState.RUNNING and seq.generated == 0 and engine.reserved > 0
    run_until_idle(engine, start=0.5)
    assert seq.first_token_at is not None and seq.first_token_at >= 0.5 and engine.reserved == 0


def test_stall_after_tokens() -> None:
    engine = make()
    seq = engine.submit(EngineRequest(10, 6, 6), 0.0)
    engine.stall_after(seq, 2, 1.0)
    now = 0.0
    while seq.generated < 2:
        engine.step(now)
        now += 0.01
    stalled_at = now
    while not seq.done:
        engine.step(now)
        now += 0.01
    assert seq.finished_at is not None and seq.finished_at - stalled_at >= 1.0


def test_slow_factor_scales_step_period_and_sampling_is_deterministic() -> None:
    assert EngineConfig(step_s=0.01, step_time_factor=3.0).step_period == pytest.approx(0.03)
    lengths = []
    for _ in range(2):
        engine = make()
        lengths.append([engine.submit(EngineRequest(10, 5000), 0.0).output_tokens for _ in range(50)])
    assert lengths[0] == lengths[1] and max(lengths[0]) <= 1200 and len(set(lengths[0])) > 10


def test_history_is_bounded() -> None:
    engine = make(history_every_s=0.01, history_len=20)
    engine.submit(EngineRequest(10, 500, 500), 0.0)
    for i in range(200):
        engine.step(i * 0.01)
    history = engine.history
    assert len(history) == 20 and history[-1][0] == pytest.approx(1.99) and history[-1][1] == 1


@pytest.mark.parametrize(
    "overrides",
    [{"tbud": 0}, {"headroom": 0.0}, {"policy": "fifo"}, {"max_model_len": 10, "kv_tokens": 5}, {"step_s": 0}],
)
def test_config_validation(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        EngineConfig(**overrides)  # type: ignore[arg-type]
