"""Cooperative retries (``RetryPolicy(mode="cooperative")``): the SDK sends the retries the guard allows.

Real openai SDK through the guard to real loopback servers: one attempt per SDK request, the retry the
guard allows goes to another replica and is counted by the SDK (``retries_taken``, ``x-stainless-retry-count``);
the SDK's ``max_retries`` sets how many requests a call gets (the retry policy's ``max_attempts`` does not cap
them); a tier's or a call's explicit attempt limit, the budget and the call's deadline hold across the SDK's
requests, whatever ``max_retries`` says.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from llmguard_client import BudgetPolicy, Guard, RetryPolicy, Tier, guard_failure
from tests.edges.conftest import pools
from tests.loopback import LoopbackCluster, LoopbackServer, Script

openai = pytest.importorskip("openai")
pytest.importorskip("httpx2")
MESSAGES: Any = [{"role": "user", "content": "req0 hi"}]
ERROR = {"error": {"message": "boom", "type": "server_error"}}


def cooperative(urls: list[str], tier: Tier, budget: BudgetPolicy | None = None, **retry: Any) -> Guard:
    return Guard(
        urls,
        tiers={"t": tier},
        hedge=None,
        budget=budget or BudgetPolicy(),
        retry=RetryPolicy(**{"mode": "cooperative", "backoff_initial": 0.01, "backoff_max": 0.02, **retry}),
        instrumentation=None,
        transport_factory=pools,
    )


def sdk(guard: Guard, url: str, **kwargs: Any) -> Any:
    return openai.AsyncOpenAI(
        base_url=url + "/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI), **kwargs
    )


async def test_the_sdk_sends_the_retry_to_another_replica(cluster: LoopbackCluster) -> None:
    cluster.set_scripter(lambda index, attempt: Script(status=500, body=ERROR) if attempt == 1 else None)
    answers: list[tuple[int, str | None, str | None]] = []

    async def seen(response: Any) -> None:
        answers.append(
            (response.status_code, response.headers.get("x-should-retry"), response.headers.get("retry-after-ms"))
        )

    async with cooperative(cluster.urls, Tier(ttft=10, total=20)) as guard:
        client = openai.AsyncOpenAI(
            base_url=cluster.urls[0] + "/v1",
            api_key="k",
            http_client=guard.http_client_for(openai.AsyncOpenAI, event_hooks={"response": [seen]}),
        )
        with guard.capture() as calls:
            raw = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, max_tokens=3)
    assert raw.retries_taken == 1 and raw.parse().choices[0].message.content  # the SDK counted its retry
    status, should_retry, after_ms = answers[0]
    assert (status, should_retry) == (500, "true") and after_ms is not None and int(after_ms) >= 1  # the guard's go
    received = [(s.name, r.headers.get("x-stainless-retry-count")) for s in cluster.servers for r in s.received]
    assert sorted(count for _, count in received) == ["0", "1"]  # one request per SDK attempt, counted
    assert len({name for name, _ in received}) == 2  # the retry went to the other replica
    assert [len(c.attempts) for c in calls] == [1, 1] and [c.status for c in calls] == ["http_error", "ok"]


async def test_the_sdks_max_retries_sets_the_requests_over_the_policys_max_attempts(
    servers: list[LoopbackServer],
) -> None:
    """``max_retries=4`` asks for 5 requests; the policy's default ``max_attempts`` (3) does not cap them, and a
    fresh Guard's default budget (its floor: 4 retries) pays for all four retries."""
    servers[0].scripter = lambda index, attempt: Script(status=500, body=ERROR) if attempt <= 4 else None
    async with cooperative([servers[0].url], Tier(ttft=10, total=20)) as guard:
        client = sdk(guard, servers[0].url, max_retries=4)
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, max_tokens=3)
    assert raw.retries_taken == 4 and raw.parse().choices[0].message.content
    assert [r.headers.get("x-stainless-retry-count") for r in servers[0].received] == ["0", "1", "2", "3", "4"]


