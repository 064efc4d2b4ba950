"""The simulated cluster: model inference engines behind OpenAI-compatible HTTP replicas.

The engine, its admission policies and its length mix follow a published simulation of LLM serving under
overload (a vLLM-like scheduler: 10 ms steps, a 400-token budget per step, a 90k-token KV cache, chunked
prefill of 512; the "reference simulation" below); tests/sim/test_engine_seed.py checks the figures it
reproduces.

Pure model: `Engine` (step-driven, no I/O) and `run_open_loop` (virtual-time load). Real HTTP: `SimCluster`
(replicas in the current event loop), `spawn_cluster` / ``python -m llmguard_tools.sim`` (a subprocess).
Scenarios: `SCENARIOS`. Importing ``llmguard_client`` never imports this package.
"""

from __future__ import annotations

from llmguard_tools.bench.rates import SPIKE, RateProfile
from llmguard_tools.sim.admission import AdmissionPolicy
from llmguard_tools.sim.cluster import SimCluster
from llmguard_tools.sim.engine import (
    Engine,
    EngineConfig,
    EngineRequest,
    EngineStats,
    Rejected,
    RequestTooLarge,
    SeqState,
    Sequence,
)
from llmguard_tools.sim.faults import FaultConfig, RetryAfterStyle
from llmguard_tools.sim.launch import ClusterStartError, spawn_cluster
from llmguard_tools.sim.lengths import SEED_OUTPUT_LENGTHS, SEED_PROMPT_LENGTHS, LengthDist
from llmguard_tools.sim.replica import Replica
from llmguard_tools.sim.scenarios import (
    SCENARIOS,
    SIM_MAX_TOKENS,
    SIM_OUTPUT_LENGTHS,
    SIM_PROMPT_WORDS,
    LoadHint,
    ScenarioConfig,
    get_scenario,
)
from llmguard_tools.sim.server import build_app
from llmguard_tools.sim.virtual import (
    HONOUR_ONE_RETRY,
    HONOUR_WITH_BUDGET,
    NAIVE_RETRY,
    NO_RETRY,
    ClientModel,
    VirtualRun,
    measure_capacity,
    run_open_loop,
)

__all__ = [
    "AdmissionPolicy",
    "ClientModel",
    "ClusterStartError",
    "Engine",
    "EngineConfig",
    "EngineRequest",
    "EngineStats",
    "FaultConfig",
    "HONOUR_ONE_RETRY",
    "HONOUR_WITH_BUDGET",
    "LengthDist",
    "LoadHint",
    "NAIVE_RETRY",
    "NO_RETRY",
    "RateProfile",
    "Rejected",
    "Replica",
    "RequestTooLarge",
    "RetryAfterStyle",
    "SCENARIOS",
    "SEED_OUTPUT_LENGTHS",
    "SEED_PROMPT_LENGTHS",
    "SIM_MAX_TOKENS",
    "SIM_OUTPUT_LENGTHS",
    "SIM_PROMPT_WORDS",
    "SPIKE",
    "ScenarioConfig",
    "SeqState",
    "Sequence",
    "SimCluster",
    "VirtualRun",
    "build_app",
    "get_scenario",
    "measure_capacity",
    "run_open_loop",
    "spawn_cluster",
]
