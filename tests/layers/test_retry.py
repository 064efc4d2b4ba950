"""Retries under the shared budget, against real loopback servers; exact instants in virtual time."""

from __future__ import annotations

import errno
import itertools
import math
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import openai
import pytest

from llmguard_client import (
    AllAttemptsFailed,
    AllReplicasCooling,
    BudgetPolicy,
    Guard,
    PhaseRecord,
    RateLimit,
    RetryPolicy,
    Tier,
)
from llmguard_client._budget.budget import BudgetSnapshot
from llmguard_client._layers.retry import Backoff, RetryLayer
from llmguard_client._routing.cooldown import REFUSALS_TO_COOL
from tests.loopback import LoopbackServer, Script
from tests.virtual import BACKENDS, FakeReplica, Plan, now, run_virtual, virtual_guard

CHAT = "/v1/chat/completions"
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}


def make_guard(replicas: list[str], records: list[PhaseRecord], **kwargs: Any) -> Guard:
    kwargs.setdefault("tiers", {"t": Tier(ttft=2.0, total=10.0, stall=2.0)})
    kwargs.setdefault("hedge", None)
    return Guard(replicas=replicas, instrumentation=None, on_record=records.append, **kwargs)


def one_virtual_call(
    backend: str, fakes: dict[str, FakeReplica], tier: Tier | None = None, **guard: Any
) -> tuple[httpx.Response, BudgetSnapshot | None, PhaseRecord]:
    """One call to ``http://a.test`` through a virtual-time Guard (``tier``, else ttft 5 s; no hedging): its answer,
    the budget's snapshot after it, its record."""
    records: list[PhaseRecord] = []
    seen: list[tuple[httpx.Response, BudgetSnapshot | None]] = []

    async def main() -> None:
        tiers = {"t": tier or Tier(ttft=5.0, total=10.0, stall=2.0)}
        async with virtual_guard(fakes, records, tiers=tiers, hedge=None, **guard) as virtual:
            async with virtual.http_client() as client:
                response = await client.post("http://a.test" + CHAT, json=BODY)
            seen.append((response, virtual.snapshot().budget))

    run_virtual(main, backend)
    ((response, budget),), (record,) = seen, records
    return response, budget, record


async def test_429_retry_goes_to_another_replica_without_waiting(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(status=429, headers={"retry-after": "5"})
    records: list[PhaseRecord] = []
    async with make_guard([s.url for s in servers[:2]], records) as guard, guard.http_client() as client:
        response = await client.post(servers[0].url + CHAT, json=BODY)
        assert response.status_code == 200
        first, retry = records[0].attempts
        assert (first.replica, first.status_code, first.retry_after) == (servers[0].url, 429, 5.0)
        assert (retry.kind, retry.replica, retry.outcome) == ("retry", servers[1].url, "won")
        # Not after the Retry-After (5 s); the exact instant is asserted in virtual time (the next test).
        assert first.finish is not None and retry.start - first.finish < 3.0
        # One refusal among calls served holds back no other: new calls are steered away from the replica once it
        # cools, at the third refusal in a row, while another is available.
        for _ in range(3):
            assert (await client.post(servers[0].url + CHAT, json=BODY)).status_code == 200
        cooling = guard.snapshot().replicas[0].cooling_for
    refused = len(servers[0].received)
    assert 1 <= refused <= REFUSALS_TO_COOL and len(servers[1].received) == 4
    assert (cooling > 0.0) == (refused == REFUSALS_TO_COOL)


@BACKENDS
def test_a_429_is_retried_on_another_replica_at_the_instant_it_came(backend: str) -> None:
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(status=429, retry_after="5", headers_after=0.03)]),
        "http://b.test": FakeReplica("b"),
    }
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"t": Tier(ttft=2.0, total=10.0, stall=2.0)}
        async with virtual_guard(fakes, records, tiers=tiers, hedge=None) as guard, guard.http_client() as client:
            response = await client.post("http://a.test" + CHAT, json=BODY)
            assert response.status_code == 200 and b"b0" in response.content

    run_virtual(main, backend)
    first, retry = records[0].attempts
    assert (first.replica, first.status_code, first.retry_after) == ("http://a.test", 429, 5.0)
    assert first.finish == pytest.approx(first.start + 0.03, abs=1e-9)
    assert (retry.kind, retry.replica, retry.outcome) == ("retry", "http://b.test", "won")
    assert retry.start == pytest.approx(first.finish, abs=1e-9)  # no backoff, no Retry-After wait


@BACKENDS
@pytest.mark.parametrize("failure", [Plan(status=500), Plan(refused=True)], ids=["500", "refused"])
def test_a_retry_back_to_the_replica_that_failed_gives_it_a_moment_to_recover(backend: str, failure: Plan) -> None:
    """One replica failing for a moment (a restart, a gateway's blip): its retries wait about
    `RetryPolicy.same_replica_backoff`, then twice that, as an SDK retrying one endpoint does, so the call rides
    through; a retry to another replica that has not failed the call goes at once (the 429 test above)."""
    fakes = {"http://a.test": FakeReplica("a", [failure, failure, Plan()])}
    policy = RetryPolicy(backoff_initial=0.01, same_replica_backoff=0.4)
    response, _, record = one_virtual_call(backend, fakes, retry=policy)
    assert response.status_code == 200
    first, second, third = record.attempts
    assert (first.outcome, second.outcome, third.outcome) == ("failed", "failed", "won")
    assert first.finish is not None and second.finish is not None
    assert 0.3 <= second.start - first.finish <= 0.4  # [3/4, 1] x 0.4
    assert 0.6 <= third.start - second.finish <= 0.8  # [3/4, 1] x 0.8: the replica failed the call twice


@BACKENDS
@pytest.mark.parametrize("status", [429, 503])
def test_a_retry_back_to_a_replica_that_asked_for_a_short_wait_waits_that_not_the_same_replica_backoff(
    backend: str, status: int
) -> None:
    """One endpoint asking twice for 0.3 s of rest: the server's word replaces the same-replica backoff (0.375-0.5 s,
    then 0.75-1 s), as it replaces the SDKs' backoff, so each retry goes when the plain SDK's does (a longer wait
    could miss a deadline the plain SDK's retries meet)."""
    paced = Plan(status=status, retry_after="0.3")
    fakes = {"http://a.test": FakeReplica("a", [paced, paced, Plan()])}
    response, _, record = one_virtual_call(backend, fakes, retry=RetryPolicy(backoff_initial=0.01))
    assert response.status_code == 200
    first, second, third = record.attempts
    assert first.finish is not None and second.finish is not None
    assert 0.3 - 1e-9 <= second.start - first.finish <= 0.3 + 0.01 + 1e-9  # at most the ordinary backoff's 0.01 s
    assert 0.3 - 1e-9 <= third.start - second.finish <= 0.3 + 0.02 + 1e-9


@BACKENDS
def test_after_an_overload_of_both_replicas_the_retry_back_to_the_first_gives_it_a_moment(backend: str) -> None:
    """Two replicas answering 503 without a Retry-After: the retry to the second goes at once (it has not failed
    the call), the one back to the first waits the same-replica backoff, as with that replica alone."""
    busy = Plan(status=503)
    fakes = {"http://a.test": FakeReplica("a", [busy, Plan()]), "http://b.test": FakeReplica("b", [busy, Plan()])}
    policy = RetryPolicy(backoff_initial=0.01, same_replica_backoff=0.4)
    response, _, record = one_virtual_call(backend, fakes, retry=policy)
    assert response.status_code == 200
    first, second, third = record.attempts
    assert first.replica != second.replica and third.replica == first.replica
    assert first.finish is not None and second.finish is not None
    assert second.start == pytest.approx(first.finish, abs=1e-9)  # to the other replica at once
    assert 0.3 - 1e-9 <= third.start - second.finish <= 0.4 + 1e-9  # back to the first: [3/4, 1] x 0.4


@BACKENDS
@pytest.mark.parametrize(
    "pause",
    [Plan(status=429, retry_after="1"), Plan(status=429), Plan(status=503, retry_after="1")],
    ids=["429 Retry-After", "429", "503 Retry-After"],
)
def test_with_one_replica_down_the_retry_goes_back_to_the_one_that_answered(backend: str, pause: Plan) -> None:
    """One replica of two refuses connections; the other answers the call with a 429 or a 503 asking for a pause,
    then serves: the retry after the dead one's refusal goes back to the live one (after its pause), not to the
    dead one again, so the call is served as the plain SDK on the live one alone serves it."""
    fakes = {
        "http://a.test": FakeReplica("a", [pause, Plan()]),
        "http://b.test": FakeReplica("b", [Plan(refused=True)]),
    }
    response, _, record = one_virtual_call(backend, fakes, retry=RetryPolicy(backoff_initial=0.01))
    assert response.status_code == 200
    assert [a.replica for a in record.attempts].count("http://b.test") == 1
    assert record.attempts[-1].replica == "http://a.test" and record.attempts[-1].outcome == "won"


@BACKENDS
def test_a_replica_that_refused_then_came_back_gets_the_call_once_the_other_refuses_every_call(
    backend: str,
) -> None:
    """One replica refuses every call 429 (Retry-After: 1), the other refused the connection once and is back (a
    restart): the returns go to the one that answered until its refusals in a row say it refuses every call, then
    to the one back up, which serves the call."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(status=429, retry_after="1")]),
        "http://b.test": FakeReplica("b", [Plan(refused=True), Plan()]),
    }
    response, _, record = one_virtual_call(backend, fakes, retry=RetryPolicy(backoff_initial=0.01, max_attempts=5))
    assert response.status_code == 200
    assert record.attempts[-1].replica == "http://b.test" and record.attempts[-1].outcome == "won"
    assert fakes["http://a.test"].requests == REFUSALS_TO_COOL


@BACKENDS
def test_a_replica_that_dropped_the_connection_is_no_refusal_and_keeps_its_retry(backend: str) -> None:
    """One replica refuses every call 429 (Retry-After: 1), the other dropped its first request without an answer
    (a reset, not a refused connection): the retry goes back to the one that dropped it, as the router chooses,
    and it serves the call."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(status=429, retry_after="1")]),
        "http://b.test": FakeReplica("b", [Plan(reset_before_headers=True), Plan()]),
    }
    response, _, record = one_virtual_call(backend, fakes, retry=RetryPolicy(backoff_initial=0.01))
    assert response.status_code == 200
    assert record.attempts[-1].replica == "http://b.test"


