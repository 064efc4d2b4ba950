"""The learned limit's rule with the default `Admission`: anchored at 0.6 of the tier's ttft, growing by at most
0.75 of a slot per first token in time while in use, coming down by as much while not in use (never below the
load proven in time), cut in proportion to the load a late first token met."""

from __future__ import annotations

import pytest

from llmguard_client import Admission
from llmguard_client._admission.controller import LimitController


def test_a_first_token_in_time_grows_a_limit_in_use_by_at_most_three_quarters_of_a_slot() -> None:
    controller = LimitController(Admission(initial_limit=10))
    controller.first_token(0.0, 1.0, held=10, in_flight=10)
    assert controller.limit == pytest.approx(10.75)  # the most a first token adds
    controller.first_token(0.3, 1.0, held=10, in_flight=10)
    assert controller.limit == pytest.approx(11.125)  # half way to the 0.6 s target: half of that
    controller.first_token(0.0, 1.0, held=9, in_flight=8)
    assert controller.limit == pytest.approx(11.125)  # not in use (8 of 11), but 10 proven (12.5 over the use)


def test_a_limit_not_in_use_comes_down_to_the_load_proven_in_time_and_no_lower() -> None:
    controller = LimitController(Admission(initial_limit=16))
    controller.first_token(0.1, 1.0, held=6, in_flight=4)  # 6 in flight, in time: 6 proven (7.5 over the use)
    assert controller.limit == pytest.approx(15.25)  # not in use: down by at most what growth would add
    for _ in range(20):
        controller.first_token(0.1, 1.0, held=2, in_flight=2)
    assert 7.5 * (1 - 1 / 400) ** 20 <= controller.limit < 7.5  # at the proven load, which fades slowly
    controller.first_token(0.9, 1.0, held=7, in_flight=7)
    assert controller.limit == pytest.approx(7 * 0.6 / 0.9)  # a late one still cuts below it


def test_a_first_token_past_six_tenths_of_the_ttft_cuts_to_what_would_have_been_in_time() -> None:
    controller = LimitController(Admission(initial_limit=20))
    controller.first_token(0.59, 1.0, held=20, in_flight=20)
    assert controller.limit > 20  # within the target: no cut
    controller.first_token(0.8, 1.0, held=16, in_flight=20)
    assert controller.limit == pytest.approx(16 * 0.6 / 0.8)  # the load it met, scaled to the target
    controller.first_token(5.0, 1.0, held=12, in_flight=12)
    assert controller.limit == pytest.approx(6.0)  # at most halved


def test_use_is_measured_against_the_share_of_the_limit_the_call_may_take() -> None:
    # A batch call may take 3/4 of the limit (the rest is kept for the most urgent tier): 7 of 10 in flight
    # is the limit in use for it (7 >= 0.8 x 0.75 x 10), and its proven load keeps the limit up.
    controller = LimitController(Admission(initial_limit=10))
    controller.first_token(0.0, 30.0, held=7, in_flight=7, share=0.75)
    assert controller.limit == pytest.approx(10.75)
    urgent = LimitController(Admission(initial_limit=10))
    urgent.first_token(0.0, 1.0, held=7, in_flight=7)  # an interactive call: 7 < 8, not in use
    assert urgent.limit == pytest.approx(9.25)  # down by growth (7 proven / 0.8 = 8.75 is lower)


def test_the_ceiling_falls_only_on_signs_of_overload_and_a_load_held_in_time_raises_the_limit() -> None:
    # The ceiling (what the gate refuses by) does not come down while the limit is not in use; a late first
    # token or an overload answer cuts it with the limit.
    controller = LimitController(Admission(initial_limit=16))
    for _ in range(20):
        controller.first_token(0.1, 1.0, held=2, in_flight=2)
    assert controller.allowed < 16 and controller.undisproven == 16  # came down, with no sign of overload
    controller.first_token(0.1, 1.0, held=12, in_flight=3)  # 12 held in time: the replica just held them
    assert controller.limit == pytest.approx(12.0) and controller.undisproven == 16
    controller.first_token(0.8, 1.0, held=12, in_flight=12)  # late against the 0.6 s target
    assert controller.limit == controller.ceiling == pytest.approx(9.0)
    controller.first_token(0.0, 1.0, held=10, in_flight=10)
    controller.overload(held=4)
    assert controller.limit == controller.ceiling == pytest.approx(3.6)


def test_the_limit_grows_back_to_the_ceiling_in_round_trips_of_the_recent_first_token() -> None:
    controller = LimitController(Admission(initial_limit=16))
    controller.limit = 4.0
    # 0.75 x (1 - 0.1 / 0.6) = 0.625 more per round trip: 4 -> 16 in log(4) / log(1.625) round trips of 0.1 s
    assert controller.growth_time(16, 0.1, 0.6) == pytest.approx(0.1 * 1.3862944 / 0.4855078, rel=1e-6)
    assert controller.growth_time(4, 0.1, 0.6) == 0.0
    assert controller.growth_time(17, 0.1, 0.6) == float("inf")  # past the ceiling: no sign it would hold
    assert controller.growth_time(8, 0.7, 0.6) == float("inf")  # first tokens late: no growth
