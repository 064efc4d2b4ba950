"""Retries the budget refuses after a replica's own failure go paced, as the plain SDK's retry would: two replicas
failing a seeded share of requests, the openai SDK over the guard, in virtual time on asyncio and trio."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from types import SimpleNamespace

import anyio
import httpx
import openai
import pytest

from llmguard_client import BudgetPolicy, PhaseRecord, RetryPolicy
from llmguard_client._budget.budget import BudgetSnapshot
from llmguard_client._layers import retry as retry_layer
from llmguard_client._routing import router
from tests.virtual import BACKENDS, FakeReplica, Plan, run_virtual, virtual_guard

CALLS, SHARE, SEED = 40, 0.3, 7
ATTEMPTS = RetryPolicy().max_attempts
"""The requests a call gets: the guard's default, and the plain openai SDK's (``max_retries=2``)."""
FAULTS = {
    "500": Plan(status=500, headers_after=0.01),
    "408": Plan(status=408, headers_after=0.01),
    "reset": Plan(headers_after=0.01, reset_before_headers=True),  # the connection breaks before any answer
}
"""Failures the plain SDK retries: each is raised by its request, before the answer's headers (not a stream cut after
them, which it meets reading the stream it returned, and does not retry)."""


@dataclass
class SeededFaults(FakeReplica):
    """A replica that fails the ``k``-th request of a call (named by its ``x-call-id``) with ``fault`` when
    ``plan[call][k]`` says so, whichever replica that request goes to (``sent``, shared by the replicas, counts each
    call's requests), and serves the others."""

    fault: Plan = field(default_factory=Plan)
    answer: Plan = field(default_factory=Plan)
    """The answer to the requests the plan does not fail."""
    plan: dict[str, list[bool]] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        call = request.headers["x-call-id"]
        k = self.sent.get(call, 0)
        self.sent[call] = k + 1
        self.plans = [self.fault if self.plan[call][k] else self.answer]  # read before the first await below
        return await super().handle_async_request(request)


def seeded_plan(seed: int) -> dict[str, list[bool]]:
    """For each call, whether each of its `ATTEMPTS` requests fails (a `SHARE` of them, seeded)."""
    draws = random.Random(seed)
    return {f"c{i}": [draws.random() < SHARE for _ in range(ATTEMPTS)] for i in range(CALLS)}


def plain_sdk(plan: dict[str, list[bool]]) -> tuple[set[str], int]:
    """What the plain openai SDK on one replica makes of ``plan``: the calls its 3 attempts serve (one that does not
    fail), and the requests it sends (up to the first that does not fail, at most 3 a call)."""
    served = {call for call, fails in plan.items() if not all(fails)}
    requests = sum(fails.index(False) + 1 if not all(fails) else ATTEMPTS for fails in plan.values())
    return served, requests


async def _streamed(client: openai.AsyncOpenAI, call: str) -> bool:
    """Stream call ``call`` (its ``x-call-id``) through ``client``, read whole as bytes (the SDK retries as with its
    event iterator): whether it was served to its end."""
    try:
        async with client.chat.completions.with_streaming_response.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True, extra_headers={"x-call-id": call}
        ) as response:
            body = await response.read()
    except openai.APIError:
        return False
    return body.endswith(b"data: [DONE]\n\n")


def window(retry: int, policy: RetryPolicy) -> float:
    """The same-replica backoff's window before retry ``retry`` (1, 2, ...): the wait is in [3/4, 1] of it."""
    return min(policy.backoff_max, policy.same_replica_backoff * 2.0 ** (retry - 1))


