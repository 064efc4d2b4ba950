"""The queue's recovery after a spike, from the replicas' history."""

from __future__ import annotations

from llmguard_tools.bench.queue_recovery import queue_recovery, spike_window
from llmguard_tools.bench.rates import SPIKE, RateProfile

PROFILE = RateProfile(((30.0, 2.0), (140.0, 3.0), (30.0, 4.0)))
"""Base to 2 s, the spike from 2 s to 5 s, base to 9 s."""


def history(waiting: list[float], every: float = 0.5) -> list[list[float]]:
    return [[i * every, 1.0, w, 10.0] for i, w in enumerate(waiting)]


def test_the_spike_is_the_peak_segment_between_two_lower_ones() -> None:
    assert spike_window(PROFILE) == (2.0, 5.0)
    assert spike_window(SPIKE) == (15.0, 35.0)
    assert spike_window(RateProfile(((30.0, 1.0),))) is None
    assert spike_window(RateProfile(((140.0, 1.0), (30.0, 1.0), (10.0, 1.0)))) is None
    assert spike_window(None) is None


def test_recovery_is_timed_from_the_spike_end_on_the_summed_queues() -> None:
    # Two replicas, sampled every 0.5 s: before the spike at most 1 + 1 waiting; at its end (5 s) 5 + 4; the
    # sum is back to 2 at 6.5 s.
    r0 = history([0, 1, 0, 0, 3, 5, 6, 6, 6, 6, 5, 3, 1, 1, 0, 0])
    r1 = history([1, 1, 0, 0, 2, 3, 4, 4, 4, 4, 4, 2, 2, 1, 0, 0])
    recovery = queue_recovery([{"history": r0}, {"history": r1}], PROFILE)
    assert recovery is not None
    assert (recovery.before, recovery.at_end, recovery.seconds, recovery.observed) == (2.0, 9.0, 1.5, 2.5)


def test_a_queue_never_back_within_the_history_says_how_long_was_observed() -> None:
    rising = history([0, 0, 0, 0, 5, 9, 12, 15, 18, 20, 22, 24])
    recovery = queue_recovery([{"history": rising}], PROFILE)
    assert recovery is not None and recovery.seconds is None and recovery.observed == 0.5
    assert queue_recovery([{"history": []}], PROFILE) is None
    assert queue_recovery([{}], PROFILE) is None
