"""Panic mode and circuits counted per call: with nowhere else to go, the guard keeps sending to its only
replica, as the plain SDK does. The real openai SDK against a real loopback server; instants in virtual time."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import httpx
import openai
import pytest

from llmguard_client import BudgetPolicy, Guard, PhaseRecord, RetryPolicy, Tier
from tests.clients import plain_sdk
from tests.loopback import LoopbackServer, Script
from tests.virtual import BACKENDS, FakeReplica, Plan, run_virtual, virtual_guard

MESSAGES: Any = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
BODY: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream": True}
TIERS = {"t": Tier(ttft=5.0, total=10.0)}
ROOMY = BudgetPolicy(floor=10)
"""A budget with room for every retry here: the circuit, not the budget, is under test."""


def failing_calls(server: LoopbackServer, calls: int) -> None:
    """Every attempt of the first ``calls`` calls (prompts ``req0``, ``req1``...) gets a 500; later calls succeed."""
    server.scripter = lambda index, attempt: Script(status=500) if 0 <= index < calls else Script()


def prompt(i: int) -> Any:
    return [{"role": "user", "content": f"req{i} hi"}]


async def test_two_failing_calls_do_not_stop_the_guard_from_sending_to_its_only_replica(
    servers: list[LoopbackServer],
) -> None:
    """Two calls meet 500s on every attempt (3 each, the guard's retries): that is two failures toward the
    circuit, not six; the third call is sent and succeeds, as the plain SDK's does."""
    server = servers[0]
    failing_calls(server, 2)
    plain = plain_sdk(server.url, max_retries=2)
    for i in range(2):
        with pytest.raises(openai.InternalServerError):
            await plain.chat.completions.create(model="m", messages=prompt(i))
    assert (await plain.chat.completions.create(model="m", messages=prompt(2))).choices[0].message.content
    await plain.close()

    server.reset()
    failing_calls(server, 2)
    records: list[PhaseRecord] = []
    async with Guard([server.url], tiers=TIERS, hedge=None, budget=ROOMY, on_record=records.append) as guard:
        client = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI)
        )
        for i in range(2):
            with pytest.raises(openai.InternalServerError):
                await client.chat.completions.create(model="m", messages=prompt(i))
        assert guard.snapshot().replicas[0].circuit_open_for == 0.0  # 2 failures (one per call) of 5: closed
        done = await client.chat.completions.create(model="m", messages=prompt(2))
        assert done.choices[0].message.content
    assert [len(r.attempts) for r in records] == [3, 3, 1]
    assert len(server.received) == 7


async def test_an_open_circuit_on_the_only_replica_does_not_refuse_calls(
    servers: list[LoopbackServer], caplog: pytest.LogCaptureFixture
) -> None:
    """Panic mode: the only replica's circuit opens (after 2 failed calls here), and the next call is still
    sent; the snapshot and a log line say so, and a success closes the circuit and ends the panic."""
    server = servers[0]
    failing_calls(server, 2)
    policy = RetryPolicy(circuit_failures=2, circuit_cooldown=30.0)
    async with Guard([server.url], tiers=TIERS, hedge=None, retry=policy, budget=ROOMY) as guard:
        client = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI)
        )
        with caplog.at_level(logging.INFO, logger="llmguard_client"):
            for i in range(2):
                with pytest.raises(openai.InternalServerError):
                    await client.chat.completions.create(model="m", messages=prompt(i))
            snapshot = guard.snapshot()
            assert snapshot.replicas[0].circuit_open_for > 0 and snapshot.panic
            done = await client.chat.completions.create(model="m", messages=prompt(2))
            assert done.choices[0].message.content
            assert not guard.snapshot().panic
    assert len(server.received) == 7
    messages = [r.getMessage() for r in caplog.records]
    assert any("panic mode: 0 of 1 replica(s) healthy" in m for m in messages)
    assert any("panic mode over" in m for m in messages)