@BACKENDS
def test_with_the_other_replica_down_the_caller_gets_the_last_server_answer(backend: str) -> None:
    """One replica answers 429 with a Retry-After longer than the guard waits (not sent there again), the other
    refuses connections: the call ends with the server's 429, as the plain SDK on the live replica gets it, not
    with a connection error no server made."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(status=429, retry_after="86400")]),
        "http://b.test": FakeReplica("b", [Plan(refused=True)]),
    }
    response, _, record = one_virtual_call(backend, fakes, retry=RetryPolicy(backoff_initial=0.01))
    assert response.status_code == 429
    assert fakes["http://a.test"].requests == 1 and fakes["http://b.test"].requests >= 1
    assert record.attempts[-1].replica == "http://b.test"  # the answer came before the refused connections


@BACKENDS
@pytest.mark.parametrize("budget", [BudgetPolicy(), BudgetPolicy(ratio=0.0, floor=0)], ids=["room", "empty"])
def test_a_retry_back_to_the_replica_that_asked_for_a_wait_goes_when_the_wait_ends_whatever_the_budget(
    backend: str, budget: BudgetPolicy
) -> None:
    """One hosted endpoint answering 429 with Retry-After (a provider's rate limit): the call's retry goes back
    when the server's wait ends, not at the cool-down's probe (halfway), and an empty budget does not stop it:
    the server paced it, as the plain SDK would send it."""
    fakes = {"http://a.test": FakeReplica("a", [Plan(status=429, retry_after="2", headers_after=0.01), Plan()])}
    response, snapshot, record = one_virtual_call(backend, fakes, budget=budget)
    assert response.status_code == 200
    past_the_bound = 1 if budget.floor == 0 else 0  # paid while the budget has room
    assert snapshot is not None and (snapshot.paced, snapshot.spent, snapshot.refused) == (past_the_bound, 1, 0)
    first, retry = record.attempts
    assert (first.status_code, retry.kind, retry.outcome) == (429, "retry", "won")
    assert first.finish is not None and retry.start - first.finish == pytest.approx(2.0, abs=1e-6)  # when the wait ends


@BACKENDS
@pytest.mark.parametrize("status", [503, 529])
def test_a_503_without_retry_after_from_the_only_replica_is_retried_at_its_probe_while_the_budget_has_room(
    backend: str, status: int
) -> None:
    """With room in the budget, an engine's 503 (or 529) without a Retry-After is retried as the plain SDK retries it,
    after a short backoff (the cool-down's early probe), not at the end of the cool-down standing in for the missing
    Retry-After: a call in a tier whose first-token deadline is shorter than that cool-down is still served."""
    fakes = {"http://a.test": FakeReplica("a", [Plan(status=status, headers_after=0.01), Plan()])}
    response, snapshot, record = one_virtual_call(backend, fakes, retry=RetryPolicy(overload_cooldown=4.0))
    assert snapshot is not None and response.status_code == 200 and snapshot.paced == 0
    first, retry_attempt = record.attempts
    assert first.finish is not None and retry_attempt.start - first.finish <= 2.0


@BACKENDS
@pytest.mark.parametrize("status", [429, 503, 529])
def test_an_overload_answer_without_retry_after_from_the_only_replica_is_paced_by_the_cool_down(
    backend: str, status: int
) -> None:
    """One hosted endpoint answering a 429, 503 or 529 with no Retry-After (some gateways and vLLM send none): the
    guard's own cool-down stands in for the wait, so the retry goes back when it ends and passes an empty budget,
    as the plain SDK would retry. A 429 (the server refused this client) cools it at once and is paced from the
    start; a 503 or a 529 cools it at the `REFUSALS_TO_COOL`-th in a row (an engine whose queue is full): the retries
    before it go after the same-replica backoff, refused by the budget first (counted), then paced, as there is
    nowhere else to go."""
    refusals = 1 if status == 429 else REFUSALS_TO_COOL
    fakes = {"http://a.test": FakeReplica("a", [*[Plan(status=status, headers_after=0.01)] * refusals, Plan()])}
    retry = RetryPolicy(overload_cooldown=1.5, max_attempts=refusals + 1)
    response, snapshot, record = one_virtual_call(backend, fakes, budget=BudgetPolicy(ratio=0.0, floor=0), retry=retry)
    assert snapshot is not None and response.status_code == 200
    assert (snapshot.paced, snapshot.refused) == (refusals, 0 if status == 429 else refusals)
    *refused, cooled, retry_attempt = record.attempts
    assert [a.status_code for a in (*refused, cooled)] == [status] * refusals
    run = [*refused, cooled]
    for before, after in itertools.pairwise(run):
        assert before.finish is not None and after.start - before.finish <= 1.0  # the same-replica backoff
    assert (retry_attempt.kind, retry_attempt.outcome) == ("retry", "won")
    assert cooled.finish is not None and retry_attempt.start == pytest.approx(cooled.finish + 1.5, abs=1e-6)


def two_calls(
    backend: str, fakes: dict[str, FakeReplica], retry: RetryPolicy, budget: BudgetPolicy, second_after: float
) -> tuple[dict[str, int], BudgetSnapshot, list[PhaseRecord]]:
    """Two calls (tier ttft 5 s), the second ``second_after`` s after the first: their answers' statuses (by
    ``first`` / ``second``), the budget at the end, and their records in the order they started."""
    records: list[PhaseRecord] = []
    answers: dict[str, int] = {}
    snapshots: list[BudgetSnapshot] = []

    async def main() -> None:
        tiers = {"t": Tier(ttft=5.0, total=10.0, stall=2.0)}
        async with virtual_guard(fakes, records, tiers=tiers, hedge=None, retry=retry, budget=budget) as virtual:
            async with virtual.http_client() as client, anyio.create_task_group() as tg:

                async def call(name: str, after: float) -> None:
                    await anyio.sleep(after)
                    answers[name] = (await client.post("http://a.test" + CHAT, json=BODY)).status_code

                tg.start_soon(call, "first", 0.0)
                tg.start_soon(call, "second", second_after)
            snapshot = virtual.snapshot().budget
            assert snapshot is not None
            snapshots.append(snapshot)

    run_virtual(main, backend)
    return answers, snapshots[0], sorted(records, key=lambda r: r.start)


@BACKENDS
@pytest.mark.parametrize("status", [408, 502])
def test_a_streak_of_failures_on_the_only_replica_is_paced_by_a_cool_down_once_the_budget_is_empty(
    backend: str, status: int
) -> None:
    """One endpoint (a proxy whose backend restarts, or that times out on every request) answering 502s or 408s to
    every call, so its circuit has opened (here after one call: ``circuit_failures=1``): the budget pays the first
    retry with the normal backoff; when it is empty, the call does not end: the replica cools for
    `overload_cooldown`, the retry goes at the cool-down's end, and a new call waits for the cool-down's probe
    instead of adding load. That probe failing too renews the cool-down, and its own retry goes at the end of that
    one. (A 408 opened no circuit: the retries went past the budget after the backoff alone, not paced by a
    cool-down.)"""
    failing = Plan(status=status, headers_after=0.01)
    fakes = {"http://a.test": FakeReplica("a", [failing, failing, failing, Plan()])}
    retry = RetryPolicy(backoff_initial=0.01, same_replica_backoff=0.2, overload_cooldown=1.0, circuit_failures=1)
    # The second call starts after the first's budget-paid retry failed.
    answers, snapshot, (first, second) = two_calls(backend, fakes, retry, BudgetPolicy(ratio=0.0, floor=1), 0.3)
    assert (snapshot.paced, snapshot.refused, snapshot.spent) == (2, 2, 3)
    assert answers == {"first": 200, "second": 200}
    assert [(a.status_code, a.outcome) for a in first.attempts] == [
        (status, "failed"),
        (status, "failed"),
        (200, "won"),
    ]
    assert [(a.status_code, a.outcome) for a in second.attempts] == [(status, "failed"), (200, "won")]
    paid, emptied, paced = first.attempts
    assert paid.finish is not None and emptied.finish is not None
    assert 0.1 <= emptied.start - paid.finish <= 0.2  # the budget paid it: the normal backoff
    assert paced.start == pytest.approx(emptied.finish + 1.0, abs=1e-6)  # at the cool-down's end
    probe, retried = second.attempts
    assert probe.start == pytest.approx(emptied.finish + 0.5, abs=1e-6)  # waited for the cool-down's probe
    assert probe.finish is not None and retried.start == pytest.approx(probe.finish + 1.0, abs=1e-6)


ROOM_LEFT = {
    "openai": {"x-ratelimit-remaining-requests": "59", "x-ratelimit-remaining-tokens": "1200"},
    "anthropic": {
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-tokens-remaining": "1000",
        "anthropic-ratelimit-input-tokens-remaining": "1000",
        "anthropic-ratelimit-output-tokens-remaining": "8000",
    },
    "none left": {"x-ratelimit-remaining-requests": "59", "x-ratelimit-remaining-tokens": "0"},
    "no headers": {},
}


@BACKENDS
@pytest.mark.parametrize("limit", [None, RateLimit(requests_per_minute=600)], ids=["plain", "rate_limit"])
@pytest.mark.parametrize("headers", list(ROOM_LEFT), ids=list(ROOM_LEFT))
def test_a_429_reporting_room_left_refuses_that_request_only_and_cools_nothing(
    backend: str, headers: str, limit: RateLimit | None
) -> None:
    """One hosted endpoint limiting tokens per minute refuses one big request (429, Retry-After: 5) while its
    rate-limit headers report room left in every limit: the request was refused for its own size, not the
    endpoint for everyone, so another call started meanwhile is sent at once and served, and only the big call's
    retry waits out the Retry-After. So is one with no rate-limit headers (one refusal among calls served holds back
    no other). A 429 reporting no room left in a limit (spent for every caller) cools the endpoint at once: the
    other call waits for the cool-down's first probe (a second in)."""
    refused = Plan(status=429, retry_after="5", headers_after=0.01, headers=ROOM_LEFT[headers])
    fakes = {"http://a.test": FakeReplica("a", [refused, Plan()])}
    records: list[PhaseRecord] = []
    answers: dict[str, int] = {}

    async def main() -> None:
        tiers = {"t": Tier(ttft=10.0, total=20.0, stall=2.0)}
        async with virtual_guard(fakes, records, tiers=tiers, hedge=None, rate_limit=limit) as virtual:
            async with virtual.http_client() as client, anyio.create_task_group() as tg:

                async def call(name: str, after: float) -> None:
                    await anyio.sleep(after)
                    answers[name] = (await client.post("http://a.test" + CHAT, json=BODY)).status_code

                tg.start_soon(call, "big", 0.0)
                tg.start_soon(call, "small", 0.5)

    run_virtual(main, backend)
    assert answers == {"big": 200, "small": 200}
    big, small = sorted(records, key=lambda r: r.start)
    first, retry = big.attempts
    (sent,) = small.attempts
    assert (first.status_code, retry.kind, retry.outcome, sent.outcome) == (429, "retry", "won", "won")
    assert first.finish is not None and retry.start - first.finish == pytest.approx(5.0, abs=1e-6)
    if headers != "none left":
        assert sent.start == pytest.approx(small.start, abs=1e-6)  # at once: nothing cooled
    else:
        assert sent.start == pytest.approx(first.finish + 1.0, abs=1e-6)  # the cool-down's first probe


@BACKENDS
@pytest.mark.parametrize("status", [408, 502, 503, 529])
def test_an_only_replica_failing_some_calls_retries_them_past_an_empty_budget_and_holds_back_no_other(
    backend: str, status: int
) -> None:
    """A 408 (a request timeout from the server or a load balancer in front of it), a 502, or an overload answer
    without a Retry-After (a 503, the hosted Anthropic API's 529) on the only replica, with the budget empty: the
    retry goes past the budget after the same-replica backoff, as the SDKs' would (a 408 used to be handed back at
    once, final), and a call started meanwhile is sent at once. (All used to cool the replica for
    `overload_cooldown`: a replica answering 20 % of its calls with a 408 or a 500 served a quarter of what the
    plain SDK did, and one answering half its calls 529 made them wait about 1 s each, every call waiting for the
    cool-down's probe.)"""
    fakes = {"http://a.test": FakeReplica("a", [Plan(status=status, headers_after=0.01), Plan(), Plan()])}
    retry = RetryPolicy(backoff_initial=0.01, same_replica_backoff=0.2, overload_cooldown=1.5)
    # The other call starts after the first answer, before its retry.
    answers, snapshot, (failing, other) = two_calls(backend, fakes, retry, BudgetPolicy(ratio=0.0, floor=0), 0.05)
    assert (snapshot.paced, snapshot.refused) == (1, 1)
    assert answers == {"first": 200, "second": 200}
    first, retried = failing.attempts
    assert (first.status_code, retried.kind, retried.outcome) == (status, "retry", "won")
    assert first.finish is not None and 0.1 <= retried.start - first.finish <= 0.2  # the same-replica backoff
    assert len(other.attempts) == 1 and other.attempts[0].start - first.start == pytest.approx(0.05, abs=1e-6)


@BACKENDS
@pytest.mark.parametrize("mode", ["guard", "cooperative"])
@pytest.mark.parametrize("status", [408, 500])
def test_a_replica_failing_every_call_with_a_408_is_kept_away_as_one_failing_with_a_500(
    backend: str, status: int, mode: str
) -> None:
    """Two replicas, one failing every chat call with a 408 (it times out on every request, as a replica whose
    engine hangs behind a proxy's request timeout does) or a 500; 30 non-streaming calls through the openai SDK
    (``max_retries=2``), 2 at a time, default tier and budget, the guard or the SDK sending the retries. Every call
    is served, as by the healthy replica alone, and the failing one gets a few requests only: its failures
    count toward its circuit and its failure rate, which keeps the calls away from it. (A 408 counted toward
    neither: the failing replica kept its share of the first attempts, each retry paid from the budget, and once
    that was empty the calls ended with its 408: about half of them, where a round-robin plain SDK served all.)"""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(first_token_after=0.02)]),
        "http://b.test": FakeReplica("b", [Plan(status=status, headers_after=0.001)]),
    }
    records: list[PhaseRecord] = []
    answers: list[str] = []  # the replica that served each call, or the status it ended with

    async def main() -> None:
        retry = RetryPolicy(mode="cooperative") if mode == "cooperative" else RetryPolicy()
        async with virtual_guard(fakes, records, retry=retry) as virtual:
            client = openai.AsyncOpenAI(
                base_url="http://a.test/v1", api_key="k", http_client=virtual.http_client_for(openai.AsyncOpenAI)
            )
            limiter = anyio.CapacityLimiter(2)

            async def call() -> None:
                async with limiter:
                    try:
                        done = await client.chat.completions.create(
                            model="m", messages=[{"role": "user", "content": "x"}]
                        )
                    except openai.APIStatusError as error:
                        answers.append(str(error.status_code))
                    else:
                        answers.append(done.choices[0].message.content or "")

            async with anyio.create_task_group() as tg:
                for _ in range(30):
                    tg.start_soon(call)
            await client.close()

    run_virtual(main, backend)
    assert answers == ["a"] * 30
    assert fakes["http://a.test"].requests == 30
    assert 1 <= fakes["http://b.test"].requests <= 3  # kept away after its first failures


