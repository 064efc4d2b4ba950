"""The hedge delay from per-replica TTFT windows: robust to a slow minority, per tier and stream kind."""

from __future__ import annotations

import random

import pytest

from llmguard_client import HedgePolicy
from llmguard_client._routing.quantile import StreamingQuantile
from llmguard_client._routing.ttft_stats import TTFTStats, size_class

POLICY = HedgePolicy(min_samples=20, warmup_delay=0.5, min_delay=0.05, max_delay=2.0)


def feed(stats: TTFTStats, replica: str, ttfts: list[float], tier: str = "t", stream: bool = True) -> None:
    for ttft in ttfts:
        stats.observe(replica, tier, stream, ttft)


def spread(low: float, n: int = 100) -> list[float]:
    """``n`` TTFTs evenly from ``low`` to 2 x ``low``, shuffled."""
    values = [low * (1 + i / (n - 1)) for i in range(n)]
    random.Random(0).shuffle(values)
    return values


def test_the_delay_follows_the_quantile_warms_up_and_is_clamped() -> None:
    stats = TTFTStats(POLICY)
    assert stats.hedge_delay("t", True) == 0.5  # warm-up: no samples
    feed(stats, "r0", [0.1 + i / 1000 for i in range(100)])  # 0.100 .. 0.199 s
    assert stats.hedge_delay("t", True) == pytest.approx(0.19405, abs=1e-3)  # p95
    assert stats.hedge_delay("t", False) == 0.5  # streaming and non-streaming are separate
    assert stats.hedge_delay("other", True) == 0.5  # and so are tiers
    feed(stats, "r0", [10.0 if i % 10 == 0 else 0.1 for i in range(300)])  # a tail of 10 % stalls
    assert stats.hedge_delay("t", True) == 2.0  # clamped to max_delay; old samples aged out
    feed(stats, "r0", [0.001] * 300)
    assert stats.hedge_delay("t", True) == 0.05  # and to min_delay


def test_a_fixed_delay_is_used_as_is() -> None:
    stats = TTFTStats(HedgePolicy(delay=0.3))
    feed(stats, "r0", [1.0] * 50)
    assert stats.hedge_delay("t", True) == 0.3


def test_a_slow_minority_cannot_drag_the_delay_up() -> None:
    """One replica of three 10x slower, with as many samples as the others: the delay stays the
    healthy replicas' p95. The old rule (p95 of all TTFTs pooled) lands on the slow replica's."""
    stats = TTFTStats(POLICY)
    pooled = StreamingQuantile(1000)
    for name, low in (("r0", 0.040), ("r1", 0.400), ("r2", 0.044)):
        values = spread(low)
        feed(stats, name, values)
        for v in values:
            pooled.add(v)
    assert stats.hedge_delay("t", True) == pytest.approx(0.044 * 1.95, rel=0.01)  # the median replica's p95
    pooled_p95 = pooled.quantile(0.95)
    assert pooled_p95 is not None and pooled_p95 > 0.7  # what the pooled rule would have waited
    assert stats.typical("t", True) == pytest.approx(0.044 * 1.5, rel=0.01)


def test_high_is_the_median_replicas_unclamped_quantile_and_zero_while_unknown() -> None:
    stats = TTFTStats(HedgePolicy(min_samples=20, min_delay=0.5, max_delay=2.0))
    assert stats.high("t", True) == 0.0
    for name, low in (("r0", 0.040), ("r1", 0.400), ("r2", 0.044)):
        feed(stats, name, spread(low))
    assert stats.high("t", True) == pytest.approx(0.044 * 1.95, rel=0.01)  # below min_delay: not clamped
    assert stats.hedge_delay("t", True) == 0.5  # the hedge delay is
    assert stats.high("t", False) == 0.0  # per stream kind, like the rest


def test_with_two_replicas_a_drained_one_is_left_out() -> None:
    drained = {"slow"}
    stats = TTFTStats(POLICY, degraded=lambda name: name in drained)
    feed(stats, "fast", spread(0.04))
    feed(stats, "slow", spread(0.4))
    assert stats.hedge_delay("t", True) == pytest.approx(0.078, rel=0.01)
    drained.clear()  # not drained: the lower median of two is still the faster replica's p95
    assert stats.hedge_delay("t", True) == pytest.approx(0.078, rel=0.01)
    drained.update({"fast", "slow"})  # every replica drained: they all count rather than none
    assert stats.hedge_delay("t", True) == pytest.approx(0.078, rel=0.01)