async def test_the_sdks_last_retry_gets_the_servers_answer(servers: list[LoopbackServer]) -> None:
    """The SDK stops at its ``max_retries``: the caller gets the server's answer, as without a guard."""
    servers[0].script = Script(status=500, body=ERROR)
    async with cooperative([servers[0].url], Tier(ttft=10, total=20)) as guard:
        with pytest.raises(openai.InternalServerError) as caught:
            await sdk(guard, servers[0].url, max_retries=4).chat.completions.create(model="m", messages=MESSAGES)
    assert caught.value.status_code == 500 and caught.value.body == ERROR["error"]
    assert [r.headers.get("x-stainless-retry-count") for r in servers[0].received] == ["0", "1", "2", "3", "4"]


async def test_the_wait_back_to_the_one_replica_doubles_across_the_sdks_requests(
    servers: list[LoopbackServer],
) -> None:
    """An endpoint answering 502 while it restarts: each SDK retry is told to wait the same-replica backoff for the
    times the replica failed the call (as the guard's own retries and the plain SDK's waits grow), not the first
    wait again, so the retries span what the plain SDK's do."""
    servers[0].scripter = lambda index, attempt: Script(status=502, body=ERROR) if attempt <= 2 else None
    waits: list[int] = []

    async def seen(response: Any) -> None:
        if response.status_code == 502:
            waits.append(int(response.headers["retry-after-ms"]))

    guard = cooperative([servers[0].url], Tier(ttft=10, total=20), backoff_max=2.0, same_replica_backoff=0.04)
    async with guard:
        client = openai.AsyncOpenAI(
            base_url=servers[0].url + "/v1",
            api_key="k",
            http_client=guard.http_client_for(openai.AsyncOpenAI, event_hooks={"response": [seen]}),
        )
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, max_tokens=3)
    assert raw.retries_taken == 2 and raw.parse().choices[0].message.content
    first, second = waits  # drawn in [3/4, 1] of 40 ms, then of 80 ms
    assert 30 <= first <= 40 and 60 <= second <= 80


async def test_the_sdks_retry_hedges_to_a_replica_that_failed_its_first_request(cluster: LoopbackCluster) -> None:
    """A replica that failed the call's first request (a 502 blip) is no replica to avoid for the SDK's retry: its
    wait counts that failure, but when the retry's replica is slow, the retry's hedge goes to the one that failed
    and recovered, which serves it."""
    cluster.set_scripter(
        lambda index, attempt: (
            Script(status=502, body=ERROR)
            if attempt == 1
            else Script(stall_before_first=10.0)
            if attempt == 2
            else None
        )
    )
    guard = Guard(
        cluster.urls,
        tiers={"t": Tier(ttft=20, total=40)},
        retry=RetryPolicy(mode="cooperative", backoff_initial=0.01, backoff_max=0.02),
        instrumentation=None,
        transport_factory=pools,
    )
    async with guard:
        client = sdk(guard, cluster.urls[0])
        with guard.capture() as calls:
            raw = await client.chat.completions.with_raw_response.create(
                model="m", messages=MESSAGES, max_tokens=3, stream=True
            )
            async for _ in raw.parse():
                pass
    assert raw.retries_taken == 1
    first, retry = calls
    assert [a.replica for a in first.attempts] != [] and retry.status == "ok"
    assert [(a.kind, a.outcome) for a in retry.attempts] == [("retry", "lost"), ("hedge", "won")]
    assert retry.attempts[1].replica == first.attempts[0].replica  # the replica that failed the first request


@pytest.mark.parametrize("cap", ["tier", "header"])
async def test_an_explicit_attempt_limit_holds_whatever_max_retries_says(
    servers: list[LoopbackServer], cap: str
) -> None:
    servers[0].script = Script(status=500, body=ERROR)
    tier = Tier(ttft=10, total=20, max_attempts=2 if cap == "tier" else None)
    headers = {"x-llmguard-max-attempts": "2"} if cap == "header" else {}
    async with cooperative([servers[0].url], tier) as guard:
        with pytest.raises(openai.InternalServerError) as caught:
            await sdk(guard, servers[0].url, max_retries=5).chat.completions.create(
                model="m", messages=MESSAGES, extra_headers=headers
            )
    assert caught.value.status_code == 500 and guard_failure(caught.value) == "upstream_status"
    assert caught.value.response.headers["x-should-retry"] == "false"  # the guard said no to a third
    assert [r.headers.get("x-stainless-retry-count") for r in servers[0].received] == ["0", "1"]


