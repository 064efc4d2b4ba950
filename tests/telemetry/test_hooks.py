"""A user's own `Instrumentation`, written against the public protocol only (`llmguard_client.telemetry.hooks`),
sees one guarded streamed call through a real loopback server: the live views while it runs, the headers it
adds on the wire, the final record at its end."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping

from llmguard_client import Guard, PhaseRecord, Tier
from llmguard_client.telemetry.hooks import CallObservation, Instrumentation, LiveAttempt, LiveCall
from tests.core.test_transport import CHAT, STREAM_BODY
from tests.loopback import LoopbackServer


class Observer:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def attempt_started(self, attempt: LiveAttempt, url: str, headers: MutableMapping[str, str]) -> None:
        self.events.append(f"attempt {attempt.index} {attempt.kind} {attempt.outcome} {url}")
        headers["x-trace-id"] = "t-1"

    def attempt_finished(self, attempt: LiveAttempt) -> None:
        self.events.append(f"attempt {attempt.index} {attempt.outcome} {attempt.status_code}")

    def call_finished(self, record: PhaseRecord) -> None:
        self.events.append(f"call {record.status} {len(record.attempts)}")

    def budget_refused(self, record: LiveCall) -> None:
        self.events.append("refused")


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    def call_started(self, record: LiveCall) -> CallObservation:
        self.events.append(f"start {record.tier} {record.method} {record.stream} {len(record.attempts)}")
        return Observer(self.events)

    def replica_cooled(self, replica: str, seconds: float, reason: str) -> None:
        self.events.append(f"cooled {replica}")

    def bulkhead_rejected(self, tier: str) -> None:
        self.events.append(f"rejected {tier}")

    def register_budget(self, level: Callable[[], float]) -> None:
        self.events.append("budget")


async def test_an_instrumentation_on_the_public_protocol_sees_a_call_through(servers: list[LoopbackServer]) -> None:
    recorder = Recorder()
    instrumentation: Instrumentation = recorder
    tiers = {"chat": Tier(ttft=10.0, total=30.0)}
    url = servers[0].url
    async with Guard([url], tiers, instrumentation=instrumentation) as guard, guard.http_client() as client:
        async with client.stream("POST", url + CHAT, json=STREAM_BODY) as response:
            await response.aread()
    assert recorder.events == [
        "budget",
        "start chat POST True 0",
        f"attempt 0 primary pending {url}{CHAT}",
        "attempt 0 won 200",
        "call ok 1",
    ]
    assert servers[0].received[-1].headers["x-trace-id"] == "t-1"