def test_replicas_with_too_few_samples_are_left_out() -> None:
    stats = TTFTStats(POLICY)
    feed(stats, "r0", spread(0.04, 30))
    feed(stats, "r1", [1.5] * (TTFTStats.MIN_REPLICA_SAMPLES - 1))
    assert stats.hedge_delay("t", True) == pytest.approx(0.078, rel=0.01)
    assert stats.typical("t", True) == pytest.approx(0.06, rel=0.01)


def test_typical_is_zero_while_unknown() -> None:
    stats = TTFTStats(POLICY)
    assert stats.typical("t", True) == 0.0
    feed(stats, "r0", [0.2, 0.4])  # fewer than MIN_REPLICA_SAMPLES: still the best guess there is
    assert stats.typical("t", True) == pytest.approx(0.3)
    assert "t/stream" in repr(stats)


def test_estimates_are_recomputed_when_the_drained_set_changes_or_samples_arrive() -> None:
    drained: set[str] = set()
    epoch = [0]
    stats = TTFTStats(POLICY, degraded=lambda name: name in drained, epoch=lambda: epoch[0])
    for name, low in (("r0", 0.04), ("r1", 0.2), ("r2", 0.4)):
        feed(stats, name, spread(low))
    assert stats.hedge_delay("t", True) == pytest.approx(0.39, rel=0.01)  # the median replica: r1
    drained.add("r1")
    assert stats.hedge_delay("t", True) == pytest.approx(0.39, rel=0.01)  # cached until the epoch moves
    epoch[0] += 1
    assert stats.hedge_delay("t", True) == pytest.approx(0.078, rel=0.01)  # lower median of r0 and r2
    feed(stats, "r0", [0.5] * (TTFTStats.RECOMPUTE_EVERY - 1))
    assert stats.hedge_delay("t", True) == pytest.approx(0.078, rel=0.01)
    feed(stats, "r0", [0.5])  # RECOMPUTE_EVERY new samples: read afresh (r0's p95 moved up)
    assert stats.hedge_delay("t", True) > 0.078 * 1.01


def test_a_call_on_a_slower_replica_waits_for_that_replicas_own_quantile_up_to_a_cap() -> None:
    stats = TTFTStats(POLICY)
    feed(stats, "r0", spread(0.040))
    feed(stats, "r1", spread(0.044))
    feed(stats, "r2", spread(0.060))  # slower, not drained: its p95 is 0.117 s
    feed(stats, "r3", spread(0.400))  # degraded, not yet drained: its p95 is 0.78 s
    healthy = stats.hedge_delay("t", True)
    assert healthy == pytest.approx(0.044 * 1.95, rel=0.01)  # rule 3: the lower median of the p95s
    assert stats.hedge_delay("t", True, "r0") == healthy  # a faster replica's calls: the shared delay
    assert stats.hedge_delay("t", True, "r2") == pytest.approx(0.060 * 1.95, rel=0.01)  # its own p95
    assert stats.hedge_delay("t", True, "r3") == pytest.approx(TTFTStats.OWN_DELAY_CAP * healthy)  # capped
    assert stats.hedge_delay("t", True, "unknown") == healthy


def test_a_drained_replicas_own_quantile_is_not_used() -> None:
    drained = {"r2"}
    stats = TTFTStats(POLICY, degraded=lambda name: name in drained)
    for name, low in (("r0", 0.040), ("r1", 0.044), ("r2", 0.060)):
        feed(stats, name, spread(low))
    assert stats.hedge_delay("t", True, "r2") == stats.hedge_delay("t", True)


def expected_p95(values: list[float]) -> float:
    window = StreamingQuantile(TTFTStats.WINDOW)
    for value in values:
        window.add(value)
    q = window.quantile(0.95)
    assert q is not None
    return q


