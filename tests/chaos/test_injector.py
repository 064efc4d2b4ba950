"""Faults injected by `Chaos` are handled as the real ones: through a real Guard, the openai SDK and loopback
servers where no timing matters, in virtual time (both backends) where it does. Each injected fault is marked on
its attempt's record; a fault scripted on the server instead gives the same attempts, unmarked."""

from __future__ import annotations

import contextlib
import gc
import sys
from typing import Any

import anyio
import httpx
import openai
import pytest

from llmguard_client import (
    AllAttemptsTimedOut,
    Chaos,
    ContinuationPolicy,
    Guard,
    GuardFailure,
    HedgePolicy,
    PhaseRecord,
    Tier,
    guard_failure,
)
from llmguard_client._chaos import CHAOS_ENV
from llmguard_client._routing.cooldown import REFUSALS_TO_COOL
from tests.loopback import LoopbackServer, Script
from tests.virtual import BACKENDS, FakeReplica, Plan, now, run_virtual, virtual_guard

WHOLE = "".join(f" t{i}" for i in range(10))
MESSAGES: Any = [{"role": "user", "content": "x"}]
STREAM_BODY: Any = {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 10}


@pytest.fixture(autouse=True)
def chaos_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CHAOS_ENV, "1")


def make_guard(servers: list[LoopbackServer], records: list[PhaseRecord], **kwargs: Any) -> Guard:
    # Deadlines of seconds: a busy machine's late bytes must not be taken for a fault (the instants: virtual time).
    kwargs.setdefault("tiers", {"t": Tier(ttft=10.0, total=30.0, stall=5.0)})
    kwargs.setdefault("hedge", None)
    return Guard(replicas=[s.url for s in servers], instrumentation=None, on_record=records.append, **kwargs)


async def sdk_text(guard: Guard, url: str) -> str:
    oai = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk", http_client=guard.http_client(), max_retries=0)
    stream = await oai.chat.completions.create(model="m", messages=MESSAGES, stream=True, max_tokens=10)
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


def attempts(record: PhaseRecord) -> list[tuple[str, str, str, str | None, tuple[str, ...]]]:
    return [(a.replica, a.kind, a.outcome, a.error, a.chaos) for a in record.attempts]


async def test_an_injected_429_cools_the_replica_and_the_retry_goes_elsewhere(servers: list[LoopbackServer]) -> None:
    """Every call on ``a`` gets an injected 429 with a Retry-After: each is retried on ``b`` at once, and ``a`` cools
    at its `REFUSALS_TO_COOL`-th refusal in a row (one among calls served holds back no other); then every call
    goes to ``b``."""
    a, b = servers[0].url, servers[1].url
    records: list[PhaseRecord] = []
    chaos = Chaos(rate_limited=1.0, retry_after=60.0, replicas=[a], seed=1)
    calls = 2 * REFUSALS_TO_COOL + 2
    async with make_guard(servers[:2], records, chaos=chaos) as guard:
        texts = [await sdk_text(guard, a) for _ in range(calls)]
        snapshot = guard.snapshot()
    assert texts == [" t0 t1 t2 t3 t4"] * calls
    refused = [r for r in records if r.attempts[0].replica == a]
    assert len(refused) == REFUSALS_TO_COOL
    for record in refused:
        assert attempts(record) == [
            (a, "primary", "failed", "http_429", ("status_429",)),
            (b, "retry", "won", None, ()),
        ]
        assert record.attempts[0].retry_after == 60.0 and record.attempts[0].status_code == 429
        assert record.attempts[0].sent is None and record.attempts[0].headers is not None  # nothing was sent
    cooled = records.index(refused[-1])
    assert [attempts(r) for r in records[cooled + 1 :]] == [[(b, "primary", "won", None, ())]] * (calls - cooled - 1)
    cooling = {r.name: r.cooling_for for r in snapshot.replicas}
    assert cooling[a] > 50.0 and cooling[b] == 0.0
    assert servers[0].received == [] and len(servers[1].received) == calls  # an injected status sends nothing
    assert snapshot.idle