@BACKENDS
@pytest.mark.parametrize("status", [500, 502])
def test_with_another_replica_left_a_refused_retry_goes_paced_after_the_same_replica_backoff(
    backend: str, status: int
) -> None:
    """Two replicas failing with a 5xx that is no overload answer, the budget empty: the retry at once to the other
    one is extra load the budget bounds, so it is refused; it goes instead, paced past the bound, after the
    same-replica backoff (0.375-0.5 s, then 0.75-1 s), as the plain SDK's retry would: the call gets the plain SDK's
    3 requests, not more, and no replica is cooled for failing. (It used to end the call at once,
    ``budget_exhausted``, final for the SDK, where the plain SDK's retries might have served it.)"""
    fakes = {
        url: FakeReplica(url[7], [Plan(status=status, headers_after=0.01)])
        for url in ("http://a.test", "http://b.test")
    }
    records: list[PhaseRecord] = []
    cooling: list[float] = []
    snapshots: list[BudgetSnapshot] = []

    async def main() -> None:
        tiers = {"t": Tier(ttft=5.0, total=10.0, stall=2.0)}
        budget = BudgetPolicy(ratio=0.0, floor=0)
        async with virtual_guard(fakes, records, tiers=tiers, hedge=None, budget=budget) as virtual:
            async with virtual.http_client() as client:
                response = await client.post("http://a.test" + CHAT, json=BODY)
            assert response.status_code == status and response.headers["x-should-retry"] == "false"
            cooling.extend(r.cooling_for for r in virtual.snapshot().replicas)
            snapshot = virtual.snapshot().budget
            assert snapshot is not None
            snapshots.append(snapshot)

    run_virtual(main, backend)
    (record,), (snapshot,) = records, snapshots
    first, second, third = record.attempts
    assert {first.replica, second.replica} == {"http://a.test", "http://b.test"}  # the other one first
    assert sum(f.requests for f in fakes.values()) == 3
    assert (snapshot.paced, snapshot.refused) == (2, 2)
    assert first.finish is not None and 0.25 <= second.start - first.finish <= 0.5
    assert second.finish is not None and 0.5 <= third.start - second.finish <= 1.0
    assert not any(c > 0 for c in cooling)


@BACKENDS
@pytest.mark.parametrize(
    ("status", "retry_after"), [(429, "2"), (503, "2"), (429, None)], ids=["429", "503", "429-no-retry-after"]
)
def test_with_another_replica_left_a_refused_retry_goes_back_paced_to_the_replica_that_asked_to_wait(
    backend: str, status: int, retry_after: str | None
) -> None:
    """Two replicas, an empty budget (hedges or other calls spent it): a 429, or a 503 with a Retry-After, on one.
    The retry at once to the other is extra load the budget bounds, so it is refused; the call then goes back to
    the replica that asked, when its wait ends (a 429 without one: the guard's cool-down, here 1.5 s), past the
    budget, as with that replica alone and as the plain SDK would retry (it used to end at once with
    ``budget_exhausted``, where one replica or the plain SDK served it)."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(status=status, retry_after=retry_after, headers_after=0.01), Plan()]),
        "http://b.test": FakeReplica("b"),
    }
    budget, retry = BudgetPolicy(ratio=0.0, floor=0), RetryPolicy(overload_cooldown=1.5)
    response, snapshot, record = one_virtual_call(backend, fakes, budget=budget, retry=retry)
    assert response.status_code == 200 and b"a0" in response.content
    assert snapshot is not None and (snapshot.paced, snapshot.refused) == (1, 1)
    first, retry_attempt = record.attempts
    assert (first.status_code, retry_attempt.kind, retry_attempt.replica) == (status, "retry", "http://a.test")
    assert retry_attempt.outcome == "won" and first.finish is not None
    assert retry_attempt.start - first.finish == pytest.approx(
        2.0 if retry_after else 1.5, abs=1e-6
    )  # when the wait ends
    assert fakes["http://b.test"].requests == 0


@BACKENDS
@pytest.mark.parametrize("status", [503, 529])
def test_an_overload_answer_without_retry_after_is_retried_on_a_ready_replica_past_an_empty_budget(
    backend: str, status: int
) -> None:
    """Two replicas, an empty budget: an engine's 503 (its queue full) or 529 without a Retry-After on one, the
    other ready. The retry goes to the ready one at once, past the budget, as the plain SDK's retry would be sent
    (it used to end the call, ``budget_exhausted``, marked final for the SDK)."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(status=status, headers_after=0.01)]),
        "http://b.test": FakeReplica("b"),
    }
    response, snapshot, record = one_virtual_call(backend, fakes, budget=BudgetPolicy(ratio=0.0, floor=0))
    assert response.status_code == 200 and b"b0" in response.content
    assert snapshot is not None and (snapshot.paced, snapshot.refused) == (1, 1)
    first, retry_attempt = record.attempts
    assert (first.status_code, retry_attempt.replica) == (status, "http://b.test")
    assert first.finish is not None and retry_attempt.start == pytest.approx(first.finish, abs=1e-6)


@BACKENDS
def test_a_call_the_only_replica_serves_ends_the_cool_down_its_refusals_without_retry_after_set(backend: str) -> None:
    """One endpoint refuses three calls in a row with a 503 and no Retry-After (here unretried), so the guard cools
    it itself; a call sent before them is then served (its first token 0.3 s in): the endpoint has room, so the
    cool-down ends there, and a call started after it is sent at once, not held for the cool-down's probe (0.5 s in
    a 1 s cool-down). A probe's answer ends a cool-down a server asked for (a Retry-After), as before."""
    refused = Plan(status=503, headers_after=0.01)
    fakes = {"http://a.test": FakeReplica("a", [Plan(first_token_after=0.3), refused, refused, refused, Plan()])}
    records: list[PhaseRecord] = []
    cooled: list[float] = []

    async def main() -> None:
        tiers = {"t": Tier(ttft=5.0, total=10.0, stall=2.0)}
        retry = RetryPolicy(max_attempts=1)
        async with virtual_guard(fakes, records, tiers=tiers, hedge=None, retry=retry) as virtual:
            async with virtual.http_client() as client, anyio.create_task_group() as tg:

                async def call(after: float) -> None:
                    await anyio.sleep(after)
                    await client.post("http://a.test" + CHAT, json=BODY)

                tg.start_soon(call, 0.0)
                for n in range(REFUSALS_TO_COOL):
                    tg.start_soon(call, 0.01 * (n + 1))
                await anyio.sleep(0.1)
                cooled.append(virtual.snapshot().replicas[0].cooling_for)
                tg.start_soon(call, 0.25)  # 0.35 s in: after the first call's first token

    run_virtual(main, backend)
    assert cooled[0] > 0.5  # the refusals cooled it
    served, *refusals, last = sorted(records, key=lambda r: r.start)
    assert [r.attempts[0].status_code for r in refusals] == [503] * REFUSALS_TO_COOL
    assert served.status == "ok" and last.status == "ok"
    assert last.attempts[0].start - last.start == pytest.approx(0.0, abs=1e-6)  # sent at once, not at the probe


@BACKENDS
@pytest.mark.parametrize("status", [503, 529])
def test_replicas_refusing_some_calls_with_overload_retry_them_on_each_other_past_an_empty_budget(
    backend: str, status: int
) -> None:
    """Two replicas each refusing some calls with an overload answer and no Retry-After (the hosted Anthropic API's
    529 to half the calls, at random), an empty budget: a call refused by both is retried a third time on one of
    them, past the budget, and served, as the plain SDK's third request to one of them would be. (Each refusal
    used to cool its replica: with both cooling, none was ready, and the call ended ``budget_exhausted`` after two
    requests; through the anthropic SDK, 33 of 60 calls were served where the plain SDK on one replica served 52.)"""
    fakes = {
        url: FakeReplica(url[7], [Plan(status=status, headers_after=0.01), Plan()])
        for url in ("http://a.test", "http://b.test")
    }
    response, snapshot, record = one_virtual_call(backend, fakes, budget=BudgetPolicy(ratio=0.0, floor=0))
    assert response.status_code == 200
    assert snapshot is not None and (snapshot.paced, snapshot.refused) == (2, 2)
    first, second, third = record.attempts
    assert (first.status_code, second.status_code, third.outcome) == (status, status, "won")
    assert first.replica != second.replica and third.kind == "retry"


