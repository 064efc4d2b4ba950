"""An application's `Instrumentation` that raises never fails nor stalls a call: the error is logged once per
hook and counted, and the call ends as it would have without it."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping

import anyio
import pytest

from llmguard_client import Guard, Tier
from llmguard_client.telemetry.contained import HOOKS, ContainedInstrumentation, contained
from llmguard_client.telemetry.hooks import NO_INSTRUMENTATION, CallObservation, Instrumentation, LiveAttempt, LiveCall
from llmguard_client.telemetry.record import PhaseRecord
from tests.loopback import LoopbackServer, Script

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
CALL_HOOKS = ("call_started", "attempt_started", "attempt_finished", "call_finished")


class Raising:
    """Raises in the hook named ``where``; counts every hook it saw."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.seen: list[str] = []

    def _hook(self, name: str) -> None:
        self.seen.append(name)
        if name == self.where:
            raise RuntimeError(f"{name} is broken")

    def call_started(self, record: LiveCall) -> CallObservation:
        self._hook("call_started")
        return self  # type: ignore[return-value]

    def attempt_started(self, attempt: LiveAttempt, url: str, headers: MutableMapping[str, str]) -> None:
        self._hook("attempt_started")

    def attempt_finished(self, attempt: LiveAttempt) -> None:
        self._hook("attempt_finished")

    def call_finished(self, record: PhaseRecord) -> None:
        self._hook("call_finished")

    def budget_refused(self, record: LiveCall) -> None:
        self._hook("budget_refused")

    def replica_cooled(self, replica: str, seconds: float, reason: str) -> None:
        self._hook("replica_cooled")

    def bulkhead_rejected(self, tier: str) -> None:
        self._hook("bulkhead_rejected")

    def register_budget(self, level: Callable[[], float]) -> None:
        self._hook("register_budget")


@pytest.mark.parametrize("where", [*CALL_HOOKS, "register_budget"])
async def test_a_raising_hook_neither_fails_nor_stalls_the_call(
    servers: list[LoopbackServer], where: str, caplog: pytest.LogCaptureFixture
) -> None:
    servers[0].script = Script(tokens=3)
    raising = Raising(where)
    records: list[PhaseRecord] = []
    guard = Guard(
        replicas=[servers[0].url],
        tiers={"t": Tier(ttft=5, total=10)},
        instrumentation=raising,
        on_record=records.append,
    )
    with anyio.fail_after(20):  # an error in the call's last act used to leave it, and the Guard's close, hanging
        async with guard, guard.http_client() as client:
            for _ in range(2):
                async with client.stream("POST", servers[0].url + "/v1/chat/completions", json=BODY) as response:
                    body = await response.aread()
                assert response.status_code == 200 and b"[DONE]" in body
    assert [r.status for r in records] == ["ok", "ok"]
    assert where in raising.seen
    logged = [r for r in caplog.records if f"instrumentation's {where} raised" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None  # once, with the traceback
    if where in CALL_HOOKS:
        assert raising.seen.count(where) == 2  # both calls reached it


def test_the_hooks_checked_at_construction_are_the_protocols_methods() -> None:
    declared = {name for name, value in vars(Instrumentation).items() if callable(value) and not name.startswith("_")}
    assert set(HOOKS) == declared


def test_only_an_applications_instrumentation_is_held() -> None:
    """The package's own instrumentations are tested not to raise and keep their cost: used as they are."""
    own = NO_INSTRUMENTATION
    assert contained(own) is own
    assert isinstance(contained(Raising("none")), ContainedInstrumentation)  # type: ignore[arg-type]