def test_keyed_calls_take_the_delay_of_their_class_cached_or_uncached() -> None:
    stats = TTFTStats(POLICY)
    hits, misses = spread(0.06), spread(0.3, 40)
    for replica in ("r0", "r1", "r2"):
        for ttft in hits:
            stats.observe(replica, "t", True, ttft, cached=True)
        for ttft in misses:
            stats.observe(replica, "t", True, ttft, cached=False)
    overall = stats.hedge_delay("t", True, "r0")
    cached, uncached = stats.hedge_delay("t", True, "r0", True), stats.hedge_delay("t", True, "r0", False)
    assert cached == pytest.approx(expected_p95(hits))
    assert uncached == pytest.approx(expected_p95(misses))
    assert cached < overall < uncached  # one window of both kinds: too late for a hit, too early for a miss
    assert stats.hedge_delay("t", True, "r0", None) == overall  # unkeyed calls: all of them


def test_a_class_with_too_few_samples_on_the_replica_falls_back_to_all_calls() -> None:
    stats = TTFTStats(POLICY)
    feed(stats, "r0", spread(0.1))  # unkeyed calls only
    for replica in ("r1", "r2"):
        for ttft in spread(0.02, 30):
            stats.observe(replica, "t", True, ttft, cached=True)
    for ttft in spread(0.02, TTFTStats.MIN_CLASS_SAMPLES - 1):
        stats.observe("r0", "t", True, ttft, cached=True)
    # r0 has 9 expected hits: not enough, so its keyed calls are hedged like all of r0's calls.
    assert stats.hedge_delay("t", True, "r0", True) == stats.hedge_delay("t", True, "r0")
    assert stats.hedge_delay("t", True, "r1", True) == pytest.approx(0.05)  # min_delay: the class is warm there
    assert stats.hedge_delay("t", True, "r0", False) == stats.hedge_delay("t", True, "r0")  # no misses at all


def test_a_typical_ttft_above_max_delay_raises_the_cap_to_twice_it() -> None:
    """Calls that all take about 3 s (a reasoning model thinking) are hedged at their p95, not at max_delay:
    at 2 s every call would be hedged, and each hedge would need 3 s too. A heavy tail is still cut at
    twice the typical TTFT, and a fast class's at max_delay."""
    stats = TTFTStats(POLICY)
    for name in ("r0", "r1"):
        feed(stats, name, spread(2.0))  # 2-4 s, typically 3 s
    assert stats.typical("t", True) == pytest.approx(3.0, rel=0.01)
    assert stats.hedge_delay("t", True) == pytest.approx(2.0 * 1.95, rel=0.01)  # the p95
    assert stats.hedge_delay("t", True, "r0") == stats.hedge_delay("t", True)
    for name in ("r0", "r1"):
        feed(stats, name, [30.0 if i % 10 == 0 else 3.0 for i in range(TTFTStats.WINDOW)])  # 10 % stall 30 s
    assert stats.hedge_delay("t", True) == pytest.approx(TTFTStats.TYPICAL_FACTOR * 3.0)
    for name in ("r0", "r1"):
        feed(stats, name, [30.0 if i % 10 == 0 else 0.3 for i in range(TTFTStats.WINDOW)])
    assert stats.hedge_delay("t", True) == POLICY.max_delay  # typically 0.3 s: the stragglers at max_delay


def test_a_slower_replicas_own_quantile_is_capped_by_the_raised_cap_too() -> None:
    stats = TTFTStats(POLICY)
    feed(stats, "r0", spread(2.0))  # p95 3.9 s
    feed(stats, "r1", spread(2.0))
    feed(stats, "r2", spread(2.4))  # slower, not drained: p95 4.68 s
    feed(stats, "r3", spread(20.0))  # degraded, not yet drained
    delay = stats.hedge_delay("t", True)
    assert delay == pytest.approx(2.0 * 1.95, rel=0.01)
    assert stats.hedge_delay("t", True, "r2") == pytest.approx(2.4 * 1.95, rel=0.01)  # its own p95
    assert stats.hedge_delay("t", True, "r3") == pytest.approx(TTFTStats.TYPICAL_FACTOR * stats.typical("t", True))


def test_the_warm_up_delay_waits_for_twice_a_typical_ttft_once_three_samples_show_it() -> None:
    stats = TTFTStats(POLICY)
    feed(stats, "r0", [3.0] * (TTFTStats.MIN_WARMUP_SAMPLES - 1))
    assert stats.hedge_delay("t", True) == POLICY.warmup_delay  # one or two calls say little
    feed(stats, "r1", [3.0])
    assert stats.hedge_delay("t", True) == pytest.approx(6.0)  # not every call hedged at 0.5 s while warming up
    fast = TTFTStats(POLICY)
    feed(fast, "r0", [0.05] * 10)
    assert fast.hedge_delay("t", True) == POLICY.warmup_delay  # never shorter than warmup_delay