@BACKENDS
def test_an_overload_of_every_replica_without_retry_after_gets_no_retry_past_an_empty_budget(backend: str) -> None:
    """Three replicas answering every call 503 without a Retry-After (a fleet-wide overload), an empty budget, ten
    calls 0.1 s apart: each replica cools at its `REFUSALS_TO_COOL`-th refusal in a row (3), so only the first three
    calls find one ready to retry on, past the budget; the others end after one request each. The servers see 16
    requests (12 when each replica cooled at its first refusal: the 2 refusals more per replica before it cools
    account for the rest), where retries past the budget to wherever a replica was ready would have sent up to 3 a
    call."""
    fakes = {
        url: FakeReplica(url[7], [Plan(status=503, headers_after=0.01)])
        for url in ("http://a.test", "http://b.test", "http://c.test")
    }
    records: list[PhaseRecord] = []

    async def main() -> None:
        async with virtual_guard(fakes, records, budget=BudgetPolicy(ratio=0.0, floor=0), hedge=None) as virtual:
            async with virtual.http_client() as client:
                for _ in range(10):
                    assert (await client.post("http://a.test" + CHAT, json=BODY)).status_code == 503
                    await anyio.sleep(0.1)

    run_virtual(main, backend)
    assert sum(f.requests for f in fakes.values()) == 16
    assert [len(r.attempts) for r in records] == [3, 3, 3, *[1] * 7]


@dataclass
class FullQueue(FakeReplica):
    """An engine serving at most ``room`` calls at once (as its plans say) and answering the others at once with
    a 503 and no Retry-After, as vLLM answers a non-streaming call past ``--max-num-queued-reqs``."""

    room: int = 2
    busy: int = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.busy >= self.room:
            self.requests += 1
            await anyio.sleep(0.005)
            return httpx.Response(503, json={"error": {"message": "the queue is full", "type": "x"}})
        self.busy += 1
        try:
            return await super().handle_async_request(request)  # its plans: each call takes 0.4 s
        finally:
            self.busy -= 1


@BACKENDS
def test_bursts_past_an_engines_full_queue_are_all_served_with_an_idle_replica_beside_it(backend: str) -> None:
    """One engine with room for 2 calls answering the others 503 without a Retry-After (its queue is full), one
    with room to spare: 48 non-streaming openai calls (``max_retries=2``) in bursts of 8, one second apart, default
    budget. Every call is served: once the budget is empty, a 503's retry elsewhere is refused and goes back, paced,
    to the full engine at its cool-down's end. (It used to end the call, ``budget_exhausted``, marked final for the
    SDK: 10 of 48 calls failed on two vLLM engines where the plain SDK, alternating them, failed 3-5.)"""
    takes = [Plan(first_token_after=0.4)]
    fakes = {"http://a.test": FullQueue("a", takes), "http://b.test": FakeReplica("b", takes)}
    records: list[PhaseRecord] = []
    failed: list[str] = []
    snapshots: list[BudgetSnapshot] = []

    async def main() -> None:
        async with virtual_guard(fakes, records, tiers={"interactive": Tier(ttft=10.0, total=30.0)}) as virtual:
            client = openai.AsyncOpenAI(
                base_url="http://a.test/v1", api_key="k", http_client=virtual.http_client_for(openai.AsyncOpenAI)
            )

            async def call() -> None:
                try:
                    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
                except openai.APIStatusError as error:
                    failed.append(error.response.headers.get("x-llmguard-cause", str(error.status_code)))

            for _ in range(6):
                async with anyio.create_task_group() as tg:
                    for _ in range(8):
                        tg.start_soon(call)
                await anyio.sleep(1.0)
            await client.close()
            budget = virtual.snapshot().budget
            assert budget is not None
            snapshots.append(budget)

    run_virtual(main, backend)
    (budget,) = snapshots
    assert failed == [] and len(records) == 48
    assert budget.refused > 0 and budget.paced > 0  # the budget ran dry; the paced retries served the calls
    assert fakes["http://a.test"].requests > 2  # the full engine was retried, not only the idle one


@BACKENDS
def test_with_another_replica_left_a_refused_retry_does_not_go_back_past_max_retry_after(backend: str) -> None:
    """A Retry-After longer than the guard waits (`RetryPolicy.max_retry_after`) excludes its replica from the call:
    with the budget refusing the retry to the other, the caller gets the answer at once."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(status=429, retry_after="3")]),
        "http://b.test": FakeReplica("b"),
    }
    budget, retry = BudgetPolicy(ratio=0.0, floor=0), RetryPolicy(max_retry_after=2.0)
    response, snapshot, record = one_virtual_call(backend, fakes, budget=budget, retry=retry)
    assert response.status_code == 429 and response.headers["x-llmguard-cause"] == "budget_exhausted"
    assert snapshot is not None and (snapshot.paced, snapshot.refused) == (0, 1)
    assert len(record.attempts) == 1 and fakes["http://b.test"].requests == 0


@BACKENDS
def test_a_quota_answer_from_every_replica_is_final_at_once_without_waiting_for_a_probe(backend: str) -> None:
    """Every replica answering a quota's 429 (``Retry-After: 86400``, longer than the guard waits): the call that got
    it goes at once to another replica that is ready, and when none is, the answer is final at once, marked
    ``x-should-retry: false``: no wait for the cooling replicas' probes (before: each call sent a third request to
    the first replica's probe, 1-2 s later, where the plain SDK returns at once)."""
    quota = [Plan(status=429, retry_after="86400")]
    fakes = {"http://a.test": FakeReplica("a", quota), "http://b.test": FakeReplica("b", quota)}
    records: list[PhaseRecord] = []
    seen: list[tuple[httpx.Response, float, float]] = []

    async def main() -> None:
        async with virtual_guard(fakes, records, tiers={"t": Tier(ttft=5.0, total=10.0)}, hedge=None) as virtual:
            async with virtual.http_client() as client:
                for _ in range(2):
                    start = anyio.current_time()
                    response = await client.post("http://a.test" + CHAT, json=BODY)
                    seen.append((response, start, anyio.current_time()))

    run_virtual(main, backend)
    for (response, start, end), record in zip(seen, records, strict=True):
        assert response.status_code == 429 and response.headers["x-should-retry"] == "false"
        assert end == start and 1 <= len(record.attempts) <= 2
    assert len(records[0].attempts) == 2  # the other replica was ready for the first call's retry
    assert fakes["http://a.test"].requests + fakes["http://b.test"].requests == 3


@BACKENDS
@pytest.mark.parametrize("status", [429, 500, 503])
def test_an_answer_the_server_marked_not_to_retry_is_not_retried_anywhere(backend: str, status: int) -> None:
    """``x-should-retry: false`` is the server's word that the request must not be sent again (the openai and
    anthropic SDKs obey it before looking at the status): one request, as through the plain SDK, not three."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(status=status, headers={"x-should-retry": "false"})]),
        "http://b.test": FakeReplica("b"),
    }
    response, snapshot, record = one_virtual_call(backend, fakes)
    assert response.status_code == status and response.headers["x-should-retry"] == "false"
    assert len(record.attempts) == 1 and fakes["http://b.test"].requests == 0
    assert snapshot is not None and snapshot.spent == 0


async def test_all_cooling_past_the_deadline_fails_at_once_with_retry_after(servers: list[LoopbackServer]) -> None:
    for server in servers[:2]:
        server.script = Script(status=429, headers={"retry-after": "30"})
    records: list[PhaseRecord] = []
    async with make_guard([s.url for s in servers[:2]], records) as guard, guard.http_client() as client:
        for _ in range(REFUSALS_TO_COOL - 1):  # refusals in a row on both: the next one on each cools it
            await client.post(servers[0].url + CHAT, json=BODY, headers={"x-llmguard-max-attempts": "2"})
        assert sorted(len(s.received) for s in servers[:2]) == [REFUSALS_TO_COOL - 1] * 2
        started = time.monotonic()
        response = await client.post(servers[0].url + CHAT, json=BODY, headers={"x-stainless-lang": "python"})
        elapsed = time.monotonic() - started
    assert elapsed < 10.0  # at once: not the 30 s the servers asked for (the instant: virtual time, above)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "30"  # the server's own answer, handed back
    assert response.headers["x-should-retry"] == "false"
    assert response.headers["x-llmguard-cause"] == "all_replicas_cooling"
    assert len(records[-1].attempts) == 2 and records[-1].status == "rejected"


async def test_an_answer_off_the_generation_paths_does_not_cool_the_replica_for_generation_calls(
    servers: list[LoopbackServer],
) -> None:
    """An embeddings 429 (that model's own rate limit) is the SDK's to retry: it does not cool the replica, so
    a chat call beside it is served at once, as through the plain SDK (before: refused, ``all_replicas_cooling``,
    for the 20 s of the embeddings' Retry-After)."""
    records: list[PhaseRecord] = []
    async with make_guard([servers[0].url], records) as guard, guard.http_client() as client:
        servers[0].script = Script(status=429, headers={"retry-after": "20"})
        answer = await client.post(servers[0].url + "/v1/embeddings", json={"model": "e", "input": "x"})
        assert answer.status_code == 429 and "x-llmguard-cause" not in answer.headers
        servers[0].script = Script()
        assert (await client.post(servers[0].url + CHAT, json=BODY)).status_code == 200
        (replica,) = guard.snapshot().replicas
    assert (replica.cooling_for, replica.circuit_open_for) == (0.0, 0.0)
    assert records[-1].status == "ok" and len(records[-1].attempts) == 1
    assert len(servers[0].received) == 2


@BACKENDS
@pytest.mark.parametrize(("status", "headers"), [(429, {"retry-after": "30"}), (503, {})], ids=["429", "503"])
def test_an_answer_to_a_get_does_not_cool_the_replica_nor_count_toward_its_circuit(
    backend: str, status: int, headers: dict[str, str]
) -> None:
    """A GET off the generation paths (``files.list``) is retried as a generation call, but its answer speaks for
    the files API only (its own rate limit, its backend's 503): it neither cools the replica nor counts toward its
    circuit, so a chat call beside it is sent at once and served, as through the plain SDK (before: the files
    API's Retry-After cooled the replica, and a chat call was refused ``all_replicas_cooling`` or waited)."""
    completion = {"id": "c", "object": "chat.completion", "model": "m", "choices": []}

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/files":
            return httpx.Response(status, headers=headers, json={"error": {"message": "files api throttled"}})
        return httpx.Response(200, json=completion)

    mock = httpx.MockTransport(answer)
    records: list[PhaseRecord] = []

    async def main() -> None:
        retry = RetryPolicy(circuit_failures=1)
        async with make_guard(["http://a.test"], records, retry=retry, transport_factory=lambda r: mock) as guard:
            async with guard.http_client() as client:
                assert (await client.get("http://a.test/v1/files")).status_code == status
                assert (await client.post("http://a.test" + CHAT, json={**BODY, "stream": False})).status_code == 200
            (replica,) = guard.snapshot().replicas
            assert (replica.cooling_for, replica.circuit_open_for) == (0.0, 0.0)

    run_virtual(main, backend)
    files, chat = records
    assert files.attempts[0].status_code == status
    assert chat.status == "ok" and len(chat.attempts) == 1 and chat.attempts[0].start == chat.start


@BACKENDS
def test_a_chat_cool_down_neither_holds_back_a_get_nor_is_ended_by_its_answer(backend: str) -> None:
    """The reverse: chat calls' 429s (Retry-After: 30, three in a row) cool the lone replica for generation calls,
    yet a
    ``files.list`` beside it is sent at once and served, as through the plain SDK (before: refused
    ``all_replicas_cooling``, nothing sent, or held until the cool-down's probe); its answer does not end the
    cool-down, so the next chat call still waits for it."""
    throttled = {"on": True}

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/files":
            return httpx.Response(200, json={"object": "list", "data": []})
        if throttled["on"]:
            return httpx.Response(429, headers={"retry-after": "30"}, json={"error": {"message": "busy"}})
        return httpx.Response(200, json={"id": "c", "object": "chat.completion", "model": "m", "choices": []})

    mock = httpx.MockTransport(answer)
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"fast": Tier(ttft=1.0, total=5.0)}
        async with make_guard(
            ["http://a.test"], records, tiers=tiers, default_tier="fast", transport_factory=lambda r: mock
        ) as guard:
            async with guard.http_client() as client:
                for _ in range(REFUSALS_TO_COOL):
                    chat = await client.post("http://a.test" + CHAT, json={**BODY, "stream": False})
                    assert chat.status_code == 429  # 30 s of rest do not fit its 1 s ttft: handed back
                assert (await client.get("http://a.test/v1/files")).status_code == 200
                (replica,) = guard.snapshot().replicas
                assert replica.cooling_for > 20  # the files API's answer did not end the chat cool-down
                throttled["on"] = False
                with pytest.raises(AllReplicasCooling):  # a plain httpx client gets the refusal raised
                    await client.post("http://a.test" + CHAT, json={**BODY, "stream": False})

    run_virtual(main, backend)
    files = next(r for r in records if r.attempts and r.attempts[0].status_code == 200)
    assert len(files.attempts) == 1 and files.attempts[0].start == files.start


@pytest.mark.parametrize(
    ("status", "error"), [(503, openai.InternalServerError), (429, openai.RateLimitError)], ids=["503", "429"]
)
async def test_openai_against_an_always_failing_endpoint_sees_no_stacked_retries(
    servers: list[LoopbackServer], status: int, error: type[openai.APIStatusError]
) -> None:
    """No SDK retry stacked on the guard's: one record per call, at most `RetryPolicy.max_attempts` requests
    each, never openai's x3 on top. A 429 or 503 without Retry-After from the only replica is retried after each
    cool-down (past the budget once it is empty), as often as the plain SDK would (1 + 2)."""
    servers[0].script = Script(status=status, body={"error": {"message": "slow down", "type": "x"}})
    records: list[PhaseRecord] = []
    budget = BudgetPolicy(ratio=0.1, floor=2, window=60.0)
    calls = 10
    # A short cool-down after each Retry-After-less 429/503: the default 1 s only made the retries wait.
    retry = RetryPolicy(overload_cooldown=0.05)
    async with make_guard([servers[0].url], records, budget=budget, retry=retry) as guard:
        oai = openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="sk", http_client=guard.http_client())
        for _ in range(calls):
            with pytest.raises(error):
                await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    received = len(servers[0].received)
    assert len(records) == calls  # each SDK retry (after its 0.5-8 s sleep) would be one more record
    assert all(len(r.attempts) <= retry.max_attempts for r in records)
    assert received == calls * retry.max_attempts