@BACKENDS
@pytest.mark.parametrize("budget", [BudgetPolicy(ratio=0.0, floor=0), BudgetPolicy(ratio=0.0, floor=2)])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_two_replicas_failing_a_random_share_serve_every_call_the_plain_sdk_serves(
    backend: str, fault: str, budget: BudgetPolicy
) -> None:
    """Two replicas each failing a random 30 % of requests (a 500, a 408, a reset before the answer), the retry
    budget empty or nearly so, the openai SDK streaming 40 calls through the guard. A retry the budget refuses goes
    to the other replica (or back) after the same-replica backoff, paced past the bound, as the plain SDK's retry
    would go: every call the plain SDK's 3 attempts serve is served, with as many requests. (The refused retry used
    to end the call, ``budget_exhausted``, final for the SDK: two replicas served fewer calls than one.)"""
    plan = seeded_plan(SEED)
    sent: dict[str, int] = {}
    fakes = {
        url: SeededFaults(url[7], fault=FAULTS[fault], plan=plan, sent=sent)
        for url in ("http://a.test", "http://b.test")
    }
    records: list[PhaseRecord] = []
    served: set[str] = set()
    snapshots: list[BudgetSnapshot] = []
    policy = RetryPolicy()

    async def main() -> None:
        async with virtual_guard(fakes, records, budget=budget, hedge=None) as virtual:
            client = openai.AsyncOpenAI(
                base_url="http://a.test/v1", api_key="k", http_client=virtual.http_client_for(openai.AsyncOpenAI)
            )
            for call in plan:
                if await _streamed(client, call):
                    served.add(call)
            await client.close()
            snapshot = virtual.snapshot().budget
            assert snapshot is not None
            snapshots.append(snapshot)

    run_virtual(main, backend)
    plain_served, plain_requests = plain_sdk(plan)
    assert served == plain_served
    assert sum(f.requests for f in fakes.values()) == plain_requests  # no more load than the plain SDK's
    (snapshot,) = snapshots
    assert snapshot.paced > 0 and snapshot.refused == snapshot.paced  # each refused retry went, paced
    for record in records:
        for retry, (before, after) in enumerate(zip(record.attempts, record.attempts[1:], strict=False), start=1):
            assert before.finish is not None
            if budget.floor == 0:  # every retry paced: after the same-replica backoff, as the SDK's waits
                w = window(retry, policy)
                assert w / 2 - 1e-6 <= after.start - before.finish <= w + 1e-6
            else:
                assert after.start >= before.finish


CUT_CALLS = 4


@BACKENDS
@pytest.mark.parametrize("mode", ["guard", "cooperative"])
@pytest.mark.parametrize("path", ["replica", "beside"])
def test_a_stream_cut_after_its_headers_is_retried_within_the_budget_and_never_paced_past_it(
    backend: str, mode: str, path: str
) -> None:
    """One replica (a gateway whose idle timeout is shorter than the model's first token) answers every call with its
    headers and a role-only event, then cuts the stream before the first token; the budget holds 2 retries. The plain
    openai SDK returns the stream at its headers and meets the cut reading it: one request a call, no retry. The
    guard retries the first call's cut twice, paid from the budget (in cooperative mode the SDK sends them), then
    each call ends as the plain SDK's: one request, ``create()`` returns the stream and reading it raises the SDK's
    connection error, as it does for the first call after its three. So do calls to another deployment ``beside``
    the replica's path, which the replica's state does not pace. (Every refused retry went paced past the empty
    budget, as if the plain SDK retried a cut: three requests each call, the error raised by ``create()``.)"""
    replica = "http://a.test/openai/deployments/east"
    base = replica if path == "replica" else "http://a.test/openai/deployments/west"
    fake = FakeReplica("a", [Plan(headers_after=0.01, reset_after_tokens=0)])
    met: list[tuple[int, str]] = []  # each call's requests, and where its error came: "create" or "reading"
    snapshots: list[BudgetSnapshot] = []

    async def main() -> None:
        retry = RetryPolicy(mode=mode)
        budget = BudgetPolicy(ratio=0.0, floor=2)
        async with virtual_guard({replica: fake}, [], retry=retry, budget=budget, hedge=None) as virtual:
            client = openai.AsyncOpenAI(
                base_url=base, api_key="k", http_client=virtual.http_client_for(openai.AsyncOpenAI)
            )
            for _ in range(CUT_CALLS):
                before, where = fake.requests, "create"
                with pytest.raises(openai.APIConnectionError):
                    stream = await client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "x"}], stream=True
                    )
                    where = "reading"
                    async for _ in stream:
                        pass
                met.append((fake.requests - before, where))
            await client.close()
            snapshot = virtual.snapshot().budget
            assert snapshot is not None
            snapshots.append(snapshot)

    run_virtual(main, backend)
    assert met == [(ATTEMPTS, "reading")] + [(1, "reading")] * (CUT_CALLS - 1)
    (snapshot,) = snapshots
    assert snapshot.paced == 0


ERROR_EVENTS = {
    "500": {"message": "the backend's stream broke", "code": "500"},  # LiteLLM's, its code a string
    "503": {"message": "the queue is full", "type": "Service Unavailable", "code": 503},  # vLLM's full queue
    "429 retry_after": {"message": "rate limited", "code": 429, "retry_after": 1},
}
"""Error events a server sends in a 200 stream before its first token: one the plain SDK meets reading the stream."""


