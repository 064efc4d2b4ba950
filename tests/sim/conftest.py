"""Helpers for the simulated-cluster tests: one-off scenarios and polling."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio

from llmguard_tools.sim.engine import EngineConfig
from llmguard_tools.sim.faults import FaultConfig
from llmguard_tools.sim.scenarios import SIM_OUTPUT_LENGTHS, LoadHint, ScenarioConfig

ENGINE = EngineConfig(tbud=128, kv_tokens=4096, policy="token", out_reserve=32, output_lengths=SIM_OUTPUT_LENGTHS)


def one_off(engine: EngineConfig = ENGINE, faults: tuple[FaultConfig, ...] = (), replicas: int = 1) -> ScenarioConfig:
    """A throwaway scenario for one test."""
    return ScenarioConfig(
        name="test",
        description="test",
        replicas=replicas,
        engine=engine,
        load=LoadHint(base_rps=1.0, peak_rps=1.0),
        capacity_rps=1.0,
        faults=faults,
    )


def chat_body(
    words: int = 5, max_tokens: int = 5, *, stream: bool = True, include_usage: bool = True, ignore_eos: bool = True
) -> dict[str, Any]:
    """A chat request of ``words`` prompt words."""
    body: dict[str, Any] = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": " ".join(["word"] * words)}],
        "max_tokens": max_tokens,
        "stream": stream,
        "ignore_eos": ignore_eos,
    }
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    return body


async def wait_until(predicate: Callable[[], bool], within: float = 5.0) -> float:
    """Poll ``predicate`` every 5 ms; return the time it took, or fail after ``within`` seconds."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > within:
            raise AssertionError(f"condition not met within {within}s")
        await anyio.sleep(0.005)
    return time.monotonic() - start
