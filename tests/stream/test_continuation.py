"""Mid-stream failover by continuation: exact instants in virtual time on both backends; through the openai
SDK and raw httpx on real loopback servers.

Both servers run the same script: the one that gets the call breaks after 5 tokens; a continuation
request (one already holding `` t0 ... t4``) is answered by ``Script.continued``, which numbers its
tokens on from there, so a spliced answer reads `` t0 ... t9``.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import anyio
import httpx
import openai
import pytest

from llmguard_client import (
    BudgetPolicy,
    ContinuationPolicy,
    Guard,
    GuardConfigError,
    PhaseRecord,
    RetryPolicy,
    StallTimeout,
    Tier,
    TotalTimeout,
    UpstreamStreamError,
)
from tests.loopback import LoopbackServer, Script, raw_server
from tests.virtual import BACKENDS, FakeReplica, Plan, now, run_virtual, virtual_guard

WHOLE = "".join(f" t{i}" for i in range(10))
FIRST5 = "".join(f" t{i}" for i in range(5))
PATHS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    "completions": ("/v1/completions", {"prompt": "x"}),
}


def make_guard(servers: list[LoopbackServer], records: list[PhaseRecord], **kwargs: Any) -> Guard:
    # A stall limit 20x the scripted gaps and a ttft of seconds: a busy machine's late bytes must not be taken for
    # a stall or a missed first token (the exact instants: the virtual-time test below).
    kwargs.setdefault("tiers", {"t": Tier(ttft=10.0, total=30.0, stall=1.0)})
    kwargs.setdefault("hedge", None)
    kwargs.setdefault("continuation", ContinuationPolicy())
    return Guard(replicas=[s.url for s in servers], instrumentation=None, on_record=records.append, **kwargs)


@BACKENDS
def test_a_stall_is_continued_on_another_replica_at_its_exact_instant(backend: str) -> None:
    """The first token comes at once, the next one 0.6 s later: the 0.5 s stall limit passes at exactly
    0.5 s, and the continuation is sent to the other replica at that instant."""
    fakes = {"http://a.test": FakeReplica("a", [Plan(tokens=5, gap=0.6)]), "http://b.test": FakeReplica("b")}
    records: list[PhaseRecord] = []
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}

    async def main() -> None:
        tiers = {"i": Tier(ttft=1.0, total=5.0, stall=0.5)}
        guard = virtual_guard(fakes, records, tiers=tiers, hedge=None, continuation=ContinuationPolicy())
        async with guard, guard.http_client() as client:
            start = now()
            async with client.stream("POST", "http://a.test" + PATHS["chat"][0], json=body) as response:
                text = (await response.aread()).decode()
            assert now() - start == pytest.approx(0.5, abs=1e-9)
            assert guard.snapshot().idle
        assert '"a0 "' in text and '"b0 "' in text and text.endswith("data: [DONE]\n\n")

    run_virtual(main, backend)
    primary, continued = records[0].attempts
    assert (primary.error, continued.kind, continued.replica) == ("stall_timeout", "continuation", "http://b.test")
    assert primary.finish is not None and primary.finish - primary.start == pytest.approx(0.5, abs=1e-9)
    assert continued.start == pytest.approx(primary.finish, abs=1e-9)
    assert records[0].status == "ok" and fakes["http://a.test"].open_streams == 0


@BACKENDS
def test_a_broken_stream_is_timed_by_its_reads_not_by_its_callers_pauses(backend: str) -> None:
    """The broken replica's pace is reported when another takes over: a stream sent at once (3 tokens, then a reset)
    and read one chunk a second took it no time per token; nor did the continuation's."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(tokens=6, reset_after_tokens=3)]),
        "http://b.test": FakeReplica("b"),
    }
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}

    async def main() -> None:
        tiers = {"i": Tier(ttft=5.0, total=60.0, stall=5.0)}
        guard = virtual_guard(fakes, [], tiers=tiers, hedge=None, continuation=ContinuationPolicy())
        async with guard, guard.http_client() as client:
            async with client.stream("POST", "http://a.test" + PATHS["chat"][0], json=body) as response:
                async for _ in response.aiter_raw():
                    await anyio.sleep(1.0)
            assert [s.health.tpot for s in guard._replica_set.router.states] == [0.0, 0.0]

    run_virtual(main, backend)
    assert [f.requests for f in fakes.values()] == [1, 1]


def script(**breaks: Any) -> Script:
    return Script(tokens=10, continued=Script(tokens=None), **breaks)