async def test_empty_budget_returns_the_last_server_answer(servers: list[LoopbackServer]) -> None:
    """With another replica to retry on, after a 429 whose Retry-After is longer than the guard waits (a failure of
    the replica's own, a 5xx, would be retried paced past the budget: the tests above)."""
    for server in servers:
        server.script = Script(
            status=429, headers={"retry-after": "1000"}, body={"error": {"message": "broken", "type": "x"}}
        )
    records: list[PhaseRecord] = []
    budget = BudgetPolicy(ratio=0.0, floor=0)
    urls = [s.url for s in servers]
    async with make_guard(urls, records, budget=budget) as guard, guard.http_client() as client:
        response = await client.post(servers[0].url + CHAT, json=BODY)
    assert response.status_code == 429 and response.json()["error"]["message"] == "broken"
    assert response.headers["x-llmguard-cause"] == "budget_exhausted"
    assert sum(len(s.received) for s in servers) == 1


async def test_never_retries_after_the_first_token(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(tokens=10, reset_after_tokens=3)
    records: list[PhaseRecord] = []
    async with make_guard([s.url for s in servers[:2]], records) as guard, guard.http_client() as client:
        with pytest.raises(httpx.HTTPError):
            async with client.stream("POST", servers[0].url + CHAT, json=BODY) as response:
                await response.aread()
    assert len(servers[0].received) + len(servers[1].received) == 1
    assert records[0].status == "error"


async def test_4xx_other_than_408_429_is_not_retried(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(status=422)
    records: list[PhaseRecord] = []
    async with make_guard([s.url for s in servers[:2]], records) as guard, guard.http_client() as client:
        response = await client.post(servers[0].url + CHAT, json=BODY)
    assert response.status_code == 422 and len(records[0].attempts) == 1


async def test_connect_errors_open_the_circuit_and_all_open_fails_fast_without_panic_mode(
    refused_url: Callable[[], str],
) -> None:
    dead = [refused_url(), refused_url()]
    records: list[PhaseRecord] = []
    policy = RetryPolicy(circuit_failures=2, circuit_cooldown=30.0, panic_threshold=0.0)
    async with make_guard(dead, records, retry=policy) as guard, guard.http_client() as client:
        with pytest.raises(AllAttemptsFailed):
            await client.post(dead[0] + CHAT, json=BODY)
        with pytest.raises(AllAttemptsFailed):
            await client.post(dead[0] + CHAT, json=BODY)
        started = time.monotonic()
        with pytest.raises(AllAttemptsFailed, match="circuit is open"):
            await client.post(dead[0] + CHAT, json=BODY)
        # Not after the 30 s cool-down; that no time passes at all is asserted in virtual time (next test), and
        # that no connect was tried by the record below.
        assert time.monotonic() - started < 10.0
    assert records[-1].attempts == ()  # no attempt: not even a connect


@BACKENDS
@pytest.mark.parametrize(
    "plan", [Plan(refused=True), Plan(status=408), Plan(status=500)], ids=["refused", "408", "500"]
)
def test_open_circuits_fail_the_next_call_without_any_time_passing_without_panic_mode(backend: str, plan: Plan) -> None:
    """Replicas refusing connections, or answering every call with a 408 (a request timeout) or a 500, count toward
    their circuits alike (a 408 counted toward none before): after `RetryPolicy.circuit_failures` calls each, every
    circuit is open, and (without panic mode) the next call is refused at once, nothing sent, no time passing."""
    fakes = {url: FakeReplica(url[7], [plan]) for url in ("http://a.test", "http://b.test")}
    records: list[PhaseRecord] = []

    async def main() -> None:
        policy = RetryPolicy(circuit_failures=2, circuit_cooldown=30.0, panic_threshold=0.0)
        async with virtual_guard(fakes, records, retry=policy, hedge=None) as guard, guard.http_client() as client:
            for _ in range(2):
                if plan.refused:
                    with pytest.raises(AllAttemptsFailed):
                        await client.post("http://a.test" + CHAT, json=BODY)
                else:
                    assert (await client.post("http://a.test" + CHAT, json=BODY)).status_code == plan.status
            assert all(r.circuit_open_for > 0.0 for r in guard.snapshot().replicas)
            requests, started = sum(f.requests for f in fakes.values()), anyio.current_time()
            with pytest.raises(AllAttemptsFailed, match="circuit is open"):
                await client.post("http://a.test" + CHAT, json=BODY)
            assert anyio.current_time() == started  # no connect, no backoff
            assert sum(f.requests for f in fakes.values()) == requests

    run_virtual(main, backend)
    assert records[-1].attempts == ()


async def test_a_dead_replica_is_skipped_for_a_live_one(
    servers: list[LoopbackServer], refused_url: Callable[[], str]
) -> None:
    dead = refused_url()
    records: list[PhaseRecord] = []
    async with make_guard([dead, servers[0].url], records) as guard, guard.http_client() as client:
        for _ in range(4):
            assert (await client.post(servers[0].url + CHAT, json=BODY)).status_code == 200
    failed = [a for r in records for a in r.attempts if a.outcome == "failed"]
    assert failed and all(a.error == "connect_error" for a in failed)
    assert len(servers[0].received) == 4


async def test_a_tier_budget_is_separate_from_the_shared_one(servers: list[LoopbackServer]) -> None:
    for server in servers:
        server.script = Script(status=500)  # not an overload status: retried after backoff
    records: list[PhaseRecord] = []
    tiers = {"t": Tier(ttft=2.0, total=10.0), "batch": Tier(ttft=5.0, total=60.0)}
    urls = [s.url for s in servers]
    retry = RetryPolicy(same_replica_backoff=0.02)  # the paced retries' wait, short in real time
    batch_budget = {"batch": BudgetPolicy(ratio=0.0, floor=0)}
    guard = make_guard(urls, records, tiers=tiers, tier_budgets=batch_budget, retry=retry)
    async with guard, guard.http_client() as client:
        batch = await client.post(servers[0].url + CHAT, json=BODY, headers={"x-llmguard-tier": "batch"})
        interactive = await client.post(servers[0].url + CHAT, json=BODY)
        # The batch tier's empty budget refused both retries, which went paced; the shared one paid the others.
        batch_snapshot = guard.tier_budgets["batch"].snapshot()
        assert (batch_snapshot.refused, batch_snapshot.paced) == (2, 2)
        assert guard.budget is not None and guard.budget.spent == 2
        assert (guard.budget.refused, guard.budget.snapshot().paced) == (0, 0)
    assert [len(r.attempts) for r in records] == [3, 3]
    assert batch.status_code == interactive.status_code == 500


async def test_a_retry_cancelled_while_waiting_is_refunded(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(status=429, headers={"retry-after": "1"})
    records: list[PhaseRecord] = []
    tiers = {"t": Tier(ttft=5.0, total=10.0)}
    async with make_guard([servers[0].url], records, tiers=tiers) as guard, guard.http_client() as client:
        with anyio.move_on_after(0.3):
            await client.post(servers[0].url + CHAT, json=BODY)  # waits out the 1 s Retry-After
        assert guard.budget is not None and guard.budget.spent == 0
    assert records[0].status == "cancelled" and len(servers[0].received) == 1


def test_the_backoff_draws_from_a_random_source_tests_can_seed() -> None:
    """Full jitter over an exponential window, drawn from the layer's own `random.Random`."""
    draws = random.Random(7)
    expected = [draws.uniform(0.0, min(2.0, 0.05 * 2 ** (n - 1))) for n in range(1, 9)]
    random.seed(1)
    global_state = random.getstate()
    backoff = Backoff(0.05, 2.0, random.Random(7))
    assert [backoff(n) for n in range(1, 9)] == expected
    assert random.getstate() == global_state  # the global random module is left alone
    seeded = RetryLayer(None, RetryPolicy(), None, rng=random.Random(7))  # type: ignore[arg-type]
    assert [seeded.backoff(n) for n in range(1, 9)] == expected


def test_a_return_to_a_failed_replica_waits_as_the_sdks_retry_would() -> None:
    """The openai and anthropic SDKs wait 0.5 s x 2^(retries so far) x (1 - 0.25 x random()) before a retry: a
    return to a replica that failed the call waits as long, so its retries span at least what the SDK's do (an
    outage the SDK rides out is ridden out here too), capped by ``backoff_max``."""
    backoff = Backoff(0.05, 2.0, random.Random(3), same_replica=0.5)
    for failures, window in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 2.0)]:  # doubling, capped by backoff_max
        waits = [backoff.returning(failures) for _ in range(2000)]
        assert 0.75 * window <= min(waits) < 0.76 * window
        assert 0.99 * window < max(waits) <= window
    sdk_least = 0.75 * 0.5 + 0.75 * 1.0  # the plain SDK's two retries of one endpoint, at their soonest
    assert min(backoff.returning(1) + backoff.returning(2) for _ in range(2000)) >= sdk_least
    assert Backoff(0.05, 2.0, same_replica=0.0).returning(1) == 0.0  # 0: the ordinary backoff only


@BACKENDS
@pytest.mark.parametrize("status", [429, 503, 529])
def test_one_refusal_with_retry_after_among_calls_served_holds_back_no_other_call(backend: str, status: int) -> None:
    """One hosted endpoint refusing a call with a Retry-After (a random share of its calls, here the first) while it
    serves the others: a call started meanwhile is sent at once, not held for a cool-down's probe (1 s in), and the
    refused call's own retry still waits out its Retry-After, as the plain SDK's does. (Each such
    answer used to cool the endpoint at once: 15 % of 60 calls refused with `Retry-After: 1-5` made the median call
    wait 1 s, where the plain SDK's took 0.1 s.)"""
    fake = FakeReplica("a", [Plan(status=status, retry_after="2", headers_after=0.01), Plan(), Plan()])
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"t": Tier(ttft=5.0, total=10.0, stall=2.0)}
        async with virtual_guard({"http://a.test": fake}, records, tiers=tiers, hedge=None) as virtual:
            async with virtual.http_client() as client, anyio.create_task_group() as tg:

                async def call(after: float) -> None:
                    await anyio.sleep(after)
                    assert (await client.post("http://a.test" + CHAT, json=BODY)).status_code == 200

                tg.start_soon(call, 0.0)
                tg.start_soon(call, 0.1)  # after the refusal
            assert virtual.snapshot().replicas[0].cooling_for == 0.0

    run_virtual(main, backend)
    refused, other = sorted(records, key=lambda r: r.start)
    first, retry_attempt = refused.attempts
    assert first.status_code == status and first.finish is not None
    assert retry_attempt.start - first.finish == pytest.approx(2.0, abs=1e-6)  # its own Retry-After
    assert other.attempts[0].start - other.start == pytest.approx(0.0, abs=1e-6)  # sent at once