@pytest.mark.parametrize(("fault", "real"), [("unavailable", 503), ("server_error", 500)])
async def test_an_injected_5xx_is_retried_and_learned_as_the_real_one(
    servers: list[LoopbackServer], fault: str, real: int
) -> None:
    a = servers[0].url
    injected: list[PhaseRecord] = []
    async with make_guard(servers[:2], injected, chaos=Chaos(**{fault: 1.0}, replicas=[a])) as guard:
        assert await sdk_text(guard, a) == " t0 t1 t2 t3 t4"
        after_injected = guard.snapshot().replicas
    servers[0].script = Script(status=real, body={"error": {"message": "real"}})
    scripted: list[PhaseRecord] = []
    async with make_guard(servers[:2], scripted) as guard:
        assert await sdk_text(guard, a) == " t0 t1 t2 t3 t4"
        after_real = guard.snapshot().replicas
    assert attempts(injected[0]) == [
        (a, "primary", "failed", f"http_{real}", (f"status_{real}",)),
        (servers[1].url, "retry", "won", None, ()),
    ]
    assert [x[:4] for x in attempts(injected[0])] == [x[:4] for x in attempts(scripted[0])]
    assert [(r.healthy, r.cooling_for > 0, r.circuit_open_for > 0) for r in after_injected] == [
        (r.healthy, r.cooling_for > 0, r.circuit_open_for > 0) for r in after_real
    ]


async def test_an_injected_reset_is_a_transport_error_retried_elsewhere(servers: list[LoopbackServer]) -> None:
    a, b = servers[0].url, servers[1].url
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records, chaos=Chaos(reset=1.0, replicas=[a])) as guard:
        assert await sdk_text(guard, a) == " t0 t1 t2 t3 t4"
        assert guard.snapshot().idle
    assert attempts(records[0]) == [(a, "primary", "failed", "read_error", ("reset",)), (b, "retry", "won", None, ())]


async def test_an_injected_cut_mid_stream_is_continued_on_another_replica(servers: list[LoopbackServer]) -> None:
    a, b = servers[0].url, servers[1].url
    for s in servers[:2]:
        s.script = Script(tokens=10, gap=0.005, continued=Script(tokens=None))
    records: list[PhaseRecord] = []
    chaos = Chaos(cut=1.0, replicas=[a])
    async with make_guard(servers[:2], records, chaos=chaos, continuation=ContinuationPolicy()) as guard:
        assert await sdk_text(guard, a) == WHOLE
        assert guard.snapshot().idle
    (record,) = records
    assert record.status == "ok" and record.continued
    broken, continued = record.attempts
    assert (broken.replica, broken.chaos, broken.first_token is not None) == (a, ("cut",), True)
    assert (continued.replica, continued.kind, continued.outcome, continued.chaos) == (b, "continuation", "won", ())
    assert continued.break_cause == broken.error == "remote_protocol_error"


