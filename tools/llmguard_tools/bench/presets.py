"""Per-scenario defaults of ``llmguard bench --sim NAME`` and ``llmguard demo``.

They follow the simulated cluster's sizing (``llmguard_tools.sim.scenarios``): prompts and outputs are a
production-like lognormal mix / 10 (prompt median 57 words, cap 400; ``max_tokens`` median 20, cap 120,
sent with ``ignore_eos``). ``stragglers`` runs a light Poisson load (40 rps against ~490 rps of capacity);
``overload`` and ``collapse`` run the spike 30 -> 140 -> 30 rps (15 s / 20 s / 25 s, time-compressed to the number of
requests) against ~47 rps of capacity, so the peak is ~3x and the base ~0.64x.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmguard_tools.bench.clients import TierSpec
from llmguard_tools.bench.summary import SLO
from llmguard_tools.bench.traffic import LengthModel

SIM_LENGTHS = LengthModel().scaled(0.1)
"""The default mix / 10: what the simulated scenarios are sized for."""

DEFAULT_TIER = TierSpec(ttft=1.0, total=10.0, stall=2.0)
DEFAULT_SLO = SLO(ttft=1.0, tpot=0.08)  # goodput: TTFT <= 1.0 s and TPOT <= 80 ms


@dataclass(frozen=True)
class Preset:
    requests: int = 200
    rate: float | None = 10.0
    profile: str | None = None
    concurrency: int | None = None
    lengths: LengthModel = SIM_LENGTHS
    slo: SLO = field(default_factory=lambda: DEFAULT_SLO)
    tier: TierSpec = field(default_factory=lambda: DEFAULT_TIER)
    note: str = ""
    conversations: bool = False
    """Multi-turn traffic (`llmguard_tools.bench.conversations`) instead of independent requests."""
    clients: tuple[str, ...] | None = None
    """The clients compared when ``--clients`` is not given (None: the bench's default list)."""


GENERIC = Preset(note="generic defaults")
"""Used for ``--target`` and for scenarios without a preset."""

PRESETS: dict[str, Preset] = {
    "stragglers": Preset(
        requests=500,
        rate=40.0,
        note="3 replicas, 5% of requests stall 2 s before their first token; Poisson 40 rps",
    ),
    "overload": Preset(
        requests=700,
        rate=30.0,
        profile="spike",
        note="3 KV-tight replicas (~47 rps); a spike 30 -> 140 -> 30 rps (~3x capacity at the peak)",
    ),
    "overload-in-stream": Preset(
        requests=700,
        rate=30.0,
        profile="spike",
        note="overload's cluster and spike; rejections are HTTP 200 + an in-stream 503 error event, no Retry-After",
    ),
    "collapse": Preset(
        requests=700,
        rate=30.0,
        profile="spike",
        note="overload's cluster and spike on engines without admission (unbounded queues, vLLM's default)",
    ),
    "faults": Preset(requests=400, rate=30.0, note="3 replicas with resets, 500s, black holes and stalls"),
    "healthy": Preset(requests=300, rate=30.0, note="3 healthy replicas, Poisson 30 rps"),
    "queueing": Preset(
        requests=500,
        rate=40.0,
        clients=("plain", "guarded", "guarded-hints"),
        note="3 replicas, each in turn queueing another tenant's burst for ~0.65 s every 6 s; Poisson 40 rps",
    ),
    "degraded": Preset(
        requests=500,
        rate=40.0,
        slo=SLO(ttft=0.5, tpot=0.03),
        note="3 replicas, one 10x slower to its first token and 5x per token; Poisson 40 rps; "
        "good = TTFT <= 0.5 s and TPOT <= 30 ms (3x a healthy replica's)",
    ),
    "degrading": Preset(
        requests=700,
        rate=40.0,
        slo=SLO(ttft=0.5, tpot=0.03),
        note="3 replicas, one degraded from 4 s to 9 s after the cluster starts (of ~17 s); Poisson 40 rps",
    ),
    "multiturn": Preset(
        requests=400,
        rate=30.0,
        conversations=True,
        clients=("plain", "guarded-noaffinity", "guarded-affinity"),
        note="3 replicas with prefix caches; conversations of 2-6 turns on 1,000-1,500-word system prompts, "
        "turns at ~30 rps",
    ),
}

DEMO_SCENARIOS = ("stragglers", "collapse")
DEMO_CLIENTS: dict[str, tuple[str, ...]] = {
    "stragglers": ("plain", "guarded"),
    "collapse": ("plain", "guarded", "guarded-admission"),
}
"""Per demo scenario. The overload half runs on engines that queue without limit (vLLM's default), where the
guard's admission (`Admission`, opt-in) is what keeps the engines serving in time; against servers that already
refuse what they cannot serve (``overload``), the guard has little to add."""


def preset_for(scenario: str | None) -> Preset:
    return PRESETS.get(scenario or "", GENERIC)