@BACKENDS
@pytest.mark.parametrize("status", [429, 503])
def test_the_third_refusal_with_retry_after_in_a_row_cools_the_only_replica_for_it(backend: str, status: int) -> None:
    """Refusals with a Retry-After in a row, none served between (a rate limit refusing every call): the third cools
    the endpoint for its Retry-After, and a call started then waits for the cool-down's probe (1 s in)."""
    refusal = Plan(status=status, retry_after="4", headers_after=0.01)
    fake = FakeReplica("a", [*[refusal] * REFUSALS_TO_COOL, Plan()])
    records: list[PhaseRecord] = []
    cooling: list[float] = []

    async def main() -> None:
        async with virtual_guard({"http://a.test": fake}, records, hedge=None) as virtual:
            async with virtual.http_client() as client:
                one = {"x-llmguard-max-attempts": "1"}
                for _ in range(REFUSALS_TO_COOL):
                    assert (await client.post("http://a.test" + CHAT, json=BODY, headers=one)).status_code == status
                    cooling.append(virtual.snapshot().replicas[0].cooling_for)
                started = anyio.current_time()
                assert (await client.post("http://a.test" + CHAT, json=BODY)).status_code == 200
                assert anyio.current_time() - started == pytest.approx(1.0, abs=0.02)  # the first probe

    run_virtual(main, backend)
    assert cooling[:-1] == [0.0] * (REFUSALS_TO_COOL - 1) and cooling[-1] == pytest.approx(4.0, abs=0.02)


AZURE = "http://a.test/openai/deployments/gpt4o"
"""One Azure deployment as the only replica; ``gpt35`` is another deployment of the same resource."""
OTHER = "http://a.test/openai/deployments/gpt35/chat/completions?api-version=2024-10-21"
OWN = AZURE + "/chat/completions?api-version=2024-10-21"
QUOTA = {"retry-after": "86400"}


def azure_calls(
    backend: str,
    answers: dict[str, list[tuple[int, dict[str, str]]]],
    calls: list[str],
    replicas: tuple[str, ...] = (AZURE,),
) -> list[Any]:
    """``calls`` (each OWN or OTHER, non-streamed) one after the other through a virtual-time Guard over
    ``replicas`` (AZURE; tier ttft 5 s, no hedging), each deployment answering its scripted (status, headers) in
    turn (the last one repeats, 200 after the script): per call (status, record, the first replica's cooling_for
    after it)."""
    sent: dict[str, int] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        deployment = request.url.path.split("/")[3]
        script = answers.get(deployment, [])
        n = sent[deployment] = sent.get(deployment, 0) + 1
        if script and (n <= len(script) or script[-1][0] >= 400):
            status, headers = script[min(n, len(script)) - 1]
            if status >= 400:
                return httpx.Response(status, headers=headers, json={"error": {"message": "scripted"}})
        return httpx.Response(200, json={"id": "c", "object": "chat.completion", "model": deployment, "choices": []})

    mock = httpx.MockTransport(answer)
    records: list[PhaseRecord] = []
    seen: list[tuple[int, float]] = []

    async def main() -> None:
        tiers = {"t": Tier(ttft=5.0, total=10.0)}
        async with make_guard(list(replicas), records, tiers=tiers, transport_factory=lambda r: mock) as guard:
            async with guard.http_client() as client:
                for url in calls:
                    try:
                        status = (await client.post(url, json={**BODY, "stream": False})).status_code
                    except AllReplicasCooling:
                        status = -1  # refused before it was sent
                    seen.append((status, guard.snapshot().replicas[0].cooling_for))

    run_virtual(main, backend)
    return [(status, record, cooling) for (status, cooling), record in zip(seen, records, strict=True)]


@BACKENDS
@pytest.mark.parametrize("refusal", [QUOTA, {}], ids=["quota", "429"])
def test_another_deployments_429_neither_cools_the_replica_nor_is_held_by_its_cool_down(
    backend: str, refusal: dict[str, str]
) -> None:
    """A call to another deployment of the replica's Azure resource (a path outside the replica's base) speaks for
    that deployment only, whose limits are its own: its 429 (a quota's Retry-After: 86400, or none) cools nothing,
    so the replica's own call is sent at once and served, as through the plain SDK (before: refused
    ``all_replicas_cooling`` for the other deployment's quota). The quota's 429 is handed back at once."""
    (other, record, cooling), (own, own_record, _) = azure_calls(backend, {"gpt35": [(429, refusal)]}, [OTHER, OWN])
    assert other == 429 and cooling == 0.0
    assert len(record.attempts) == (1 if refusal else 3)  # a plain 429 is retried (its own backoff), as documented
    assert own == 200 and len(own_record.attempts) == 1 and own_record.attempts[0].start == own_record.start


@BACKENDS
@pytest.mark.parametrize("retry_after", [None, "2"], ids=["served", "retried"])
def test_the_replicas_quota_cool_down_neither_holds_back_another_deployment_nor_is_ended_by_it(
    backend: str, retry_after: str | None
) -> None:
    """The reverse: the replica's own quota 429 (Retry-After: 86400) cools it, yet a call to another deployment of
    the resource is sent at once and served, as through the plain SDK (before: refused ``all_replicas_cooling``,
    nothing sent); its own 429 with a Retry-After is retried when that ends, however long the replica cools; and
    its answers end no cool-down of the replica: its next own call is still refused (or, once due, is its probe)."""
    gpt35 = [(429, {"retry-after": retry_after}), (200, {})] if retry_after else []
    results = azure_calls(backend, {"gpt4o": [(429, QUOTA)], "gpt35": gpt35}, [OWN, OTHER, OWN])
    (own, _, cooled), (other, record, cooling), (again, _, _) = results
    assert own == 429 and cooled > 60
    assert other == 200 and record.attempts[0].start == record.start
    if retry_after:
        assert len(record.attempts) == 2 and record.attempts[1].start - record.start == pytest.approx(2.0, abs=0.01)
    assert cooling > 60  # not ended by the other deployment's answers
    assert again == (429 if retry_after else -1)  # refused before it was sent; 2 s in, it goes as the probe


@BACKENDS
@pytest.mark.parametrize("retry_after", ["86400", "2"], ids=["quota", "retried"])
def test_another_deployments_retry_after_is_its_own_with_two_deployments_as_replicas(
    backend: str, retry_after: str
) -> None:
    """Two deployments of one resource are the replicas; a call to a third (a path under neither) goes to that
    deployment whichever replica sends it. Its quota 429 (Retry-After 86400, longer than the guard waits) is handed
    back at once, one request; its 429 with Retry-After 2 is retried when those 2 s end, as the plain SDK's is, and
    served. (Its retry went to the other replica, the same deployment, at once: a second 429 inside the wait, and
    after a quota's the retry slept the 86400 s.)"""
    replicas = (AZURE, "http://a.test/openai/deployments/gpt4x")
    answers = {"gpt35": [(429, {"retry-after": retry_after}), (200, {})]}
    ((status, record, _),) = azure_calls(backend, answers, [OTHER], replicas)
    starts = [a.start - record.start for a in record.attempts]
    if retry_after == "86400":
        assert (status, starts) == (429, [0.0])
    else:
        assert status == 200 and starts == [0.0, pytest.approx(2.0, abs=0.01)]


@dataclass
class StrictLimit(FakeReplica):
    """A rate limit of one request a second spent just before the first request: every request until a second after
    it gets a 429 whose Retry-After is the whole seconds left (at least 1), the first after it is served."""

    free_at: float | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        now = anyio.current_time()
        self.free_at = now + 1.0 if self.free_at is None else self.free_at
        left = self.free_at - now
        self.plans = [Plan(status=429, retry_after=str(max(1, int(left + 0.999))))] if left > 0 else [Plan()]
        return await super().handle_async_request(request)


@BACKENDS
@pytest.mark.parametrize("replicas", [2, 3])
def test_replicas_all_asking_to_wait_get_the_last_request_after_the_first_wait_ends(
    backend: str, replicas: int
) -> None:
    """Every replica refuses the call with a 429 and ``Retry-After: 1`` (a limit wider than one replica, or several
    spent at once), and refuses anything sooner. The retries go at once to replicas not yet tried, then the last
    request goes back to the first replica when its Retry-After ends, and is served, as the plain SDK's second request
    would be. (A retry used to go back to the first replica at once after the second one's 429, before the wait the
    first had asked of the call, and with three replicas the third request went to the third; the call failed in
    milliseconds where the plain SDK was served after a second.)"""
    names = ["http://a.test", "http://b.test", "http://c.test"][:replicas]
    fakes: dict[str, FakeReplica] = {url: StrictLimit(url[7]) for url in names}
    response, _, record = one_virtual_call(backend, fakes)
    assert response.status_code == 200
    first, *middle, last = record.attempts
    assert [a.status_code for a in (first, *middle)] == [429] * (len(record.attempts) - 1)
    assert last.outcome == "won" and last.replica == first.replica
    assert first.finish is not None and last.start >= first.finish + 1.0 - 1e-6