@BACKENDS
@pytest.mark.parametrize("mode", ["guard", "cooperative"])
@pytest.mark.parametrize("path", ["replica", "beside"])
@pytest.mark.parametrize("error", list(ERROR_EVENTS))
def test_an_error_event_before_the_first_token_is_retried_within_the_budget_and_never_paced_past_it(
    backend: str, mode: str, path: str, error: str
) -> None:
    """One replica (a proxy such as LiteLLM, whose backend's stream breaks) answers every call with a 200 whose first
    event after the role is an error: a 500, an overload (503), a 429 asking for a second's rest. The plain openai SDK
    raises `APIError` reading the stream: one request a call, no retry. The guard retries the first call's error
    twice, paid from the budget's 2 (in cooperative mode the SDK sends them), then each call ends after one request,
    as the plain SDK's, with the answer the error stands for (the SDK raises it from ``create()``); so do calls to
    another deployment ``beside`` the replica's path. (Each refused retry went paced past the empty budget, as after
    an HTTP 500 or 429: three requests a call, waiting for the replica's cool-down or circuit.)"""
    replica = "http://a.test/openai/deployments/east"
    base = replica if path == "replica" else "http://a.test/openai/deployments/west"
    fake = FakeReplica("a", [Plan(headers_after=0.01, error_event=ERROR_EVENTS[error])])
    met: list[int] = []  # each call's requests
    snapshots: list[BudgetSnapshot] = []

    async def main() -> None:
        retry, budget = RetryPolicy(mode=mode), BudgetPolicy(ratio=0.0, floor=2)
        async with virtual_guard({replica: fake}, [], retry=retry, budget=budget, hedge=None) as virtual:
            client = openai.AsyncOpenAI(
                base_url=base, api_key="k", http_client=virtual.http_client_for(openai.AsyncOpenAI)
            )
            for _ in range(CUT_CALLS):
                before = fake.requests
                with pytest.raises(openai.APIError):  # the answer the error stands for, raised by create()
                    await client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "x"}], stream=True
                    )
                met.append(fake.requests - before)
            await client.close()
            snapshot = virtual.snapshot().budget
            assert snapshot is not None
            snapshots.append(snapshot)

    run_virtual(main, backend)
    assert met == [ATTEMPTS] + [1] * (CUT_CALLS - 1)
    (snapshot,) = snapshots
    assert snapshot.paced == 0


IN_OK_ANSWERS = {
    "cut": Plan(headers_after=0.01, reset_after_tokens=0),
    "error event": Plan(headers_after=0.01, error_event=ERROR_EVENTS["500"]),
}
"""Failures inside a 200 stream before its first token, which the plain SDK meets reading it and does not retry."""


@BACKENDS
@pytest.mark.parametrize("fault", list(IN_OK_ANSWERS))
def test_a_cut_after_the_headers_is_paced_to_a_replica_not_tried_and_does_not_cancel_a_5xxs_retry(
    backend: str, fault: str
) -> None:
    """The budget is empty. Replica b's gateway cuts every stream after its headers (or its backend's stream breaks,
    an error event before the first token); a answers its first call 500, then serves. The plain SDK pointed at a
    serves every call (its retry of the 500 included). Through the guard: a call whose 500 was retried on b, cut
    there, still goes back to a, paced, as the plain SDK's retry of the 500 would; and a call that met b's cut first
    goes paced to a, not tried yet (another replica may not share the fault). (Any cut ended the call, as the plain
    SDK ends a cut stream, and lost calls a served.)"""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(status=500), Plan()]),
        "http://b.test": FakeReplica("b", [IN_OK_ANSWERS[fault]]),
    }
    records: list[PhaseRecord] = []
    served: list[bool] = []

    async def main() -> None:
        budget = BudgetPolicy(ratio=0.0, floor=0)
        async with virtual_guard(fakes, records, budget=budget, hedge=None) as virtual:
            client = openai.AsyncOpenAI(
                base_url="http://a.test", api_key="k", http_client=virtual.http_client_for(openai.AsyncOpenAI)
            )
            for i in range(6):
                served.append(await _streamed(client, str(i)))
            await client.close()

    run_virtual(main, backend)
    assert served == [True] * 6
    first = [(a.replica, a.status_code) for a in records[0].attempts]
    assert first == [("http://a.test", 500), ("http://b.test", 200), ("http://a.test", 200)]
    assert any(r.attempts[0].replica == "http://b.test" for r in records)  # met b first, served by a