async def sdk_text(guard: Guard, url: str, protocol: str) -> tuple[str, list[Any]]:
    oai = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk", http_client=guard.http_client(), max_retries=0)
    usage = {"include_usage": True}
    options: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": 10, "stream_options": usage}
    if protocol == "chat":
        stream: Any = await oai.chat.completions.create(messages=[{"role": "user", "content": "x"}], **options)
    else:
        stream = await oai.completions.create(prompt="x", **options)
    chunks = [chunk async for chunk in stream]
    text = "".join(
        (c.choices[0].delta.content or "") if protocol == "chat" else c.choices[0].text for c in chunks if c.choices
    )
    return text, chunks


async def raw_events(client: httpx.AsyncClient, url: str, protocol: str) -> list[bytes]:
    path, body = PATHS[protocol]
    payload = {"model": "m", "stream": True, "max_tokens": 10, "stream_options": {"include_usage": True}, **body}
    async with client.stream("POST", url + path, json=payload) as response:
        raw = b"".join([chunk async for chunk in response.aiter_raw()])
    return [e[6:] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]


@pytest.mark.parametrize("protocol", ["chat", "completions"])
async def test_a_reset_after_5_tokens_ends_as_one_whole_answer_through_the_sdk(
    servers: list[LoopbackServer], protocol: str
) -> None:
    for s in servers[:2]:
        s.script = script(reset_after_tokens=5)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard:
        text, chunks = await sdk_text(guard, servers[0].url, protocol)
    assert text == WHOLE
    assert {c.id for c in chunks} == {"chatcmpl-test" if protocol == "chat" else "cmpl-test"}
    assert all(choice.index == 0 for c in chunks for choice in c.choices)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 10  # 5 delivered + 5 continued
    (record,) = records
    assert record.status == "ok" and record.continued
    broken, continued = record.attempts
    assert (broken.kind, broken.outcome, continued.kind, continued.outcome) == (
        "primary",
        "failed",
        "continuation",
        "won",
    )
    assert broken.replica != continued.replica
    assert (continued.resumed_at, continued.resumed_tokens) == (len(FIRST5), 5)
    assert continued.break_cause is not None and broken.error == continued.break_cause
    assert record.completion_tokens == 10
    sent = [b for s in servers[:2] for b in s.bodies()]
    assert len(sent) == 2
    follow_up = next(b for b in sent if b["max_tokens"] == 5)
    if protocol == "chat":
        assert follow_up["messages"][-1] == {"role": "assistant", "content": FIRST5}
        assert follow_up["continue_final_message"] is True and follow_up["add_generation_prompt"] is False
    else:
        assert follow_up["prompt"] == "x" + FIRST5


@pytest.mark.parametrize("protocol", ["chat", "completions"])
@pytest.mark.parametrize(
    "breaks",
    [
        {"reset_after_tokens": 5},
        {"truncate_at": 5},
        {"error_at": 5},
        {"malformed_at": 5},
    ],
    ids=["reset", "truncated", "error_event", "malformed"],
)
async def test_the_spliced_stream_has_one_role_delta_one_done_one_id(
    servers: list[LoopbackServer], protocol: str, breaks: dict[str, int]
) -> None:
    for s in servers[:2]:
        s.script = script(**breaks)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard, guard.http_client() as client:
        events = await raw_events(client, servers[0].url, protocol)
    assert events.count(b"[DONE]") == 1 and events[-1] == b"[DONE]"
    objs = [json.loads(e) for e in events[:-1]]
    assert not any("error" in o for o in objs)
    assert len({o["id"] for o in objs}) == 1
    if protocol == "chat":
        assert sum("role" in c["delta"] for o in objs for c in o["choices"]) == 1
        text = "".join(c["delta"].get("content") or "" for o in objs for c in o["choices"])
    else:
        text = "".join(c["text"] for o in objs for c in o["choices"])
    assert text == WHOLE
    assert objs[-1]["usage"]["completion_tokens"] == 10
    assert records[0].status == "ok" and [a.kind for a in records[0].attempts] == ["primary", "continuation"]


async def test_a_stall_past_the_tier_limit_is_continued(servers: list[LoopbackServer]) -> None:
    for s in servers[:2]:
        s.script = Script(tokens=10, stall_after_first=10.0, continued=Script(tokens=None))  # 10x the limit
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard:
        text, _ = await sdk_text(guard, servers[0].url, "chat")
    assert text == WHOLE
    assert records[0].attempts[-1].break_cause == StallTimeout.cause
    assert servers[0].wait_for(lambda: sum(s.disconnects for s in servers[:2]) == 1)  # the stalled one was closed


