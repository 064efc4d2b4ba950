"""A background job (the Responses API's ``"background": true``): the server runs it on its own and it goes on when
the connection closes, so its create is sent once it may have reached a server (never hedged, never retried after a
reset), and its stream is handed over as it comes, the opening included, under the tier's first-token deadline."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from llmguard_client import HedgePolicy, PhaseRecord, Tier, TTFTTimeout
from tests.virtual import BACKENDS, FakeReplica, Plan, now, run_virtual, virtual_guard

RESPONSES = "/v1/responses"
BODY: dict[str, Any] = {"model": "m", "input": "x", "stream": True, "background": True}
TIERS = {"interactive": Tier(ttft=5.0, total=20.0, stall=1.0)}


async def read_events(response: httpx.Response, seen: list[tuple[float, bytes]]) -> None:
    """Each chunk the caller reads, with the (virtual) time it read it."""
    async for chunk in response.aiter_raw():
        seen.append((now(), chunk))


@BACKENDS
def test_a_reset_before_the_first_token_is_not_retried_and_the_caller_has_the_id(backend: str) -> None:
    """The connection drops after ``response.created``: a second create would start a second job, which the caller
    could neither resume nor cancel; it gets the error after the id, as without a guard, and the job is started once."""
    replica = FakeReplica("a", [Plan(first_token_after=0.2, reset_after_tokens=0), Plan()])
    records: list[PhaseRecord] = []
    seen: list[tuple[float, bytes]] = []

    async def main() -> None:
        guard = virtual_guard({"http://a.test": replica}, records, tiers=TIERS)
        async with guard, guard.http_client() as client:
            async with client.stream("POST", "http://a.test" + RESPONSES, json=BODY) as response:
                assert response.status_code == 200
                with pytest.raises(httpx.ReadError):
                    await read_events(response, seen)

    run_virtual(main, backend)
    assert replica.requests == 1
    assert b"response.created" in b"".join(chunk for _, chunk in seen)
    record = records[0]
    assert record.one_attempt == "background" and len(record.attempts) == 1
    assert (record.status, record.accepted is not None, record.first_token) == ("error", True, None)


@BACKENDS
def test_a_refused_connection_is_still_retried(backend: str) -> None:
    """Nothing was sent: no job was started, and the create goes again."""
    replica = FakeReplica("a", [Plan(refused=True), Plan()])
    records: list[PhaseRecord] = []

    async def main() -> None:
        guard = virtual_guard({"http://a.test": replica}, records, tiers=TIERS)
        async with guard, guard.http_client() as client:
            response = await client.post("http://a.test" + RESPONSES, json=BODY)
            assert response.status_code == 200 and b"response.completed" in response.content

    run_virtual(main, backend)
    assert replica.requests == 2
    assert [a.outcome for a in records[0].attempts] == ["failed", "won"]


@BACKENDS
def test_a_status_answer_is_the_sdks_to_retry_as_without_a_guard(backend: str) -> None:
    replica = FakeReplica("a", [Plan(status=500), Plan()])
    records: list[PhaseRecord] = []

    async def main() -> None:
        guard = virtual_guard({"http://a.test": replica}, records, tiers=TIERS)
        async with guard, guard.http_client() as client:
            response = await client.post("http://a.test" + RESPONSES, json=BODY)
            assert response.status_code == 500
            assert "x-should-retry" not in response.headers  # unmarked: the SDK's own retry policy applies

    run_virtual(main, backend)
    assert replica.requests == 1


@BACKENDS
def test_it_is_never_hedged(backend: str) -> None:
    """A hedge's losing stream is closed, but its job runs on: two jobs, both billed."""
    fakes = {"http://a.test": FakeReplica("a", [Plan(first_token_after=2.0)]), "http://b.test": FakeReplica("b")}
    records: list[PhaseRecord] = []

    async def main() -> None:
        guard = virtual_guard(fakes, records, tiers=TIERS, hedge=HedgePolicy(delay=0.5))
        async with guard, guard.http_client() as client:
            response = await client.post("http://a.test" + RESPONSES, json=BODY)
            assert response.status_code == 200 and b"a0" in response.content

    run_virtual(main, backend)
    assert (fakes["http://a.test"].requests, fakes["http://b.test"].requests) == (1, 0)
    assert [a.kind for a in records[0].attempts] == ["primary"]


