"""The engine with a prefix cache: cached blocks skip prefill (and its budget), off by default."""

from __future__ import annotations

import random

import pytest

from llmguard_tools.sim.engine import Engine, EngineConfig, EngineRequest
from llmguard_tools.sim.prefix_cache import BlockHasher
from tests.sim.test_engine import run_until_idle


def prompt(n: int, tag: str = "s") -> tuple[bytes, ...]:
    hasher = BlockHasher(16)
    hasher.feed(" ".join(f"{tag}{i}" for i in range(n)), "system")
    return hasher.hashes()


def ttft(engine: Engine, request: EngineRequest, at: float) -> float:
    seq = engine.submit(request, at)
    run_until_idle(engine, at)
    assert seq.first_token_at is not None
    return seq.first_token_at - at


def test_a_cached_prefix_skips_prefill_and_shortens_the_first_token() -> None:
    engine = Engine(EngineConfig(tbud=512, prefill_chunk=512, prefix_cache_tokens=4096), random.Random(0))
    cold = ttft(engine, EngineRequest(1300, 2, 2, prompt(1300)), 0.0)
    assert engine.stats.prefill_tokens == 1300
    warm = ttft(engine, EngineRequest(1400, 2, 2, prompt(1400)), 1.0)  # the same 1,300 words, then 100 more
    assert cold == pytest.approx(0.03) and warm == pytest.approx(0.01)  # 3 prefill steps, then 1
    assert engine.stats.prefill_tokens == 1300 + (1400 - 1296)  # 81 cached blocks of 16
    counters = engine.prefix_cache.counters
    assert (counters.queries, counters.hits) == (2700, 1296)


def test_cached_tokens_still_take_kv_while_the_request_runs() -> None:
    engine = Engine(EngineConfig(tbud=512, prefix_cache_tokens=4096), random.Random(0))
    ttft(engine, EngineRequest(640, 1, 1, prompt(640)), 0.0)
    seq = engine.submit(EngineRequest(640, 4, 4, prompt(640)), 1.0)
    engine.step(1.0)
    assert seq.cached == 624 and seq.prefilled == 640 and engine.kv_used == 640
    run_until_idle(engine, 1.01)
    assert engine.kv_used == 0


def test_without_a_cache_size_nothing_is_cached_and_the_engine_is_unchanged() -> None:
    config = EngineConfig(tbud=512)
    assert config.prefix_cache_tokens == 0
    plain, hashed = Engine(config, random.Random(0)), Engine(config, random.Random(0))
    for at in (0.0, 1.0):
        a = ttft(plain, EngineRequest(1300, 2, 2), at)
        b = ttft(hashed, EngineRequest(1300, 2, 2, prompt(1300)), at)
        assert a == b == pytest.approx(0.03)
    assert plain.stats == hashed.stats and hashed.prefix_cache.counters.queries == 0


def test_bad_cache_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="prefix_cache_tokens must be >= 0"):
        EngineConfig(prefix_cache_tokens=-1)
    with pytest.raises(ValueError, match="cache_block_tokens >= 1"):
        EngineConfig(cache_block_tokens=0)