@BACKENDS
def test_two_replicas_failing_every_call_send_no_more_than_the_plain_sdk_and_their_circuits_bound_it(
    backend: str,
) -> None:
    """A fleet-wide outage: both replicas answer every call with a 500, the budget empty, 30 calls one after another.
    The paced retries send each call's 3 requests (the plain SDK's), after the same-replica backoff, until both
    circuits are open (`RetryPolicy.circuit_failures` calls each, every call counting once toward each); then, in
    panic mode, an open circuit gets no retry past the budget: one request a call (about 41 requests for the 30
    calls, where the plain SDK sends 90; the refused retries ended every call at one request before)."""
    fakes = {
        url: FakeReplica(url[7], [Plan(status=500, headers_after=0.01)]) for url in ("http://a.test", "http://b.test")
    }
    records: list[PhaseRecord] = []
    policy = RetryPolicy()

    async def main() -> None:
        async with virtual_guard(fakes, records, budget=BudgetPolicy(ratio=0.0, floor=0), hedge=None) as virtual:
            async with virtual.http_client() as client:
                for _ in range(30):
                    assert (
                        await client.post("http://a.test/v1/chat/completions", json={"model": "m"})
                    ).status_code == 500
                    await anyio.sleep(0.5)

    run_virtual(main, backend)
    attempts = [len(r.attempts) for r in records]
    assert sum(f.requests for f in fakes.values()) == sum(attempts) and max(attempts) <= ATTEMPTS
    opened = policy.circuit_failures  # by then both circuits are open: every call counts once toward each
    assert attempts[: opened - 1] == [ATTEMPTS] * (opened - 1)  # the plain SDK's requests, paced
    assert sum(n > 1 for n in attempts[opened:]) <= 2  # then one a call (a half-open circuit's probe may retry)
    assert sum(attempts) <= 30 * ATTEMPTS / 2  # the plain SDK: 90


@BACKENDS
def test_two_replicas_refusing_a_random_half_with_529_serve_the_calls_the_plain_sdk_serves(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas each answering a random half of requests with a 529 (no Retry-After: the hosted Anthropic API's
    overload), the retry budget empty, four callers streaming 60 calls through the openai SDK, twenty seeded runs. Three
    refusals in a row cool a replica for the other calls, and at times both are cooling when the budget refuses a
    call's retry: the retry then waits (its backoff, or until the first cool-down ends) for a replica to serve a call
    again, which ends its cool-down, and goes there. The guard serves all but at most 2 % of the
    calls the plain SDK's 3 attempts serve (the waiting retries, woken together, can meet three refusals in a row
    and cool a replica again; trio's scheduling order varies the count: 0.1-1.4 % measured); the refused
    retry used to end the call at once (``budget_exhausted``: 2.5-5.4 %)."""
    lost = plain = 0
    for seed in range(20):
        seeded = SimpleNamespace(Random=lambda seed=seed: random.Random(seed))  # the guard's backoff, router draws
        monkeypatch.setattr(retry_layer, "random", seeded)
        monkeypatch.setattr(router, "random", seeded)
        plan, served = _random_overload(backend, seed, calls=60, share=0.5)
        plain_served, _ = plain_sdk(plan)
        assert served <= plain_served
        lost += len(plain_served - served)
        plain += len(plain_served)
    assert lost <= plain * 2 / 100


def _random_overload(backend: str, seed: int, calls: int, share: float) -> tuple[dict[str, list[bool]], set[str]]:
    """Four callers streaming ``calls`` calls over two replicas that answer a seeded ``share`` of requests with a 529
    (`SeededFaults`), the budget empty: the plan, and the calls served."""
    draws = random.Random(seed)
    plan = {f"c{i}": [draws.random() < share for _ in range(ATTEMPTS)] for i in range(calls)}
    sent: dict[str, int] = {}
    overload, answer = Plan(status=529, headers_after=0.01), Plan(headers_after=0.01, first_token_after=0.02)
    fakes = {
        url: SeededFaults(url[7], fault=overload, answer=answer, plan=plan, sent=sent)
        for url in ("http://a.test", "http://b.test")
    }
    records: list[PhaseRecord] = []
    served: set[str] = set()

    async def main() -> None:
        async with virtual_guard(fakes, records, budget=BudgetPolicy(ratio=0.0, floor=0), hedge=None) as virtual:
            client = openai.AsyncOpenAI(
                base_url="http://a.test/v1", api_key="k", http_client=virtual.http_client_for(openai.AsyncOpenAI)
            )
            queue = list(plan)

            async def caller() -> None:
                while queue:
                    call = queue.pop(0)
                    if await _streamed(client, call):
                        served.add(call)

            async with anyio.create_task_group() as callers:
                for _ in range(4):
                    callers.start_soon(caller)
            await client.close()

    state = random.getstate()
    random.seed(seed)  # the SDK's own draws
    try:
        run_virtual(main, backend)
    finally:
        random.setstate(state)
    return plan, served