@BACKENDS
def test_a_500_while_every_replica_cools_for_a_quota_is_retried_after_its_backoff_not_the_cool_down(
    backend: str,
) -> None:
    """Both replicas answered a quota's 429 (``Retry-After: 86400``: each cools for `RetryPolicy.max_retry_after`),
    then recover (two requests a call); the next call's first attempt, sent to a cooling replica as every replica is
    cooling, meets one 500. Its retry goes after its backoff, as a first attempt would (the router spreads over the
    cooling replicas), and is served, as the plain SDK's retry half a second later is. (It used to wait for a
    cool-down's end: 120 s.)"""
    answers = [Plan(status=429, retry_after="86400")] * 2 + [Plan(status=500)]  # then served

    @dataclass
    class Recovering(FakeReplica):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            self.plans = [answers.pop(0) if answers else Plan()]  # the replicas' answers, in the order sent
            return await super().handle_async_request(request)

    fakes: dict[str, FakeReplica] = {url: Recovering(url[7]) for url in ("http://a.test", "http://b.test")}
    records: list[PhaseRecord] = []
    statuses: list[int] = []

    async def main() -> None:
        async with virtual_guard(fakes, records, hedge=None, retry=RetryPolicy(max_attempts=2)) as virtual:
            async with virtual.http_client() as client:
                for _ in range(2):
                    statuses.append((await client.post("http://a.test" + CHAT, json=BODY)).status_code)

    run_virtual(main, backend)
    assert statuses == [429, 200]
    failed, served = records[1].attempts
    assert failed.status_code == 500 and served.outcome == "won"
    assert failed.finish is not None and served.start - failed.finish <= RetryPolicy().backoff_max


@BACKENDS
def test_a_replica_that_asked_for_more_rest_than_the_guard_waits_gets_none_of_the_calls_retries(backend: str) -> None:
    """Replica A answers a quota's 429 (``Retry-After: 86400``, longer than `RetryPolicy.max_retry_after`), B a 429
    without one; a call of the default tier (no first-token deadline). Its retries go to B only, A is not sent
    back to, and the call ends with B's answer within seconds, as the plain SDK's would. (With each replica's
    Retry-After remembered for the call, A's was kept as the guard's 120 s cut, and the last request went back to A
    when that ended: the call failed after 120 s.)"""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(status=429, retry_after="86400")]),
        "http://b.test": FakeReplica("b", [Plan(status=429)]),
    }
    records: list[PhaseRecord] = []
    statuses: list[int] = []

    async def main() -> None:
        async with virtual_guard(fakes, records, hedge=None) as virtual:
            async with virtual.http_client() as client:
                statuses.append((await client.post("http://a.test" + CHAT, json=BODY)).status_code)

    run_virtual(main, backend)
    (record,) = records
    assert statuses == [429] and fakes["http://a.test"].requests == 1
    first, *_ = record.attempts
    last = record.attempts[-1]
    assert last.replica == "http://b.test" and last.finish is not None
    assert last.finish - first.start < 2 * RetryPolicy().overload_cooldown + RetryPolicy().backoff_max


@BACKENDS
def test_another_deployments_500s_are_retried_after_the_same_replica_backoff_with_two_deployments_as_replicas(
    backend: str,
) -> None:
    """Two deployments of one resource are the replicas; a call to a third meets two 500s, then is served. Whichever
    replica sends its retry, it goes to that one deployment, so each retry waits the backoff of a retry to the same
    replica (as the plain SDK's, about 0.5 s then 1 s), and the call is served. (The retry through the other replica
    went at once, with the short first-round backoff: a deployment failing for a moment failed the call.)"""
    replicas = (AZURE, "http://a.test/openai/deployments/gpt4x")
    answers = {"gpt35": [(500, {}), (500, {}), (200, {})]}
    ((status, record, _),) = azure_calls(backend, answers, [OTHER], replicas)
    first, second, third = (a.start - record.start for a in record.attempts)
    policy = RetryPolicy()
    assert status == 200
    assert second - first >= policy.same_replica_backoff / 2 - 1e-6
    assert third - second >= policy.same_replica_backoff - 1e-6


@dataclass
class Unreachable(FakeReplica):
    """A replica no connection reaches before the virtual instant ``until``: each fails with an ``httpx.ConnectError``
    raised from ``cause`` (as httpx raises it from the socket's error); then it answers as `FakeReplica` does."""

    until: float = math.inf
    cause: OSError = field(default_factory=lambda: ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if now() < self.until:
            self.requests += 1
            raise httpx.ConnectError(str(self.cause), request=request) from self.cause
        return await super().handle_async_request(request)


REFUSED = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
OUT_OF_FDS = OSError(errno.EMFILE, "Too many open files")
RESOLVER_DOWN = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
NO_SUCH_NAME = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
LOCAL_FAULTS = [
    OUT_OF_FDS,
    OSError(errno.ENFILE, "Too many open files in system"),
    OSError(errno.ENOBUFS, "No buffer space available"),
    OSError(errno.ENOMEM, "Cannot allocate memory"),
    OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"),
]


@BACKENDS
@pytest.mark.parametrize(
    ("cause", "replicas"), [(REFUSED, 2), (OUT_OF_FDS, 2), (OUT_OF_FDS, 3)], ids=["refused-2", "emfile-2", "emfile-3"]
)
def test_a_moment_no_replica_can_be_reached_is_ridden_out_as_through_the_plain_sdk(
    backend: str, replicas: int, cause: OSError
) -> None:
    """Both replicas refusing connections for 0.6 s (restarting together), or this process unable to connect for as
    long (out of file descriptors): the plain SDK's three requests, 0.375-0.5 s then 0.75-1 s apart, ride it out.
    Through the guard, a retry that goes back to a replica after two refused the call, or after a connection that
    failed here, goes no sooner than the plain SDK's would: the same-replica backoff of its round, with that of the
    retry that went at once to another replica (before: the three attempts went within 0.15 s, and the call
    failed)."""
    names = "abc"[:replicas]
    fakes: dict[str, FakeReplica] = {f"http://{n}.test": Unreachable(n, cause=cause) for n in names}
    records: list[PhaseRecord] = []

    async def main() -> None:
        for fake in fakes.values():
            assert isinstance(fake, Unreachable)
            fake.until = now() + 0.6
        tiers = {"t": Tier(ttft=5.0, total=10.0, stall=2.0)}
        async with virtual_guard(fakes, records, tiers=tiers, hedge=None) as guard, guard.http_client() as client:
            response = await client.post("http://a.test" + CHAT, json=BODY)
            assert response.status_code == 200

    run_virtual(main, backend)
    first, second, third = records[0].attempts
    assert (first.outcome, second.outcome, third.outcome) == ("failed", "failed", "won")
    assert first.finish is not None
    same_replica = RetryPolicy().same_replica_backoff  # windows of 0.5 s, then 1 s: [3/4, 1] of each
    if cause is REFUSED:  # one replica down is no outage: the second attempt goes at once to another
        assert second.replica != first.replica
        assert second.start - first.finish <= RetryPolicy().backoff_initial + 1e-9
    else:  # the connection failed here: another replica would fail alike
        assert second.start - first.finish >= 0.75 * same_replica - 1e-9
    assert third.start - first.finish >= 0.75 * (same_replica + 2 * same_replica) - 1e-9


@BACKENDS
@pytest.mark.parametrize("down", [1, 2])
def test_replicas_refusing_connections_cost_no_wait_while_another_is_ready(backend: str, down: int) -> None:
    """One or two replicas of three down: a call that tried them goes at once (within its round's ordinary backoff)
    to a ready one, which serves it within an interactive tier's deadline (not after the plain SDK's backoff, which
    would not fit it), whatever the failures to connect taught other calls."""
    dead = {f"http://{n}.test" for n in "abc"[:down]}
    fakes: dict[str, FakeReplica] = {
        f"http://{n}.test": Unreachable(n) if f"http://{n}.test" in dead else FakeReplica(n) for n in "abc"
    }
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"t": Tier(ttft=2.0, total=10.0, stall=2.0)}
        async with virtual_guard(fakes, records, tiers=tiers, hedge=None) as guard, guard.http_client() as client:
            for _ in range(6):
                assert (await client.post("http://a.test" + CHAT, json=BODY)).status_code == 200

    run_virtual(main, backend)
    retried = [r.attempts for r in records if len(r.attempts) > 1]
    assert any(len(attempts) == down + 1 for attempts in retried)  # some call tried every dead replica first
    for attempts in retried:
        assert attempts[-1].replica not in dead
        for round_number, (before, after) in enumerate(itertools.pairwise(attempts), start=1):
            assert before.finish is not None
            assert after.start - before.finish <= RetryPolicy().backoff_initial * 2 ** (round_number - 1) + 1e-9