async def test_an_injected_cut_without_continuation_fails_as_a_real_reset(servers: list[LoopbackServer]) -> None:
    a = servers[0].url
    outcomes = []
    for chaos, script in [
        (Chaos(cut=1.0, replicas=[a]), Script(tokens=10, gap=0.005)),
        (None, Script(tokens=10, gap=0.005, reset_after_tokens=3)),
    ]:
        servers[0].script = script
        records: list[PhaseRecord] = []
        async with make_guard(servers[:2], records, chaos=chaos) as guard:
            with pytest.raises(openai.APIConnectionError) as caught:
                await sdk_text(guard, a)
            assert guard.snapshot().idle
        (record,) = records
        outcomes.append((type(caught.value), record.status, record.cause, [x[:3] for x in attempts(record)]))
        marks = [x[4] for x in attempts(record)]
        assert marks == ([("cut",)] if chaos is not None else [()])
        assert record.attempts[0].error == record.cause  # the winner's break is its error too, as on its span
    injected, real = outcomes
    assert injected == real == (openai.APIConnectionError, "error", "remote_protocol_error", [(a, "primary", "won")])


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_injected_cut_leaves_no_async_generator_to_the_garbage_collector(
    servers: list[LoopbackServer], backend: str
) -> None:
    """The body's readers (httpx's and httpcore's async generators) end with an injected cut, as with a real one,
    continued, failed or in the control cohort; before, they were left suspended, ended by the garbage collector's
    finalizer (on trio with ``ResourceWarning: Async generator ... was garbage collected before it had been
    exhausted``)."""
    a = servers[0].url
    for s in servers[:2]:
        s.script = Script(tokens=10, gap=0.005, continued=Script(tokens=None))
    collected: list[str] = []
    unraisable: list[str] = []

    async def main() -> None:
        firstiter, finalizer = sys.get_asyncgen_hooks()  # the event loop's: each generator keeps the one it met

        def finalize(agen: Any) -> None:
            collected.append(agen.ag_code.co_qualname)
            assert finalizer is not None
            finalizer(agen)

        sys.set_asyncgen_hooks(firstiter, finalize)
        try:
            for kwargs in ({"continuation": ContinuationPolicy()}, {}, {"rollout": 0.0}):
                async with make_guard(servers[:2], [], chaos=Chaos(cut=1.0, replicas=[a]), **kwargs) as guard:
                    async with guard.http_client() as client:
                        async with client.stream("POST", a + "/v1/chat/completions", json=STREAM_BODY) as answer:
                            with contextlib.suppress(httpx.HTTPError):
                                async for _ in answer.aiter_lines():
                                    pass
            gc.collect()
            await anyio.sleep(0.01)  # the finalizer's closes, had there been any, run on the loop
        finally:
            sys.set_asyncgen_hooks(firstiter, finalizer)

    previous = sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(f"{u.exc_type.__name__}: {u.exc_value}")
    try:
        anyio.run(main, backend=backend)
    finally:
        sys.unraisablehook = previous
    assert collected == []
    assert unraisable == []


async def test_an_injected_cut_reaches_the_control_cohort_too(servers: list[LoopbackServer]) -> None:
    """A rollout comparison under chaos sees the same faults on both sides: a control call's stream is cut
    after its first content token, as a guarded call's is, and its attempt is marked."""
    a = servers[0].url
    servers[0].script = Script(tokens=10, gap=0.005)
    records: list[PhaseRecord] = []
    async with make_guard(servers[:1], records, chaos=Chaos(cut=1.0), rollout=0.0) as guard:
        with pytest.raises(openai.APIConnectionError):
            await sdk_text(guard, a)
    (record,) = records
    (attempt,) = record.attempts
    assert (record.cohort, record.status, attempt.chaos) == ("control", "error", ("cut",))
    assert attempt.first_token is not None and record.first_token == attempt.first_token


BODY = {"model": "m", "messages": MESSAGES, "stream": True}


@BACKENDS
@pytest.mark.parametrize("how", ["injected", "real"])
def test_a_stall_before_the_first_token_is_hedged_at_the_hedge_delay(backend: str, how: str) -> None:
    """The same call, stalled by `Chaos` or by the replica itself: the hedge goes out at exactly 0.2 s and wins."""
    stalled = Plan(first_token_after=30.0) if how == "real" else Plan()
    fakes = {"http://a.test": FakeReplica("a", [stalled]), "http://b.test": FakeReplica("b")}
    chaos = Chaos(stall=1.0, stall_for=30.0, replicas=["http://a.test"]) if how == "injected" else None
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"i": Tier(ttft=1.0, total=5.0, stall=2.0)}
        guard = virtual_guard(fakes, records, tiers=tiers, hedge=HedgePolicy(delay=0.2), chaos=chaos)
        async with guard, guard.http_client() as client:
            start = now()
            response = await client.post("http://a.test/v1/chat/completions", json=BODY)
            assert now() - start == pytest.approx(0.2, abs=1e-9)
            assert '"b0 "' in response.text
            assert guard.snapshot().idle

    run_virtual(main, backend)
    (record,) = records
    mark = ("stall",) if how == "injected" else ()
    assert attempts(record) == [
        ("http://a.test", "primary", "lost", None, mark),
        ("http://b.test", "hedge", "won", None, ()),
    ]
    assert record.ttft == pytest.approx(0.2, abs=1e-9)
    assert fakes["http://a.test"].open_streams == 0  # the stalled answer was closed


