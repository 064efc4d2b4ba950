"""The learned limit's rule with the default `Admission`: anchored at 0.6 of the tier's ttft, growing by at most
half a slot per first token in time while in use, cut in proportion to the load a late first token met."""

from __future__ import annotations

import pytest

from llmguard_client import Admission
from llmguard_client._admission.controller import LimitController


def test_a_first_token_in_time_grows_a_limit_in_use_by_at_most_half_a_slot() -> None:
    controller = LimitController(Admission(initial_limit=10))
    controller.first_token(0.0, 1.0, held=10, in_flight=10)
    assert controller.limit == pytest.approx(10.5)  # the most a first token adds
    controller.first_token(0.3, 1.0, held=10, in_flight=10)
    assert controller.limit == pytest.approx(10.75)  # half way to the 0.6 s target: half of that
    controller.first_token(0.0, 1.0, held=2, in_flight=2)
    assert controller.limit == pytest.approx(10.75)  # not in use: no growth


def test_a_first_token_past_six_tenths_of_the_ttft_cuts_to_what_would_have_been_in_time() -> None:
    controller = LimitController(Admission(initial_limit=20))
    controller.first_token(0.59, 1.0, held=20, in_flight=20)
    assert controller.limit > 20  # within the target: no cut
    controller.first_token(0.8, 1.0, held=16, in_flight=20)
    assert controller.limit == pytest.approx(16 * 0.6 / 0.8)  # the load it met, scaled to the target
    controller.first_token(5.0, 1.0, held=12, in_flight=12)
    assert controller.limit == pytest.approx(6.0)  # at most halved