class Told:
    """A `ReplicaSet.shared` that notes what the fleet would be told."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str]] = []

    def cooled(self, state: Any, seconds: float) -> None:
        self.told.append(("cooled", state.name))

    def opened(self, state: Any, seconds: float) -> None:
        self.told.append(("opened", state.name))

    def cleared(self, state: Any) -> None:
        self.told.append(("cleared", state.name))

    def closed(self, state: Any) -> None:
        self.told.append(("closed", state.name))


@BACKENDS
@pytest.mark.parametrize(
    ("cause", "local"),
    [*((c, True) for c in LOCAL_FAULTS), (NO_SUCH_NAME, False), (RESOLVER_DOWN, False), (REFUSED, False)],
    ids=["emfile", "enfile", "enobufs", "enomem", "eaddrnotavail", "nxdomain", "eai_again", "refused"],
)
def test_a_connection_that_failed_here_counts_against_no_replica(backend: str, cause: OSError, local: bool) -> None:
    """A connection this process could not open (out of file descriptors, buffers, memory or local ports) says
    nothing of the replica: it counts toward neither its circuit nor its failure rate, and the fleet is told nothing
    (before: the process's own fault opened healthy replicas' circuits, and every process of the fleet then kept
    away from them). A name that does not resolve (a misconfigured URL, one host's broken zone) and a refused
    connection are the replica's, and count."""
    fakes: dict[str, FakeReplica] = {"http://a.test": Unreachable("a", cause=cause), "http://b.test": FakeReplica("b")}
    records: list[PhaseRecord] = []
    told = Told()

    async def main() -> None:
        retry = RetryPolicy(circuit_failures=1, circuit_cooldown=30.0)
        async with virtual_guard(fakes, records, retry=retry, hedge=None) as guard, guard.http_client() as client:
            guard._replica_set.shared = told
            for _ in range(3):
                assert (await client.post("http://a.test" + CHAT, json=BODY)).status_code == 200
            a = guard._replica_set.states[0]
            snapshot = guard.snapshot().replicas[0]
            assert (snapshot.healthy, snapshot.circuit_open_for == 0.0, a.health.failure == 0.0) == (local,) * 3

    run_virtual(main, backend)
    assert fakes["http://a.test"].requests >= 1
    assert told.told == ([] if local else [("opened", "http://a.test")])


SPENT_KEY_LIMIT = {"x-ratelimit-remaining-requests": "0"}


def calls_in_turn(
    backend: str, plans: list[Plan], callers: list[tuple[str, str]]
) -> tuple[list[int], list[PhaseRecord]]:
    """One call after another to one replica answering ``plans``, each as its (API key, model) in ``callers`` (a key
    with a space is sent as the whole ``Authorization`` value), with one attempt each: their statuses and records."""
    fake = FakeReplica("a", plans)
    records: list[PhaseRecord] = []
    statuses: list[int] = []

    async def main() -> None:
        tiers = {"t": Tier(ttft=5.0, total=10.0, stall=2.0)}
        async with virtual_guard({"http://a.test": fake}, records, tiers=tiers, hedge=None) as virtual:
            async with virtual.http_client() as client:
                for key, model in callers:
                    authorization = key if " " in key else f"Bearer sk-{key}"
                    auth = {"authorization": authorization, "x-llmguard-max-attempts": "1"}
                    body = {**BODY, "model": model}
                    statuses.append((await client.post("http://a.test" + CHAT, json=body, headers=auth)).status_code)

    run_virtual(main, backend)
    return statuses, records


@BACKENDS
def test_a_429_cools_the_only_replica_for_the_key_that_got_it_alone(backend: str) -> None:
    """A hosted API's 429 (a spent limit of the key that got it) is that key's: a call with another API key is sent at
    once and served, while the refused key's next call waits for the cool-down's probe (1 s in), as it did for every
    call; refused again, that probe holds back no call of the other key either."""
    refusal = Plan(status=429, retry_after="20", headers=SPENT_KEY_LIMIT, headers_after=0.01)
    callers = [("bad", "m"), ("good", "m"), ("bad", "m"), ("good", "m")]
    statuses, records = calls_in_turn(backend, [refusal, Plan(), refusal, Plan()], callers)
    assert statuses == [429, 200, 429, 200]
    bad, good, probe, good_again = records
    refused = bad.attempts[0].finish
    assert refused is not None
    assert good.attempts[0].start == pytest.approx(refused, abs=1e-6)  # sent at once
    assert probe.attempts[0].start == pytest.approx(refused + 1.0, abs=1e-6)  # the refused key's probe
    assert good_again.attempts[0].start == pytest.approx(probe.attempts[0].start + 0.01, abs=1e-6)


SIGNED = "AWS4-HMAC-SHA256 Credential=AKID/20261207/us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature="
EVERY_CALLERS_REFUSALS = {
    "a-key-s-429-holds-back-its-other-models": (
        [Plan(status=429, retry_after="20", headers=SPENT_KEY_LIMIT, headers_after=0.01)],
        [("k", "hot"), ("k", "cool")],
    ),
    "a-signed-request-s-429": (
        [Plan(status=429, retry_after="20", headers=SPENT_KEY_LIMIT, headers_after=0.01)],
        [(SIGNED + "a1", "m"), (SIGNED + "b2", "m")],
    ),
    "429s-of-three-keys-in-a-row": (
        [Plan(status=429, retry_after="20", headers_after=0.01)] * 3,
        [("one", "m"), ("two", "m"), ("three", "m"), ("four", "m")],
    ),
    "503s-of-several-keys-in-a-row": (
        [Plan(status=503, retry_after="20", headers_after=0.01)] * 3,
        [("one", "m"), ("two", "m"), ("one", "m"), ("three", "m")],
    ),
}


@pytest.mark.parametrize("case", EVERY_CALLERS_REFUSALS.values(), ids=EVERY_CALLERS_REFUSALS.keys())
@BACKENDS
def test_refusals_that_are_not_one_keys_cool_the_replica_for_every_call(
    backend: str, case: tuple[list[Plan], list[tuple[str, str]]]
) -> None:
    """What cools a replica for every call, whatever its key, the next call waiting for the cool-down's probe (1 s
    in): a key's 429 for another model of the key (the model is no part of the scope: a server with several models
    behind one URL refuses them all when its queue is full, and a limit may cover several); a signed request's
    (its ``Authorization`` is a signature, new on each request, AWS SigV4: scoped by it, each call was another
    caller's and was sent at once); and a run of refusals with no call served between, of three keys' 429s (a queue
    refusing every key, or a limit they share) or of 503s, at its third."""
    refusals, callers = case
    statuses, records = calls_in_turn(backend, [*refusals, Plan()], callers)
    assert statuses == [refusals[0].status] * len(refusals) + [200]
    cooled_by, held = records[-2:]
    assert cooled_by.attempts[0].finish is not None
    assert held.attempts[0].start == pytest.approx(cooled_by.attempts[0].finish + 1.0, abs=1e-6)


@BACKENDS
def test_another_keys_calls_served_neither_end_nor_extend_a_keys_run_of_429s(backend: str) -> None:
    """429s that name no limit cool the replica at the third in a row; those are one key's: the other key's calls
    served between them do not end its run (its third 429 cools the replica for it), and are never held back."""
    refusal = Plan(status=429, retry_after="20", headers_after=0.01)
    plans = [refusal, Plan(), refusal, Plan(), refusal, Plan(), Plan()]
    callers = [(key, "m") for key in ("bad", "good", "bad", "good", "bad", "good", "bad")]
    statuses, records = calls_in_turn(backend, plans, callers)
    assert statuses == [429, 200, 429, 200, 429, 200, 200]
    third_refusal, good, probe = records[4:]
    assert third_refusal.attempts[0].finish is not None
    assert good.attempts[0].start == pytest.approx(third_refusal.attempts[0].finish, abs=1e-6)  # sent at once
    assert probe.attempts[0].start == pytest.approx(third_refusal.attempts[0].finish + 1.0, abs=1e-6)  # cooled for it


@BACKENDS
def test_two_keys_refused_in_turn_cool_the_replica_for_both_and_no_other_key(backend: str) -> None:
    """Two keys past their limits at once (their 429s in a row, no call served between) are not a server refusing
    every key: the run's third 429 cools the replica for both keys' calls, the next of either waiting for the
    probe (1 s in), while a third key's call is sent at once (it waited for that probe, as every key did)."""
    refusal = Plan(status=429, retry_after="20", headers_after=0.01)
    callers = [(key, "m") for key in ("one", "two", "one", "three", "two")]
    statuses, records = calls_in_turn(backend, [refusal, refusal, refusal, Plan(), Plan()], callers)
    assert statuses == [429, 429, 429, 200, 200]
    cooled_by, other, held = records[2:]
    assert cooled_by.attempts[0].finish is not None
    assert other.attempts[0].start == pytest.approx(cooled_by.attempts[0].finish, abs=1e-6)  # sent at once
    assert held.attempts[0].start == pytest.approx(cooled_by.attempts[0].finish + 1.0, abs=1e-6)  # its probe


@BACKENDS
def test_a_key_joined_to_another_keys_cool_down_waits_for_its_own_end_only(backend: str) -> None:
    """A key refused for 0.5 s while another key's 20 s cool-down is in force shares that cool-down, but its next
    call goes by its own end (0.5 s), not the other key's: not even its probe (1 s in), which it waited for
    (with a 2 s limit beside a 20 s one it waited 19 s, the plain SDK 1 s)."""
    slow = Plan(status=429, retry_after="20", headers=SPENT_KEY_LIMIT, headers_after=0.01)
    fast = Plan(status=429, headers={**SPENT_KEY_LIMIT, "retry-after-ms": "500"}, headers_after=0.01)
    callers = [(key, "m") for key in ("slow", "good", "fast", "fast")]
    statuses, records = calls_in_turn(backend, [slow, Plan(), fast, Plan()], callers)
    assert statuses == [429, 200, 429, 200]
    refused, again = records[2:]
    assert refused.attempts[0].finish is not None
    assert again.attempts[0].start == pytest.approx(refused.attempts[0].finish + 0.5, abs=1e-6)


@BACKENDS
def test_a_quotas_wait_holds_for_its_own_key_not_for_the_key_refused_beside_it(backend: str) -> None:
    """A key out of quota (`Retry-After: 86400`, longer than the guard waits: its calls are refused at once) and
    another key refused for 2 s in a row with it: one cool-down holds both, and only the quota's key is refused at
    once; the other key's next call is sent within its own 2 s (it was refused at once, never sent)."""
    quota = Plan(status=429, retry_after="86400", headers=SPENT_KEY_LIMIT, headers_after=0.01)
    limit = Plan(status=429, retry_after="2", headers=SPENT_KEY_LIMIT, headers_after=0.01)
    callers = [(key, "m") for key in ("quota", "limited", "limited")]
    statuses, records = calls_in_turn(backend, [quota, limit, Plan()], callers)
    assert statuses == [429, 429, 200]
    refused, again = records[1:]
    assert refused.attempts[0].finish is not None
    assert again.attempts[0].start <= refused.attempts[0].finish + 2.0 + 1e-6


@BACKENDS
def test_another_keys_call_served_ends_a_run_of_two_keys_429s(backend: str) -> None:
    """Two keys refused in a row, then a third key served: they are refused at once no more, so the first key's
    next 429 starts a run of its own, and the second key's call is sent at once (it waited for a cool-down of
    both, the run's third refusal)."""
    refusal = Plan(status=429, retry_after="1", headers_after=0.01)
    callers = [(key, "m") for key in ("one", "two", "other", "one", "two")]
    statuses, records = calls_in_turn(backend, [refusal, refusal, Plan(), refusal, Plan()], callers)
    assert statuses == [429, 429, 200, 429, 200]
    late, sent = records[3:]
    assert late.attempts[0].finish is not None
    assert sent.attempts[0].start == pytest.approx(late.attempts[0].finish, abs=1e-6)


@BACKENDS
def test_a_keys_429_does_not_lengthen_a_cool_down_every_caller_takes(backend: str) -> None:
    """A 503's 2 s cool-down holds every call back; a key's 429 (its limit spent for 20 s) answering its probe is
    that key's limit, not the server's: another key's call is sent by the cool-down's end at the latest, not 20 s
    on (the 429's wait held every key back, its key's probes renewing it)."""
    overload = Plan(status=503, retry_after="2", headers={"x-should-retry": "false"}, headers_after=0.01)
    spent = Plan(status=429, retry_after="20", headers=SPENT_KEY_LIMIT, headers_after=0.01)
    callers = [("other", "m"), ("bad", "m"), ("good", "m")]
    statuses, records = calls_in_turn(backend, [overload, spent, Plan()], callers)
    assert statuses == [503, 429, 200]
    overloaded, probe, good = records
    assert overloaded.attempts[0].finish is not None
    assert probe.attempts[0].start == pytest.approx(overloaded.attempts[0].finish + 1.0, abs=1e-6)
    assert good.attempts[0].start <= overloaded.attempts[0].finish + 2.0 + 1e-6


@BACKENDS
def test_a_503_during_a_keys_cool_down_makes_it_every_callers_keeping_its_probe(backend: str) -> None:
    """The replica's own overload meeting a key's cool-down takes it over for every caller, as it stands: its probe
    stays due 1 s into it (it started over at the 503 before, one probe more), and the key's long Retry-After stands."""
    spent = Plan(status=429, retry_after="20", headers=SPENT_KEY_LIMIT, headers_after=0.01)
    overload = Plan(status=503, retry_after="5", headers={"x-should-retry": "false"}, headers_after=0.01)
    callers = [("one", "m"), ("two", "m"), ("three", "m")]
    statuses, records = calls_in_turn(backend, [spent, overload, Plan()], callers)
    assert statuses == [429, 503, 200]
    refused, overloaded, probe = records
    assert refused.attempts[0].finish is not None
    assert overloaded.attempts[0].start == pytest.approx(refused.attempts[0].finish, abs=1e-6)  # another key's
    assert probe.attempts[0].start == pytest.approx(refused.attempts[0].finish + 1.0, abs=1e-6)


@BACKENDS
def test_a_lone_503_after_calls_served_joins_no_keys_run_of_429s(backend: str) -> None:
    """One key's run of 429s, other keys' calls served between: a single 503 then is one refusal among calls served,
    not the third of a run every caller's (it held back every key for 8-33 s, the refused key's probes renewing it)."""
    refusal = Plan(status=429, retry_after="20", headers_after=0.01)
    overload = Plan(status=503, retry_after="20", headers_after=0.01)
    plans = [refusal, Plan(), refusal, Plan(), refusal, overload, Plan()]
    callers = [(key, "m") for key in ("bad", "good", "bad", "good", "bad", "other", "another")]
    statuses, records = calls_in_turn(backend, plans, callers)
    assert statuses == [429, 200, 429, 200, 429, 503, 200]
    lone, next_call = records[-2:]
    assert lone.attempts[0].finish is not None
    assert next_call.attempts[0].start == pytest.approx(lone.attempts[0].finish, abs=1e-6)  # sent at once
