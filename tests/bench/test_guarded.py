"""The guarded bench client's reading of the phase record: waits, time in attempts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from llmguard_tools.bench.guarded import GuardedClient
from llmguard_tools.bench.measure import Probe, TierSpec


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