async def test_past_the_budget_the_sdks_retries_of_a_failure_go_paced(servers: list[LoopbackServer]) -> None:
    """A fresh Guard's budget holds 4 retries (its floor); the SDK's fifth (``max_retries=5``) of a 500 goes paced
    past it, as the plain SDK's would (after the same-replica backoff, counted in the budget's ``paced``): the call
    gets the SDK's 6 requests, as without a guard, and the last answer is the SDK's to give up on. (The fifth
    retry used to be refused, final, ``budget_exhausted``.)"""
    for server in servers:
        server.script = Script(status=500, body=ERROR)
    async with cooperative([s.url for s in servers], Tier(ttft=10, total=20), same_replica_backoff=0.02) as guard:
        with pytest.raises(openai.InternalServerError) as caught:
            await sdk(guard, servers[0].url, max_retries=5).chat.completions.create(model="m", messages=MESSAGES)
        budget = guard.snapshot().budget
    assert caught.value.response.headers["x-should-retry"] == "true"  # the guard would retry it; the SDK gave up
    received = sorted(r.headers.get("x-stainless-retry-count") for s in servers for r in s.received)
    assert received == ["0", "1", "2", "3", "4", "5"]
    # Refused twice: the fifth retry, sent paced, and a sixth the SDK did not send (its payment went back).
    assert budget is not None and (budget.paced, budget.spent, budget.refused) == (1, 5, 2)


async def test_a_streak_on_the_only_replica_is_paced_past_an_empty_budget(servers: list[LoopbackServer]) -> None:
    """One endpoint failing with 500s and an empty budget: the guard tells the SDK to come back when the
    replica's cool-down ends, and the SDK's retry is sent past the bound and served."""
    failing = Script(status=500, body=ERROR)
    servers[0].scripter = lambda index, attempt: failing if attempt == 1 else None
    policy = BudgetPolicy(ratio=0.0, floor=0)
    async with cooperative([servers[0].url], Tier(ttft=10, total=20), policy, overload_cooldown=0.2) as guard:
        answer = await sdk(guard, servers[0].url, max_retries=2).chat.completions.create(model="m", messages=MESSAGES)
        budget = guard.snapshot().budget
    assert answer.choices
    assert [r.headers.get("x-stainless-retry-count") for r in servers[0].received] == ["0", "1"]
    assert budget is not None and (budget.paced, budget.spent, budget.refused) == (1, 1, 1)


async def test_a_retry_the_server_paced_passes_an_empty_budget(servers: list[LoopbackServer]) -> None:
    """One endpoint under a rate limit: its 429 asks for a wait, the guard tells the SDK to wait that long, and
    the SDK's retry is sent although the budget is empty (the server paced it); a 500 would have ended the call."""
    rate_limited = Script(status=429, headers={"retry-after-ms": "200"}, body=ERROR)
    servers[0].scripter = lambda index, attempt: rate_limited if attempt == 1 else None
    async with cooperative([servers[0].url], Tier(ttft=10, total=20), BudgetPolicy(ratio=0.0, floor=0)) as guard:
        answer = await sdk(guard, servers[0].url, max_retries=2).chat.completions.create(model="m", messages=MESSAGES)
        budget = guard.snapshot().budget
    assert answer.choices
    assert [r.headers.get("x-stainless-retry-count") for r in servers[0].received] == ["0", "1"]
    assert budget is not None and (budget.paced, budget.spent, budget.refused) == (1, 1, 0)