async def test_without_continuation_the_caller_gets_todays_error(servers: list[LoopbackServer]) -> None:
    for s in servers[:2]:
        s.script = script(error_at=5)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records, continuation=None) as guard, guard.http_client() as client:
        with pytest.raises(UpstreamStreamError):
            await raw_events(client, servers[0].url, "chat")
    assert sum(len(s.received) for s in servers[:2]) == 1
    assert [a.kind for a in records[0].attempts] == ["primary"] and records[0].status == "error"


async def test_a_tool_call_stream_is_not_continued(servers: list[LoopbackServer]) -> None:
    for s in servers[:2]:
        s.script = script(reset_after_tokens=5, tool_calls=True)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard, guard.http_client() as client:
        with pytest.raises(httpx.TransportError):
            await raw_events(client, servers[0].url, "chat")
    assert sum(len(s.received) for s in servers[:2]) == 1
    assert records[0].status == "error" and records[0].not_continued == "not_text"


@pytest.mark.parametrize("body", [{"n": 2}, {"logprobs": True}], ids=["n2", "logprobs"])
async def test_requests_that_cannot_be_continued_fail_as_today(
    servers: list[LoopbackServer], body: dict[str, Any]
) -> None:
    for s in servers[:2]:
        s.script = script(reset_after_tokens=5)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard, guard.http_client() as client:
        payload = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}], **body}
        with pytest.raises(httpx.TransportError):
            async with client.stream("POST", servers[0].url + "/v1/chat/completions", json=payload) as response:
                await response.aread()
    assert sum(len(s.received) for s in servers[:2]) == 1


async def test_a_break_too_close_to_the_total_deadline_is_not_continued(servers: list[LoopbackServer]) -> None:
    for s in servers[:2]:
        s.script = script(reset_after_tokens=5, gap=0.05)
    records: list[PhaseRecord] = []
    policy = ContinuationPolicy(min_time_left=29.9)  # total 30 s: 5 tokens 50 ms apart leave less than 29.9 s
    async with make_guard(servers[:2], records, continuation=policy) as guard, guard.http_client() as client:
        with pytest.raises(httpx.TransportError):
            await raw_events(client, servers[0].url, "completions")
    assert sum(len(s.received) for s in servers[:2]) == 1
    assert len(records[0].attempts) == 1 and records[0].not_continued == "time_left"


async def test_a_spent_continuation_budget_is_not_overdrawn(servers: list[LoopbackServer]) -> None:
    for s in servers[:2]:
        s.script = script(truncate_at=5)
    records: list[PhaseRecord] = []
    policy = ContinuationPolicy(budget=BudgetPolicy(ratio=0.0, floor=0))
    async with make_guard(servers[:2], records, continuation=policy) as guard, guard.http_client() as client:
        with pytest.raises(Exception, match="ended the stream early"):
            await raw_events(client, servers[0].url, "chat")
        (budget,) = set(guard.transport.stream.continuation.budgets.values())  # type: ignore[union-attr]
        assert budget.snapshot().pending == 0 and budget.snapshot().refused == 1
    assert sum(len(s.received) for s in servers[:2]) == 1
    (record,) = records
    assert record.cause == "stream_truncated" and record.not_continued == "budget"


async def test_a_spent_retry_budget_does_not_block_a_continuation(servers: list[LoopbackServer]) -> None:
    """Continuations have their own budget: retries and hedges of other calls cannot starve them."""
    for s in servers[:2]:
        s.script = script(truncate_at=5)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records, budget=BudgetPolicy(ratio=0.0, floor=0)) as guard:
        text, _ = await sdk_text(guard, servers[0].url, "chat")
        assert guard.budget is not None and guard.budget.snapshot().spent == 0
    assert text == WHOLE
    assert records[0].continued and records[0].not_continued is None


def assert_continued_on_a_third_replica(record: PhaseRecord) -> None:
    """The call broke, its first continuation failed, and a second one on a third replica finished it."""
    assert record.status == "ok" and record.not_continued is None
    assert [(a.kind, a.outcome) for a in record.attempts] == [
        ("primary", "failed"),
        ("continuation", "failed"),
        ("continuation", "won"),
    ]
    assert len({a.replica for a in record.attempts}) == 3