@BACKENDS
def test_added_latency_delays_the_attempt_exactly_and_is_switched_off_live(backend: str) -> None:
    fakes = {"http://a.test": FakeReplica("a")}
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"i": Tier(ttft=1.0, total=5.0)}
        chaos = Chaos(latency=1.0, latency_for=0.3)
        guard = virtual_guard(fakes, records, tiers=tiers, hedge=None, chaos=chaos)
        async with guard, guard.http_client() as client:
            for _ in range(2):
                start = now()
                await client.post("http://a.test/v1/chat/completions", json=BODY)
                assert now() - start == pytest.approx(0.3 if guard.chaos else 0.0, abs=1e-9)
                guard.set_chaos(None)

    run_virtual(main, backend)
    assert [attempts(r) for r in records] == [
        [("http://a.test", "primary", "won", None, ("latency",))],
        [("http://a.test", "primary", "won", None, ())],
    ]


async def test_an_injected_stall_outlasting_the_sdks_read_timeout_times_out_as_a_real_one(
    servers: list[LoopbackServer],
) -> None:
    """openai.AsyncOpenAI(timeout=0.5, max_retries=1) and a stall of 3 s after the headers, injected or the
    replica's own (a stream's first token late, its headers sent at once as a server that queued the call sends
    them; a whole body late): each request's read times out at the SDK's 0.5 s and the call fails as an
    `APITimeoutError` (the injected stall used to be waited out: served after 3 s, one request). A whole body is
    read inside the SDK's request (``create()`` raises), which it retries once (the guard's timeout); a stream's
    ``create()`` returns and its timeout meets its caller reading it, not retried (the SDK's own, as without a
    guard): 3 requests."""
    a = servers[0].url
    outcomes = []
    stalls = {True: Script(tokens=3, stall_before_first=3.0), False: Script(hang_before_headers=3.0)}
    for chaos, scripts in [(Chaos(stall=1.0, stall_for=3.0), None), (None, stalls)]:
        servers[0].reset()
        records: list[PhaseRecord] = []
        async with make_guard(servers[:1], records, chaos=chaos) as guard:
            http_client = guard.http_client_for(openai.AsyncOpenAI)
            oai = openai.AsyncOpenAI(
                base_url=a + "/v1", api_key="sk", http_client=http_client, timeout=0.5, max_retries=1
            )
            for stream in (True, False):
                if scripts is not None:
                    servers[0].script = scripts[stream]
                returned = False  # a stream's create() returns: its status and headers came at once
                with pytest.raises(openai.APITimeoutError) as caught:
                    answer = await oai.chat.completions.create(model="m", messages=MESSAGES, stream=stream)
                    returned = True
                    if stream:
                        [c async for c in answer]
                outcomes.append((stream, returned, guard_failure(caught.value)))
        assert servers[0].wait_for(lambda: len(servers[0].received) == 3)
        marks = [("stall",)] * 3 if chaos is not None else [()] * 3
        assert [attempts(r) for r in records] == [[(a, "primary", "failed", "read_timeout", m)] for m in marks]
    assert outcomes == [(True, True, None), (False, False, "all_attempts_timed_out")] * 2


GET = ("GET", "http://a.test/v1/models", None)
CHAT = ("POST", "http://a.test/v1/chat/completions", BODY)
CHAT_BODY = ("POST", "http://a.test/v1/chat/completions", {**BODY, "stream": False})


