"""The bench's simulated cluster in virtual time, shared by the scripts that replay a scenario without a load
generator (`benchmarks.overload_rule`, `benchmarks.admission_model`).

The traffic is the bench's own plan (`llmguard_tools.bench.traffic.make_plan`, the same calls as
``llmguard bench --sim NAME --seed N``), the engines the simulator's (`llmguard_tools.sim.engine.Engine`, one per
replica of the scenario, stepped every ``step_period`` of virtual time while they hold work), 1.5 ms of network
each way. The bench's bodies carry ``max_tokens`` with ``ignore_eos``: each call generates exactly that many
tokens, so a run is deterministic given its seed.
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
from typing import Any

from llmguard_tools.bench.presets import SIM_LENGTHS
from llmguard_tools.bench.rates import SPIKE, RateProfile
from llmguard_tools.bench.traffic import PlannedRequest, TrafficPlan, make_plan, request_body
from llmguard_tools.sim.engine import Engine, EngineConfig, EngineRequest
from llmguard_tools.sim.protocol import parse_request
from llmguard_tools.sim.scenarios import get_scenario

__all__ = [
    "HALF_RTT",
    "TPOT_SLO",
    "TTFT_SLO",
    "EventHeap",
    "engine_request",
    "make_engines",
    "meets_slo",
    "poisson_plan",
    "spike_plan",
]

HALF_RTT = 0.0015
"""Network time each way, seconds."""
TTFT_SLO = 1.0
TPOT_SLO = 0.08
"""The bench's goodput SLO on the simulated scenarios: TTFT <= 1 s and TPOT <= 80 ms."""


def spike_plan(seed: int, n: int = 700) -> TrafficPlan:
    """The ``overload``/``collapse`` preset's traffic: the 30 -> 140 -> 30 rps spike fitted to ``n`` calls."""
    return make_plan(n, seed=seed, lengths=SIM_LENGTHS, rate=30.0, profile=SPIKE)


def poisson_plan(seed: int, rate: float, n: int) -> TrafficPlan:
    """``llmguard bench --profile RATE:SECONDS --requests n``: Poisson arrivals at ``rate`` for ``n`` calls."""
    return make_plan(n, seed=seed, lengths=SIM_LENGTHS, profile=RateProfile(((rate, n / rate),), "poisson"))


def engine_request(request: PlannedRequest) -> EngineRequest:
    """What the simulated replica submits to its engine for the bench's body of ``request``."""
    body = parse_request(json.dumps(request_body(request, "m")).encode(), "chat", "m")
    assert body.max_tokens is not None  # the bench's bodies always carry one (and ignore_eos)
    return EngineRequest(body.prompt_tokens, body.max_tokens, body.max_tokens)


def make_engines(scenario: str, seed: int, config: EngineConfig | None = None) -> list[Engine]:
    """One engine per replica of ``scenario`` (its engine config unless ``config`` is given), seeded from ``seed``."""
    found = get_scenario(scenario)
    engine_config = config or found.engine
    return [Engine(engine_config, random.Random(seed * 7 + i)) for i in range(found.replicas)]


def meets_slo(ttft: float | None, tpot: float | None) -> bool:
    """The bench's goodput test: a first token within ``TTFT_SLO`` and a time per output token within ``TPOT_SLO``."""
    return ttft is not None and ttft <= TTFT_SLO and (tpot or 0.0) <= TPOT_SLO


class EventHeap:
    """Events ``(time, kind, payload)`` popped in time order, ties in the order they were pushed."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str, Any]] = []
        self._order = itertools.count()

    def push(self, t: float, kind: str, payload: Any = None) -> None:
        heapq.heappush(self._heap, (t, next(self._order), kind, payload))

    def pop(self) -> tuple[float, str, Any]:
        t, _, kind, payload = heapq.heappop(self._heap)
        return t, kind, payload

    def __bool__(self) -> bool:
        return bool(self._heap)
