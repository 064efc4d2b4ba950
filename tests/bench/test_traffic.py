from __future__ import annotations

import itertools
import statistics

import pytest

from llmguard_tools.bench.rates import SPIKE
from llmguard_tools.bench.traffic import LengthModel, PlannedRequest, TrafficPlan, make_plan, prompt_text, request_body


def sizes(plan: TrafficPlan) -> list[tuple[int, int]]:
    return [(r.prompt_words, r.max_tokens) for r in plan.requests]


def test_same_seed_same_plan_and_fingerprint() -> None:
    a = make_plan(300, seed=7, rate=20.0)
    b = make_plan(300, seed=7, rate=20.0)
    assert a.requests == b.requests
    assert a.fingerprint() == b.fingerprint()
    c = make_plan(300, seed=8, rate=20.0)
    assert c.requests != a.requests
    assert c.fingerprint() != a.fingerprint()


def test_sizes_do_not_depend_on_the_arrival_process() -> None:
    poisson = make_plan(200, seed=3, rate=5.0)
    faster = make_plan(200, seed=3, rate=500.0)
    closed = make_plan(200, seed=3, concurrency=4)
    spike = make_plan(200, seed=3, profile=SPIKE)
    assert sizes(poisson) == sizes(faster) == sizes(closed) == sizes(spike)
    assert [r.arrival for r in poisson.requests] != [r.arrival for r in faster.requests]


def test_poisson_arrivals_have_the_requested_rate() -> None:
    plan = make_plan(5000, seed=1, rate=50.0)
    arrivals = [r.arrival for r in plan.requests]
    assert arrivals == sorted(arrivals)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert statistics.mean(gaps) == pytest.approx(1 / 50, rel=0.05)
    # exponential gaps: standard deviation ~ mean
    assert statistics.pstdev(gaps) == pytest.approx(1 / 50, rel=0.1)
    assert plan.mode == "poisson" and plan.rate == 50.0


def test_spike_profile_is_fitted_to_n_and_keeps_its_shape() -> None:
    assert SPIKE.expected_requests == 30 * 15 + 140 * 20 + 30 * 25
    fitted = SPIKE.fitted(800)
    assert fitted.expected_requests == pytest.approx(800)
    assert [r for r, _ in fitted.segments] == [30.0, 140.0, 30.0]
    plan = make_plan(800, seed=2, profile=SPIKE)
    assert plan.mode == "profile" and len(plan) == 800
    assert plan.profile is not None
    (_, d1), (_, d2), _ = plan.profile.segments
    first = sum(1 for r in plan.requests if r.arrival < d1)
    middle = sum(1 for r in plan.requests if d1 <= r.arrival < d1 + d2)
    assert first / d1 == pytest.approx(30, rel=0.35)
    assert middle / d2 == pytest.approx(140, rel=0.15)
    # with a base rate the whole shape is rescaled: base -> 4.67x base -> base
    scaled = make_plan(800, seed=2, profile=SPIKE, rate=10.0)
    assert scaled.profile is not None
    assert [r for r, _ in scaled.profile.segments] == pytest.approx([10.0, 140 / 3, 10.0])
    assert scaled.profile.expected_requests == pytest.approx(800)


def test_closed_loop_plan() -> None:
    plan = make_plan(50, seed=0, concurrency=8)
    assert plan.mode == "closed" and plan.concurrency == 8
    assert all(r.arrival == 0 for r in plan.requests)
    assert "closed loop, 8 concurrent" in plan.describe()


def test_lengths_follow_the_scaled_lognormal() -> None:
    lengths = LengthModel().scaled(0.1)
    assert lengths.prompt_median == pytest.approx(57) and lengths.output_max == 120
    plan = make_plan(4000, seed=5, rate=1.0, lengths=lengths)
    prompts = [r.prompt_words for r in plan.requests]
    outputs = [r.max_tokens for r in plan.requests]
    assert statistics.median(prompts) == pytest.approx(57, rel=0.08)
    assert statistics.median(outputs) == pytest.approx(20, rel=0.08)
    assert max(prompts) <= 400 and max(outputs) <= 120 and min(prompts) >= 1 and min(outputs) >= 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 10, "rate": 0.0}, "--rate must be > 0"),
        ({"n": 10, "rate": -3.0}, "--rate must be > 0"),
        ({"n": 0, "rate": 1.0}, "--requests"),
        ({"n": 10}, "give a --rate"),
        ({"n": 10, "concurrency": 0}, "--concurrency"),
    ],
)
def test_bad_plans_raise_value_error(kwargs: dict[str, float], message: str) -> None:
    n = int(kwargs.pop("n"))
    with pytest.raises(ValueError, match=message):
        make_plan(n, **kwargs)  # type: ignore[arg-type]


def test_prompt_and_body() -> None:
    req = PlannedRequest(index=12, arrival=0.5, prompt_words=9, max_tokens=33)
    text = prompt_text(req)
    assert len(text.split()) == 9 and text.split()[0] == "req12"
    body = request_body(req, "m")
    assert body["max_tokens"] == 33 and body["stream"] is True and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"][0]["content"] == text
    assert prompt_text(PlannedRequest(0, 0, 1, 1)) == "req0"