@pytest.mark.parametrize("protocol", ["chat", "completions"])
async def test_a_continuation_that_fails_is_tried_once_more_on_a_third_replica(
    servers: list[LoopbackServer], protocol: str
) -> None:
    # Whichever replica each request reaches: the call breaks after 5 tokens, its first continuation gets a
    # 500, the second one finishes the answer.
    answers = iter([script(reset_after_tokens=5), Script(status=500), Script(tokens=None)])
    for s in servers:
        s.scripter = lambda index, attempt: next(answers)
    records: list[PhaseRecord] = []
    async with make_guard(servers, records) as guard:
        text, _ = await sdk_text(guard, servers[0].url, protocol)
    (record,) = records
    assert text == WHOLE
    assert_continued_on_a_third_replica(record)
    assert record.attempts[1].status_code == 500
    assert record.attempts[2].resumed_at == len(FIRST5) and record.attempts[2].break_cause is not None


async def test_a_continuation_that_times_out_after_its_headers_is_tried_on_a_third_replica_in_cooperative_mode(
    servers: list[LoopbackServer],
) -> None:
    """The SDK's read timeout (1 s) passes while a continuation's server holds the stream it answered: that stream was
    never the caller's (the caller reads the spliced one), so the SDK, which could not retry it, does not own it, and
    the guard tries a third replica, as for a continuation's 500."""
    answers = iter([script(reset_after_tokens=5), Script(stall_before_first=5.0), Script(tokens=None)])
    for s in servers:
        s.scripter = lambda index, attempt: next(answers)
    records: list[PhaseRecord] = []
    tiers = {"t": Tier(ttft=10.0, total=30.0, stall=5.0)}
    async with make_guard(servers, records, retry=RetryPolicy(mode="cooperative"), tiers=tiers) as guard:
        http_client = guard.http_client_for(openai.AsyncOpenAI)
        oai = openai.AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="sk", http_client=http_client, timeout=1.0)
        messages: Any = [{"role": "user", "content": "x"}]
        stream = await oai.chat.completions.create(model="m", messages=messages, stream=True, max_tokens=10)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    (record,) = records
    assert text == WHOLE
    assert_continued_on_a_third_replica(record)


async def test_max_continuations_1_sends_no_second_one(servers: list[LoopbackServer]) -> None:
    answers = iter([script(reset_after_tokens=5), Script(status=500), Script(tokens=None)])
    for s in servers:
        s.scripter = lambda index, attempt: next(answers)
    records: list[PhaseRecord] = []
    policy = ContinuationPolicy(max_continuations=1)
    async with make_guard(servers, records, continuation=policy) as guard, guard.http_client() as client:
        with pytest.raises(httpx.TransportError):
            await raw_events(client, servers[0].url, "chat")
    (record,) = records
    assert [a.kind for a in record.attempts] == ["primary", "continuation"]
    assert record.not_continued == "continuation_failed"
    assert sum(len(s.received) for s in servers) == 2


async def test_a_failed_continuation_leaves_the_original_error(servers: list[LoopbackServer]) -> None:
    for s in servers[:2]:
        s.script = Script(tokens=10, reset_after_tokens=5, continued=Script(status=503))
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard, guard.http_client() as client:
        with pytest.raises(httpx.TransportError):
            await raw_events(client, servers[0].url, "chat")
    (record,) = records
    assert [(a.kind, a.outcome) for a in record.attempts] == [("primary", "won"), ("continuation", "failed")]
    assert record.status == "error" and record.not_continued == "continuation_failed"


def test_the_policy_is_validated() -> None:
    with pytest.raises(GuardConfigError, match="max_continuations"):
        ContinuationPolicy(max_continuations=0)
    with pytest.raises(GuardConfigError, match="unknown tier"):
        Guard(["http://a.test"], continuation={"nope": ContinuationPolicy()})


async def test_a_stream_cut_by_the_total_deadline_is_not_continued(servers: list[LoopbackServer]) -> None:
    for s in servers[:2]:
        s.script = Script(tokens=60, gap=0.05, continued=Script(tokens=None))  # 3 s: three times the total
    records: list[PhaseRecord] = []
    # ttft = stall = total: a first token or a gap delayed by a busy machine still comes in time, and the cause
    # stays "total".
    tiers = {"t": Tier(ttft=1.0, total=1.0, stall=1.0)}
    async with make_guard(servers[:2], records, tiers=tiers) as guard, guard.http_client() as client:
        with pytest.raises(TotalTimeout):
            await raw_events(client, servers[0].url, "chat")
    (record,) = records
    assert [a.kind for a in record.attempts] == ["primary"]
    assert record.status == "timeout" and record.not_continued == "total_deadline"
    assert sum(len(s.received) for s in servers[:2]) == 1