@pytest.mark.parametrize(("chars", "cls"), [(0, 0), (2047, 0), (2048, 1), (4095, 1), (4096, 2), (8192, 3), (10**9, 11)])
def test_a_size_class_per_doubling_of_the_prompt(chars: int, cls: int) -> None:
    assert size_class(chars) == cls


def test_long_prompts_are_hedged_at_their_own_classs_p95_not_the_short_ones() -> None:
    """10 % of the calls prefill a long prompt (0.12-0.15 s against 0.015-0.03 s): one window of both hedged about
    half of the long ones at the short ones' p95, every hedge lost (a fresh attempt prefills as long). Each size
    class now has its own delay, and the short calls' stays theirs."""
    stats = TTFTStats(POLICY)
    short, long = spread(0.015, 90), [0.12 + 0.03 * i / 9 for i in range(10)]
    random.Random(1).shuffle(long)
    for replica in ("r0", "r1", "r2"):
        for i in range(100):
            if i % 10 == 0:
                stats.observe(replica, "t", True, long[i // 10], size=3)
            else:
                stats.observe(replica, "t", True, short[i - i // 10 - 1], size=0)
    pooled = stats.hedge_delay("t", True, "r0")  # what any size got before
    assert 0.13 < pooled < 0.14  # about half of the long calls hedged
    assert stats.hedge_delay("t", True, "r0", size=3) == pytest.approx(expected_p95(long))
    assert stats.hedge_delay("t", True, "r0", size=0) == max(POLICY.min_delay, expected_p95(short))
    assert stats.typical("t", True, size=3) == pytest.approx(0.135, rel=0.05)
    assert stats.high("t", True, size=3) > stats.high("t", True) > stats.high("t", True, size=0)


def test_a_size_class_warming_up_waits_for_twice_its_typical_ttft_from_its_third_sample() -> None:
    stats = TTFTStats(POLICY)
    for replica in ("r0", "r1", "r2"):
        feed(stats, replica, spread(0.015, 40))
    short = stats.hedge_delay("t", True, "r0")
    stats.observe("r0", "t", True, 0.12, size=4)
    stats.observe("r1", "t", True, 0.12, size=4)
    assert stats.hedge_delay("t", True, "r0", size=4) == short  # two samples say little: all calls' delay
    stats.observe("r2", "t", True, 0.12, size=4)
    assert stats.hedge_delay("t", True, "r0", size=4) == pytest.approx(TTFTStats.TYPICAL_FACTOR * 0.12)
    assert stats.hedge_delay("t", True, "r0", size=5) == short  # a size never seen: all calls' delay
    assert stats.typical("t", True, size=4) == stats.typical("t", True)  # not warm: all calls' figures


def test_first_tokens_are_scaled_to_the_most_frequent_size_classs() -> None:
    """The router learns first tokens scaled to a typical prompt's: a long prompt's by the ratio of the two classes'
    typical TTFTs, the most frequent class's as they are, a class not yet known (fewer than three) not at all, and
    the Guard's very first calls, before any class is known, as they are."""
    stats = TTFTStats(POLICY)
    assert stats.scale("t", True, 0) == 1.0  # nothing known
    stats.observe("r0", "t", True, 0.24, size=3)  # a Guard's first call, a long prompt
    for replica in ("r1", "r2", "r0"):
        stats.observe(replica, "t", True, 0.013, size=0)
        stats.observe(replica, "t", True, 0.014, size=0)
    # Half of r0's samples are long: all calls' typical TTFT would scale a short call up ~10x; the short calls'
    # own class is the most frequent, and the reference.
    assert stats.scale("t", True, 0) == 1.0
    assert stats.scale("t", True, 3) is None  # one long prompt says nothing yet of a replica's speed
    stats.observe("r1", "t", True, 0.26, size=3)
    stats.observe("r2", "t", True, 0.25, size=3)
    ratio = stats.scale("t", True, 3)
    assert ratio is not None and ratio == pytest.approx(0.0135 / 0.25)  # the two classes' typical TTFTs
    assert stats.scale("t", False, 3) == 1.0 and stats.scale("t", True, None) == 1.0  # another kind; no size told