@BACKENDS
@pytest.mark.parametrize("request_", [CHAT, CHAT_BODY, GET], ids=["stream", "body", "get"])
@pytest.mark.parametrize(("read", "stall_for", "ends_at"), [(1.0, 30.0, 1.0), (5.0, 2.0, 2.0), (None, 2.0, 2.0)])
def test_an_injected_stall_is_bounded_by_the_requests_read_timeout(
    backend: str, request_: tuple[str, str, Any], read: float | None, stall_for: float, ends_at: float
) -> None:
    """A stall longer than the request's read timeout ends at that timeout in a read timeout, the pool's
    `httpx.ReadTimeout` (the guard leaves it to the caller's retries): a stream's, after its headers, met reading
    the body as without a guard, else as the cause of the guard's `AllAttemptsTimedOut`; a shorter one, or none,
    is waited out."""
    fakes = {"http://a.test": FakeReplica("a")}
    records: list[PhaseRecord] = []
    method, url, body = request_

    async def main() -> None:
        tiers = {"i": Tier(ttft=60.0, total=120.0)}
        guard = virtual_guard(fakes, records, tiers=tiers, hedge=None, chaos=Chaos(stall=1.0, stall_for=stall_for))
        async with guard, guard.http_client() as client:
            start = now()
            timeout = httpx.Timeout(None, read=read)
            if read is not None and read < stall_for:
                with pytest.raises(httpx.TimeoutException) as caught:
                    await client.request(method, url, json=body, timeout=timeout)
                error = caught.value
                if request_ is not CHAT:
                    assert isinstance(error, AllAttemptsTimedOut)
                    error = error.__cause__
                assert isinstance(error, httpx.ReadTimeout) and not isinstance(error, GuardFailure)
            else:
                assert (await client.request(method, url, json=body, timeout=timeout)).status_code == 200
            assert now() - start == pytest.approx(ends_at, abs=1e-9)
            assert guard.snapshot().idle

    run_virtual(main, backend)
    (record,) = records
    timed_out = read is not None and read < stall_for
    outcome = ("failed", "read_timeout") if timed_out else ("won", None)
    assert attempts(record) == [("http://a.test", "primary", *outcome, ("stall",))]
    assert fakes["http://a.test"].requests == 1 and fakes["http://a.test"].open_streams == 0


@BACKENDS
def test_added_latency_outlasting_the_connect_timeout_is_a_connect_timeout(backend: str) -> None:
    """Latency is added where a slow connect would be, before anything is sent: a connect timeout shorter than
    it ends the attempt there (`httpx.ConnectTimeout`, nothing sent), and the guard retries it elsewhere."""
    fakes = {"http://a.test": FakeReplica("a"), "http://b.test": FakeReplica("b")}
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"i": Tier(ttft=10.0, total=20.0)}
        chaos = Chaos(latency=1.0, latency_for=3.0, replicas=["http://a.test"])
        guard = virtual_guard(fakes, records, tiers=tiers, hedge=None, chaos=chaos)
        async with guard, guard.http_client() as client:
            response = await client.post(CHAT[1], json=BODY, timeout=httpx.Timeout(None, connect=1.0))
            assert '"b0 "' in response.text
            assert guard.snapshot().idle

    run_virtual(main, backend)
    (record,) = records
    assert attempts(record) == [
        ("http://a.test", "primary", "failed", "connect_timeout", ("latency",)),
        ("http://b.test", "retry", "won", None, ()),
    ]
    assert record.attempts[0].finish == pytest.approx(record.attempts[0].start + 1.0, abs=1e-9)
    assert record.attempts[0].sent is None and fakes["http://a.test"].requests == 0


@pytest.mark.parametrize(
    ("fault", "anthropic_type", "openai_type"),
    [
        ("rate_limited", "rate_limit_error", "rate_limit_exceeded"),
        ("unavailable", "overloaded_error", "service_unavailable"),
        ("server_error", "api_error", "internal_server_error"),
    ],
)
async def test_an_injected_error_answer_has_the_error_shape_of_the_api_called(
    servers: list[LoopbackServer], fault: str, anthropic_type: str, openai_type: str
) -> None:
    """An injected 429/503/500 to Anthropic's ``/v1/messages`` carries Anthropic's error object (its SDK's
    ``e.type`` is the API's own, e.g. ``rate_limit_error``; it used to be OpenAI's), and OpenAI's elsewhere."""
    anthropic = pytest.importorskip("anthropic")
    a = servers[0].url
    one = {"x-llmguard-max-attempts": "1"}
    async with make_guard(servers[:1], [], chaos=Chaos(**{fault: 1.0})) as guard:
        claude = anthropic.AsyncAnthropic(
            base_url=a, api_key="sk", max_retries=0, http_client=guard.http_client_for(anthropic.AsyncAnthropic)
        )
        with pytest.raises(anthropic.APIStatusError) as from_claude:
            await claude.messages.create(model="m", max_tokens=5, messages=MESSAGES, extra_headers=one)
        oai = openai.AsyncOpenAI(
            base_url=a + "/v1", api_key="sk", max_retries=0, http_client=guard.http_client_for(openai.AsyncOpenAI)
        )
        with pytest.raises(openai.APIStatusError) as from_openai:
            await oai.chat.completions.create(model="m", messages=MESSAGES, extra_headers=one)
    assert from_claude.value.type == anthropic_type
    assert from_claude.value.body == {
        "type": "error",
        "error": {"type": anthropic_type, "message": f"HTTP {from_claude.value.status_code} injected by Chaos"},
    }
    assert from_openai.value.type == openai_type and from_openai.value.code == openai_type
    assert from_claude.value.status_code == from_openai.value.status_code
    assert servers[0].received == []