async def test_timeouts_are_retried_by_the_sdk_within_the_guards_attempts(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(hang_before_headers=5.0)
    async with cooperative([servers[0].url], Tier(ttft=30, total=60, max_attempts=2)) as guard:
        client = sdk(guard, servers[0].url, max_retries=2, timeout=0.3)  # (each SDK retry sleeps 0.4-1 s first)
        with pytest.raises(openai.APITimeoutError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES)
    assert guard_failure(caught.value) == "all_attempts_timed_out"
    servers[0].wait_for(lambda: len(servers[0].received) >= 2)
    assert [r.headers.get("x-stainless-retry-count") for r in servers[0].received] == ["0", "1"]


async def test_the_calls_deadline_holds_across_the_sdks_requests(servers: list[LoopbackServer]) -> None:
    """The SDK's timeout (0.3 s) fires first; its first retry comes after its own backoff (0.375-0.5 s), still
    within the call's ttft of 1 s; its later ones (0.75-1 s, 1.5-2 s later) come past it and send nothing."""
    servers[0].script = Script(hang_before_headers=5.0)
    async with cooperative([servers[0].url], Tier(ttft=1.0, total=20)) as guard:
        client = sdk(guard, servers[0].url, max_retries=3, timeout=0.3)
        with pytest.raises(openai.APITimeoutError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES)
    assert guard_failure(caught.value) in ("all_attempts_timed_out", "ttft_timeout")  # whichever came first
    servers[0].wait_for(lambda: len(servers[0].received) >= 1)
    assert len(servers[0].received) <= 2  # the call's 1 s holds two of the SDK's four requests at most


async def test_a_caller_that_is_not_an_sdk_keeps_the_guards_retries(cluster: LoopbackCluster) -> None:
    cluster.set_scripter(lambda index, attempt: Script(status=500, body=ERROR) if attempt == 1 else None)
    async with cooperative(cluster.urls, Tier(ttft=10, total=20)) as guard, guard.http_client() as client:
        response = await client.post(
            cluster.urls[0] + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "max_tokens": 3}
        )
    assert response.status_code == 200  # the guard retried below plain httpx, which would not
    assert len(response.extensions["llmguard"].attempts) == 2


async def retry_spent_by_another_call(server: LoopbackServer, error: dict[str, Any]) -> list[httpx.Response]:
    """Call a gets ``error`` and a retry allowed; before the SDK sends it, call b spends the budget's one retry:
    a, b, b's retry, a's retry (the SDK's headers written by hand here, to interleave the two calls)."""
    server.script = Script(status=500, body=error)
    guard = Guard(
        [server.url],
        tiers={"t": Tier(ttft=10, total=20)},
        retry=RetryPolicy(mode="cooperative", backoff_initial=0.01, backoff_max=0.02),
        budget=BudgetPolicy(ratio=0.0, floor=1),
        instrumentation=None,
        transport_factory=pools,
    )
    url = server.url + "/v1/chat/completions"
    answers: list[httpx.Response] = []
    async with guard, guard.http_client() as client:
        for model, retry in (("a", "0"), ("b", "0"), ("b", "1"), ("a", "1")):
            headers = {"x-stainless-lang": "python", "x-stainless-retry-count": retry}
            answers.append(await client.post(url, json={"model": model}, headers=headers))
    return answers


async def test_a_retry_the_budget_no_longer_allows_gets_the_last_answer_as_final(servers: list[LoopbackServer]) -> None:
    """The guard allowed a retry; before the SDK sent it, another call spent the budget's last retry: the
    retry is not sent, and the last answer comes back final."""
    first, other, spent, again = await retry_spent_by_another_call(servers[0], ERROR)
    assert [r.headers["x-should-retry"] for r in (first, other)] == ["true", "true"]
    assert spent.status_code == 500  # call b's retry took the budget's one ticket
    assert (again.status_code, again.headers["x-should-retry"], again.headers["x-llmguard-cause"]) == (
        500,
        "false",
        "budget_exhausted",
    )
    assert again.json() == ERROR and "retry-after-ms" not in again.headers
    assert len(servers[0].received) == 3  # a, b, b's retry; a's retry was not sent


async def test_an_answer_too_long_to_keep_comes_whole_and_a_declined_retry_says_it_is_not_repeated(
    servers: list[LoopbackServer],
) -> None:
    """The SDK gets the server's long answer whole; the guard keeps only its first 64 KiB, so when the SDK's retry
    may not be sent after all, the answer handed back again says so (a JSON error of the same status), never cut."""
    long_error = {"error": {"message": "the server's own words " * 12_000, "type": "server_error"}}
    first, other, _, again = await retry_spent_by_another_call(servers[0], long_error)
    assert first.json() == other.json() == long_error  # whole, with the retry allowed
    assert (again.status_code, again.headers["x-llmguard-cause"]) == (500, "budget_exhausted")
    error = again.json()["error"]
    assert error["code"] == "budget_exhausted" and "not repeated" in error["message"]
    assert len(servers[0].received) == 3