@BACKENDS
def test_in_panic_mode_the_open_replica_is_sent_to_at_once(backend: str) -> None:
    """One replica whose circuit opened: the next call goes to it at once (no time passes, no refusal)."""
    fake = FakeReplica("a", [Plan(status=500), Plan(status=500), Plan()])
    records: list[PhaseRecord] = []

    async def main() -> None:
        policy = RetryPolicy(max_attempts=2, circuit_failures=1, circuit_cooldown=30.0)
        guard = virtual_guard({"http://a.test": fake}, records, tiers=TIERS, hedge=None, retry=policy)
        async with guard, guard.http_client() as client:
            assert (await client.post("http://a.test" + CHAT, json=BODY)).status_code == 500
            assert guard.snapshot().panic
            started = anyio.current_time()
            response = await client.post("http://a.test" + CHAT, json=BODY)
            assert response.status_code == 200 and anyio.current_time() == started
            assert not guard.snapshot().panic

    run_virtual(main, backend)
    assert [len(r.attempts) for r in records] == [2, 1]


@BACKENDS
def test_without_panic_mode_the_open_circuit_refuses_until_its_cool_down_ends(backend: str) -> None:
    """``panic_threshold=0`` keeps the circuit's refusal: no request until the cool-down ends."""
    fake = FakeReplica("a", [Plan(status=500), Plan()])
    records: list[PhaseRecord] = []

    async def main() -> None:
        policy = RetryPolicy(max_attempts=2, circuit_failures=1, circuit_cooldown=30.0, panic_threshold=0.0)
        guard = virtual_guard({"http://a.test": fake}, records, tiers=TIERS, hedge=None, retry=policy)
        async with guard, guard.http_client() as client:
            assert (await client.post("http://a.test" + CHAT, json=BODY)).status_code == 500
            assert not guard.snapshot().panic
            with pytest.raises(Exception, match="circuit is open"):
                await client.post("http://a.test" + CHAT, json=BODY)
            assert fake.requests == 1  # the circuit opened at the first failure: no retry, no second call
            await anyio.sleep(30.0)
            assert (await client.post("http://a.test" + CHAT, json=BODY)).status_code == 200

    run_virtual(main, backend)


def test_the_sync_sdk_through_the_guard_keeps_sending_to_its_only_replica(servers: list[LoopbackServer]) -> None:
    """The same with ``openai.OpenAI`` (the guard on its background loop thread): the third call succeeds."""
    server = servers[0]
    failing_calls(server, 2)
    with Guard([server.url], tiers=TIERS, hedge=None, budget=ROOMY) as guard:
        client = openai.OpenAI(
            base_url=server.url + "/v1", api_key="k", http_client=guard.http_client_for(openai.OpenAI)
        )
        for i in range(2):
            with pytest.raises(openai.InternalServerError):
                client.chat.completions.create(model="m", messages=prompt(i))
        assert client.chat.completions.create(model="m", messages=prompt(2)).choices[0].message.content
    assert len(server.received) == 7


async def test_a_timeout_waiting_for_the_callers_own_pool_counts_toward_no_circuit(
    servers: list[LoopbackServer],
) -> None:
    """A request that timed out waiting for a free connection of the guard's own pool never reached the replica:
    it is not the replica's failure. Without panic mode a circuit opened by it would refuse the next call, which
    the plain SDK serves."""
    server = servers[0]
    server.scripter = lambda index, attempt: Script(stall_after_first=60.0) if index == 0 else Script()
    policy = RetryPolicy(max_attempts=1, circuit_failures=1, panic_threshold=0.0)
    async with Guard(
        [server.url], tiers=TIERS, hedge=None, retry=policy, pool_limits=httpx.Limits(max_connections=1)
    ) as guard:
        async with guard.http_client(timeout=httpx.Timeout(600.0, pool=0.05)) as client:
            body = {**BODY, "messages": prompt(0)}
            async with client.stream("POST", server.url + CHAT, json=body) as holding:  # the only connection
                assert holding.status_code == 200
                with pytest.raises(httpx.TimeoutException):
                    await client.post(server.url + CHAT, json={**BODY, "messages": prompt(1)})
            assert guard.snapshot().replicas[0].circuit_open_for == 0.0
            served = await client.post(server.url + CHAT, json={**BODY, "messages": prompt(2)})
    assert served.status_code == 200
    assert len(server.received) == 2  # the held stream and the last call: the timed-out one never left