@pytest.mark.parametrize(
    ("retry_after", "headers", "learned"),
    [
        (2.0, {"retry-after": "2"}, 2.0),
        (0.4, {"retry-after": "1", "retry-after-ms": "400"}, 0.4),
        (2.5, {"retry-after": "3", "retry-after-ms": "2500"}, 2.5),
        (1e9, {"retry-after": "1000000000"}, 300.0),  # the record caps what it notes at 300 s
    ],
)
def test_an_injected_retry_after_is_whole_seconds_and_a_fraction_is_sent_in_ms_too(
    retry_after: float, headers: dict[str, str], learned: float
) -> None:
    """HTTP's Retry-After is an integer of seconds (it used to be ``%g``: ``0.4``, ``1e+09``); a fractional delay
    is rounded up there, and sent exactly as ``retry-after-ms``, which the guard and the SDKs read first."""
    fakes = {"http://a.test": FakeReplica("a")}
    records: list[PhaseRecord] = []

    async def main() -> None:
        chaos = Chaos(rate_limited=1.0, retry_after=retry_after)
        guard = virtual_guard(fakes, records, tiers={"i": Tier(ttft=1.0, total=5.0)}, hedge=None, chaos=chaos)
        async with guard, guard.http_client() as client:
            one = {"x-llmguard-max-attempts": "1"}
            response = await client.post("http://a.test/v1/chat/completions", json=BODY, headers=one)
        assert response.status_code == 429
        assert {k: v for k, v in response.headers.items() if k.startswith("retry-after")} == headers

    run_virtual(main)
    (record,) = records
    assert record.attempts[0].retry_after == pytest.approx(learned)


async def test_the_kill_switch_turns_the_guard_off_not_the_faults(
    servers: list[LoopbackServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``LLMGUARD_DISABLED=1`` every call is passed through as the control cohort, and still gets the
    injected faults, as it would get a real replica's: an injected 429 reaches the caller, unretried."""
    monkeypatch.setenv("LLMGUARD_DISABLED", "1")
    a = servers[0].url
    records: list[PhaseRecord] = []
    async with make_guard(servers[:2], records, chaos=Chaos(rate_limited=1.0, replicas=[a])) as guard:
        with pytest.raises(openai.RateLimitError):
            await sdk_text(guard, a)
    (record,) = records
    assert (record.cohort, attempts(record)) == ("control", [(a, "primary", "failed", "http_429", ("status_429",))])


@BACKENDS
def test_switching_chaos_off_does_not_end_a_stall_under_way(backend: str) -> None:
    """`set_chaos(None)` applies from the next attempt: a stall already held goes on to its end (30 s here)."""
    fakes = {"http://a.test": FakeReplica("a")}
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"i": Tier(ttft=60.0, total=120.0)}
        guard = virtual_guard(fakes, records, tiers=tiers, hedge=None, chaos=Chaos(stall=1.0, stall_for=30.0))
        async with guard, guard.http_client() as client, anyio.create_task_group() as tg:
            start = now()

            async def switch_off() -> None:
                await anyio.sleep(1.0)
                guard.set_chaos(None)

            tg.start_soon(switch_off)
            await client.post(CHAT[1], json=BODY)
            assert now() - start == pytest.approx(30.0, abs=1e-9)
            await client.post(CHAT[1], json=BODY)
            assert now() - start == pytest.approx(30.0, abs=1e-9)

    run_virtual(main, backend)
    assert [attempts(r) for r in records] == [
        [("http://a.test", "primary", "won", None, ("stall",))],
        [("http://a.test", "primary", "won", None, ())],
    ]