async def test_the_broken_replica_is_reported_to_the_router_as_a_mid_stream_failure(
    servers: list[LoopbackServer],
) -> None:
    """Without continuation the call's end tells the router its replica failed mid-stream; with it the call's
    last winner is the continuation, so the broken replica's failure is reported when it is replaced."""
    for s in servers[:2]:
        s.script = script(reset_after_tokens=5)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records) as guard:
        text, _ = await sdk_text(guard, servers[0].url, "chat")
        health = {s.name: s.health for s in guard._replica_set.states}
    assert text == WHOLE
    broken, continued = records[0].attempts
    assert health[broken.replica].failure > 0
    assert health[continued.replica].failure == 0


class _ContinuationsFail(FakeReplica):
    """Streams every first request until a reset after 5 tokens; answers every continuation (a request
    carrying the partial answer as an assistant message) with a 500."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        messages = json.loads(request.content)["messages"]
        if any(m["role"] == "assistant" for m in messages):
            self.requests += 1
            return httpx.Response(500, json={"error": {"message": "scripted"}})
        return await super().handle_async_request(request)


@BACKENDS
def test_a_replica_whose_continuations_fail_opens_its_circuit(backend: str) -> None:
    """A continuation's failure is classified by the retry layer like any attempt's: a 500 counts toward the
    replica's circuit (here one failure opens it), and the next call's continuation is not sent to it."""
    plan = Plan(tokens=10, reset_after_tokens=5)
    fakes = {u: _ContinuationsFail(u[7], [plan]) for u in ("http://a.test", "http://b.test")}
    records: list[PhaseRecord] = []
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    circuit_open: dict[str, bool] = {}

    async def main() -> None:
        retry = RetryPolicy(circuit_failures=1, circuit_cooldown=60.0)
        guard = virtual_guard(fakes, records, hedge=None, retry=retry, continuation=ContinuationPolicy())
        async with guard, guard.http_client() as client:
            for _ in range(2):
                async with client.stream("POST", "http://a.test" + PATHS["chat"][0], json=body) as response:
                    with pytest.raises(httpx.TransportError):
                        await response.aread()
                if not circuit_open:
                    circuit_open.update({s.name: s.open(now()) for s in guard._replica_set.states})
            assert guard.snapshot().idle

    run_virtual(main, backend)
    first, second = records
    (primary, continued) = first.attempts
    assert (continued.kind, continued.status_code, first.not_continued) == ("continuation", 500, "continuation_failed")
    assert circuit_open == {continued.replica: True, primary.replica: False}
    # The second call's primary goes to the replica whose circuit is closed; its continuation has nowhere to go.
    assert [a.replica for a in second.attempts] == [primary.replica]
    assert second.not_continued == "no_replica"


def _chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    event = {"id": "c", "object": "chat.completion.chunk", "choices": [choice]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


async def _first_token_and_error_in_one_write(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A first request: its first token and an error event written in one piece (an engine failing right after
    it); a continuation request: the rest of the answer."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = re.search(rb"(?i)content-length: *(\d+)", head)
    body = json.loads(await reader.readexactly(int(length.group(1)) if length else 0))
    if body.get("continue_final_message"):
        answer = _chunk(" t1") + _chunk(" t2") + _chunk(None, "stop") + b"data: [DONE]\n\n"
    else:
        answer = _chunk(" t0") + b'data: {"error": {"message": "boom", "type": "internal_error", "code": 500}}\n\n'
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + answer)
    await writer.drain()
    writer.close()


async def test_an_error_in_the_same_read_as_the_first_token_is_continued() -> None:
    records: list[PhaseRecord] = []
    async with (
        raw_server(_first_token_and_error_in_one_write) as a,
        raw_server(_first_token_and_error_in_one_write) as b,
        Guard([a, b], instrumentation=None, on_record=records.append, continuation=ContinuationPolicy()) as guard,
    ):
        text, _ = await sdk_text(guard, a, "chat")
    assert text == " t0 t1 t2"  # the error never reached the SDK: the stream went on on the other replica
    (record,) = records
    assert record.status == "ok" and [a.kind for a in record.attempts] == ["primary", "continuation"]