@BACKENDS
def test_its_opening_is_handed_over_as_it_comes(backend: str) -> None:
    """``response.created`` (the id to resume or cancel with) reaches the caller at once, not with the first token
    a reasoning model sends 2 s later; the record still stamps both."""
    replica = FakeReplica("a", [Plan(first_token_after=2.0)])
    records: list[PhaseRecord] = []
    seen: list[tuple[float, bytes]] = []

    async def main() -> None:
        guard = virtual_guard({"http://a.test": replica}, records, tiers=TIERS)
        async with guard, guard.http_client() as client:
            start = now()
            async with client.stream("POST", "http://a.test" + RESPONSES, json=BODY) as response:
                await read_events(response, seen)
            seen[:] = [(t - start, chunk) for t, chunk in seen]

    run_virtual(main, backend)
    assert b"response.created" in seen[0][1] and seen[0][0] == pytest.approx(0.0, abs=1e-6)
    assert b"response.completed" in b"".join(chunk for _, chunk in seen)
    record = records[0]
    assert record.status == "ok"
    assert record.accepted == pytest.approx(record.start, abs=1e-6)
    assert record.first_token == pytest.approx(record.start + 2.0, abs=1e-6)


@BACKENDS
def test_the_ttft_deadline_still_ends_it(backend: str) -> None:
    """No first token within the tier's ttft: the call ends then, the caller already holding the id to resume with."""
    replica = FakeReplica("a", [Plan(first_token_after=3.0)])
    records: list[PhaseRecord] = []
    seen: list[tuple[float, bytes]] = []
    ended: list[float] = []

    async def main() -> None:
        tiers = {"interactive": Tier(ttft=1.0, total=20.0, stall=0.5)}
        guard = virtual_guard({"http://a.test": replica}, records, tiers=tiers)
        async with guard, guard.http_client() as client:
            start = now()
            async with client.stream("POST", "http://a.test" + RESPONSES, json=BODY) as response:
                with pytest.raises(TTFTTimeout):
                    await read_events(response, seen)
                ended.append(now() - start)

    run_virtual(main, backend)
    assert b"response.created" in seen[0][1]
    assert ended == [pytest.approx(1.0, abs=1e-6)]
    assert (records[0].status, records[0].cause) == ("timeout", "ttft_timeout")
    assert replica.requests == 1 and replica.open_streams == 0


@BACKENDS
def test_the_callers_pause_after_the_opening_is_not_the_servers_delay(backend: str) -> None:
    """The caller saves the id from ``response.created`` and comes back 1.5 s later, past a 1 s ttft: its first token
    came at 0.3 s and waited in the connection, so the call is served, as without a guard. A server still silent
    after the ttft, counted without the caller's pauses, ends it: here at 1.5 s, 1 s of it the server's."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(first_token_after=0.3, tokens=3)]),
        "http://b.test": FakeReplica("b", [Plan(first_token_after=3.0)]),
    }
    records: list[PhaseRecord] = []
    ended: list[float] = []

    async def read_after_a_pause(response: httpx.Response, pause: float) -> bytes:
        events = response.aiter_raw()
        opening = await events.__anext__()
        assert b"response.created" in opening
        await anyio.sleep(pause)
        return opening + b"".join([chunk async for chunk in events])

    async def main() -> None:
        tiers = {"interactive": Tier(ttft=1.0, total=20.0, stall=0.5)}
        guard = virtual_guard(fakes, records, tiers=tiers, hedge=None)
        async with guard, guard.http_client() as client:
            async with client.stream("POST", "http://a.test" + RESPONSES, json=BODY) as response:
                assert b"response.completed" in await read_after_a_pause(response, 1.5)
            start = now()
            async with client.stream("POST", "http://b.test" + RESPONSES, json=BODY) as response:
                with pytest.raises(TTFTTimeout):
                    await read_after_a_pause(response, 0.5)
                ended.append(now() - start)

    run_virtual(main, backend)
    assert [r.status for r in records] == ["ok", "timeout"]
    assert ended == [pytest.approx(1.5, abs=1e-6)]


@BACKENDS
def test_the_wait_for_the_first_token_is_not_the_replicas_time_per_token(backend: str) -> None:
    """A background job that reasons 5 s before its first token, then streams fast: its replica is not learnt as
    slow per token (which would drain it from the routing of every other call)."""
    replica = FakeReplica("a", [Plan(first_token_after=5.0, tokens=10, gap=0.01)])
    tpot: list[float | None] = []

    async def main() -> None:
        guard = virtual_guard({"http://a.test": replica}, [], tiers={"batch": Tier(ttft=30.0, total=60.0)})
        async with guard, guard.http_client() as client:
            async with client.stream("POST", "http://a.test" + RESPONSES, json=BODY) as response:
                await response.aread()
            (state,) = guard._replica_set.router.states
            tpot.append(state.health.tpot)

    run_virtual(main, backend)
    assert tpot[0] is not None and tpot[0] < 0.05
