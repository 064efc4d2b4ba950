"""The prefix-cache lines printed after a bench: hit rates per replica, TTFT by turn, the load spread."""

from __future__ import annotations

from llmguard_tools.bench.conversations import make_conversation_plan
from llmguard_tools.bench.measure import Sample
from llmguard_tools.bench.prefix_report import cache_lines, hit_rates, load_spread
from llmguard_tools.bench.presets import SIM_LENGTHS
from llmguard_tools.bench.runner import ClientRun, ServerStats
from llmguard_tools.bench.traffic import make_plan


def _sample(index: int, ttft: float, replica: str | None = None) -> Sample:
    return Sample(index, "c", "ok", 200, None, 0.0, 0.0, ttft, 2 * ttft, 5, None, 1, replica=replica)


def test_hit_rates_are_in_tokens_per_replica_and_overall() -> None:
    replicas = [
        {"prefix_cache_queries": 1000, "prefix_cache_hits": 900},
        {"prefix_cache_queries": 3000, "prefix_cache_hits": 300},
        {"prefix_cache_queries": 0, "prefix_cache_hits": 0},
    ]
    per, overall = hit_rates(replicas)
    assert per == [0.9, 0.1, None] and overall == 1200 / 4000


def test_lines_show_each_client_and_the_first_turns_apart_from_the_later_ones() -> None:
    plan = make_conversation_plan(12, seed=0, rate=30.0, lengths=SIM_LENGTHS)
    first = {c.first for c in plan.conversations}
    samples = [_sample(i, 0.040 if i in first else 0.020, f"r{min(i % 3, 1)}") for i in range(12)]
    stats = ServerStats([{"prefix_cache_queries": 100, "prefix_cache_hits": 95}, {"prefix_cache_queries": 100}])
    lines = cache_lines([ClientRun("plain", samples, stats, 1.0)], plan)
    assert lines == [
        "prefix cache hit rate (tokens) r0 r1, all; TTFT p50 first / later turns; busiest replica's calls / mean:",
        "  plain   95%   0%  all  48%  TTFT 40 ms / 20 ms  busiest 1.33x",
    ]


def test_nothing_is_printed_without_a_prefix_cache() -> None:
    plan = make_plan(3, rate=10.0)
    stats = ServerStats([{"received": 3, "prefix_cache_queries": 0}])
    assert cache_lines([ClientRun("plain", [_sample(i, 0.01) for i in range(3)], stats, 1.0)], plan) == []
    assert cache_lines([ClientRun("plain", [], None, 1.0)], plan) == []


def test_the_load_spread_is_the_busiest_replicas_calls_over_the_mean() -> None:
    assert load_spread(["a", "a", "b", "c"], 3) == 2 / (4 / 3)
    assert load_spread(["a", "a", "b", None], 3) == 2 / 1  # a replica with no call counts as 0
    assert load_spread(["a", "b", "c"], 3) == 1.0
    assert load_spread([None], 3) is None
