"""The guarded bench client's reading of the phase record: waits, time in attempts."""

from __future__ import annotations

from types import SimpleNamespace

import anyio
import pytest

from llmguard_tools.bench.guarded import GuardedAdmissionClient, GuardedClient
from llmguard_tools.bench.measure import Probe, Sample, TierSpec
from llmguard_tools.bench.traffic import PlannedRequest, request_body
from tests.loopback import CHAT_PATHS, LoopbackCluster


def test_guarded_waited_counts_gaps_before_retry_rounds_only() -> None:
    def attempt(kind: str, start: float, finish: float) -> SimpleNamespace:
        return SimpleNamespace(kind=kind, start=start, finish=finish)

    record = SimpleNamespace(
        attempts=[attempt("primary", 0.0, 0.1), attempt("hedge", 0.05, 0.12), attempt("retry", 0.62, 0.7)]
    )
    probe = Probe(t0=0.0, extra={"record": record})
    client = GuardedClient(["http://127.0.0.1:1"], model="m", tier=TierSpec(ttft=1.0, total=5.0, stall=None))
    assert client.waited_of(probe) == pytest.approx(0.5)  # 0.12 -> 0.62; the hedge overlapped, no wait


def test_guarded_in_attempts_is_the_union_of_attempt_intervals() -> None:
    record = SimpleNamespace(
        attempts=[
            SimpleNamespace(kind="primary", start=0.0, finish=0.1),
            SimpleNamespace(kind="hedge", start=0.05, finish=0.12),  # overlaps the primary
            SimpleNamespace(kind="retry", start=0.62, finish=0.7),
        ]
    )
    client = GuardedClient(["http://127.0.0.1:1"], model="m", tier=TierSpec(ttft=1.0, total=5.0, stall=None))
    assert client.in_attempts_of(Probe(t0=0.0, extra={"record": record})) == pytest.approx(0.2)


def test_a_batch_call_of_a_tier_mix_goes_through_the_guard_on_the_batch_tier(cluster: LoopbackCluster) -> None:
    async def main() -> list[Sample]:
        client = GuardedAdmissionClient(cluster.urls, model="m", tier=TierSpec(ttft=1.0, total=5.0, stall=None))
        client.tiers = ("interactive", "batch")
        await client.start()
        try:
            out = []
            for i in range(2):
                req = PlannedRequest(index=i, arrival=0.0, prompt_words=5, max_tokens=3)
                out.append(await client.run(req, request_body(req, "m"), 0.0))
            return out
        finally:
            await client.aclose()

    first, second = anyio.run(main)
    assert (first.status, first.tier, second.status, second.tier) == ("ok", "interactive", "ok", "batch")
    # the time each attempt had left for its first token: under the interactive tier's 1 s, under batch's 30 s
    left = sorted(int(r.headers["x-slo-ttft-ms"]) for s in cluster.servers for r in s.received if r.path in CHAT_PATHS)
    assert left[0] <= 1000 < 25_000 < left[1] <= 30_000
