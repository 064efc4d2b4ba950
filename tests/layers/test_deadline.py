"""Deadlines in virtual time: exact instants, and a first token racing the ttft deadline."""

from __future__ import annotations

import contextlib
from typing import Any

import anyio
import httpx
import openai
import pytest

from llmguard_client import (
    ContinuationPolicy,
    Guard,
    HedgePolicy,
    PhaseRecord,
    StallTimeout,
    Tier,
    TotalTimeout,
    TTFTTimeout,
)
from tests.virtual import BACKENDS, FakeReplica, Plan, now, run_virtual, virtual_guard

CHAT = "/v1/chat/completions"
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}


def guard_for(fakes: dict[str, FakeReplica], records: list[PhaseRecord], **kwargs: Any) -> Guard:
    kwargs.setdefault("tiers", {"interactive": Tier(ttft=1.0, total=5.0, stall=0.5)})
    kwargs.setdefault("hedge", None)
    return virtual_guard(fakes, records, **kwargs)


@BACKENDS
def test_ttft_deadline_fires_at_its_exact_instant(backend: str) -> None:
    fakes = {"http://a.test": FakeReplica("a", [Plan(first_token_after=1.2)])}
    records: list[PhaseRecord] = []

    async def main() -> None:
        async with guard_for(fakes, records) as guard, guard.http_client() as client:
            start = now()
            with pytest.raises(TTFTTimeout, match="ttft deadline of tier 'interactive'"):
                await client.post("http://a.test" + CHAT, json=BODY)
            assert now() - start == pytest.approx(1.0, abs=1e-9)
            assert guard.snapshot().idle

    run_virtual(main, backend)
    assert fakes["http://a.test"].open_streams == 0
    assert records[0].status == "timeout" and records[0].cause == "ttft_timeout"


@pytest.mark.parametrize(
    ("plan", "error", "at"),
    [
        (Plan(tokens=5, gap=0.6), StallTimeout, 0.5),  # the first gap after the first token is 0.6 > stall 0.5
        (Plan(tokens=20, gap=0.3), TotalTimeout, 5.0),  # 0.3 s gaps never stall, but 20 of them outlive total
    ],
)
@BACKENDS
def test_stall_and_total_fire_at_their_exact_instants(
    plan: Plan, error: type[Exception], at: float, backend: str
) -> None:
    fakes = {"http://a.test": FakeReplica("a", [plan])}
    records: list[PhaseRecord] = []

    async def main() -> None:
        tier = Tier(ttft=1.0, total=5.0, stall=0.5)
        async with guard_for(fakes, records, tiers={"i": tier}) as guard, guard.http_client() as client:
            start = now()
            with pytest.raises(error):
                async with client.stream("POST", "http://a.test" + CHAT, json=BODY) as response:
                    await response.aread()
            elapsed = now() - start
            # total: from the call's start; stall: from the last chunk, so at least that long
            assert elapsed == pytest.approx(at, abs=1e-9) if error is TotalTimeout else elapsed >= at
            assert guard.snapshot().idle

    run_virtual(main, backend)
    assert fakes["http://a.test"].open_streams == 0
    assert records[0].status == "timeout"


@BACKENDS
def test_first_token_racing_the_ttft_deadline_is_delivered_or_refused_never_orphaned(backend: str) -> None:
    """200 calls whose first token lands within +-2 ms of the ttft deadline while the hedge loser's
    connection takes 3 ms to close: a token in time is delivered whole, a late one is a clean
    TTFTTimeout, and nothing is left streaming or counted in flight."""
    offsets = [(i - 100) * 0.00002 for i in range(201) if i != 100]  # -2 ms .. +2 ms, never exactly 0
    ttft = 1.0
    fakes: dict[str, FakeReplica] = {}
    for i, offset in enumerate(offsets):
        # Each call has its own primary (token at ttft + offset) and a hedge target that never answers in time.
        fakes[f"http://p{i}.test"] = FakeReplica(f"p{i}", [Plan(first_token_after=ttft + offset, tokens=3)])
    slow = FakeReplica("slow", [Plan(first_token_after=60, close_takes=0.003)])
    records: list[PhaseRecord] = []
    outcomes: dict[float, str] = {}

    async def main() -> None:
        guards = []
        for i in range(len(offsets)):
            replicas = {f"http://p{i}.test": fakes[f"http://p{i}.test"], "http://slow.test": slow}
            guard = guard_for(replicas, records, hedge=HedgePolicy(delay=0.5), tiers={"i": Tier(ttft=ttft, total=5)})
            guards.append(guard)

        async def one(i: int, offset: float) -> None:
            async with guards[i].http_client() as client:
                try:
                    response = await client.post(f"http://p{i}.test" + CHAT, json=BODY)
                    assert response.status_code == 200 and response.content.endswith(b"data: [DONE]\n\n")
                    outcomes[offset] = "ok"
                except TTFTTimeout:
                    outcomes[offset] = "ttft_timeout"

        async with anyio.create_task_group() as tg:
            for i, offset in enumerate(offsets):
                tg.start_soon(one, i, offset)
        for guard in guards:
            assert guard.snapshot().idle
            await guard.aclose()

    run_virtual(main, backend)
    assert all(outcomes[o] == "ok" for o in offsets if o < 0)
    assert all(outcomes[o] == "ttft_timeout" for o in offsets if o > 0)
    assert slow.open_streams == 0 and all(f.open_streams == 0 for f in fakes.values())
    # A primary that won was read to its end; one that lost the race to the deadline was closed unread.
    assert sum(f.completed for f in fakes.values()) == sum(1 for o in offsets if o < 0)
    assert {r.status for r in records} == {"ok", "timeout"}


@BACKENDS
def test_a_winner_published_while_the_deadline_fires_is_adopted(backend: str) -> None:
    """The token arrives 1 ms before the deadline; closing the loser takes 3 ms, so the deadline's
    scope fires during that cleanup: the call is still delivered (the old path returned a 504 and
    left the winner streaming into a connection nobody read)."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(first_token_after=0.999, tokens=3)]),
        "http://b.test": FakeReplica("b", [Plan(first_token_after=60, close_takes=0.003)]),
    }
    records: list[PhaseRecord] = []

    async def main() -> None:
        async with guard_for(fakes, records, hedge=HedgePolicy(delay=0.5)) as guard, guard.http_client() as client:
            response = await client.post("http://a.test" + CHAT, json=BODY)
            assert response.status_code == 200
            assert guard.snapshot().idle

    run_virtual(main, backend)
    assert [a.outcome for a in records[0].attempts] == ["won", "lost"]
    assert fakes["http://b.test"].open_streams == 0 and fakes["http://a.test"].completed == 1


@BACKENDS
def test_httpx_client_timeout_is_not_needed_in_virtual_time(backend: str) -> None:
    """Sanity: the fake transport honours the virtual clock (a 10 s header delay costs no wall time)."""
    fake = FakeReplica("a", [Plan(headers_after=10.0, stream=False)])

    async def main() -> None:
        start = now()
        response = await fake.handle_async_request(httpx.Request("POST", "http://a.test" + CHAT, json={}))
        assert response.status_code == 200
        assert now() - start == pytest.approx(10.0)

    run_virtual(main, backend)


# --- one fits_deadline: retry, hedge and continuation agree -------------------------------------------------

A, B = "http://a.test", "http://b.test"


def _learned(guard: Guard, median: float = 0.3) -> None:
    """Recent TTFTs of the class: ``median``, a p95 three times longer (one in ten is slow)."""
    for name in (A, B):
        for i in range(40):
            guard.ttft_stats.observe(name, "interactive", True, 3 * median if i % 10 == 0 else median)
    assert guard.ttft_stats.typical("interactive", True) == pytest.approx(median)


async def _decided_retry(left: float, learn: bool = True, median: float = 0.3) -> list[str]:
    """The first attempt gets a 503 ``left`` seconds before the 1 s ttft deadline: is a retry sent? (``learn``:
    with the TTFTs of `_learned` around ``median``, else none measured.)"""
    fakes = {
        A: FakeReplica("a", [Plan(status=503, headers_after=1.0 - left)]),
        B: FakeReplica("b", [Plan(status=503, headers_after=1.0 - left)]),
    }
    records: list[PhaseRecord] = []
    async with guard_for(fakes, records) as guard, guard.http_client() as client:
        if learn:
            _learned(guard, median)
        with contextlib.suppress(TTFTTimeout):  # a retry sent runs into the deadline: only the decision counts
            await client.post(A + CHAT, json=BODY)
    return [a.kind for a in records[0].attempts]


async def _decided_hedge(left: float, learn: bool = True, median: float = 0.3) -> list[str]:
    """The hedge delay passes ``left`` seconds before the 1 s ttft deadline: is a hedge sent? (``learn``: as for
    `_decided_retry`.)"""
    fakes = {A: FakeReplica("a", [Plan(first_token_after=2.0)]), B: FakeReplica("b", [Plan(first_token_after=2.0)])}
    records: list[PhaseRecord] = []
    hedge = HedgePolicy(delay=1.0 - left, max_hedges=1)
    async with guard_for(fakes, records, hedge=hedge) as guard, guard.http_client() as client:
        if learn:
            _learned(guard, median)
        with pytest.raises(TTFTTimeout):
            await client.post(A + CHAT, json=BODY)
    return [a.kind for a in records[0].attempts]


async def _decided_continuation(left: float) -> list[str]:
    """The stream breaks ``left`` seconds before the call's 2 s total deadline: is a continuation sent?"""
    gap = (2.0 - left) / 5  # the 6th token (i == 5) is a reset, at 5 gaps
    fakes = {A: FakeReplica("a", [Plan(tokens=10, gap=gap, reset_after_tokens=5)]), B: FakeReplica("b")}
    records: list[PhaseRecord] = []
    tiers = {"interactive": Tier(ttft=1.0, total=2.0, stall=1.0)}
    async with guard_for(fakes, records, tiers=tiers, continuation=ContinuationPolicy(min_time_left=0.01)) as guard:
        _learned(guard)
        async with guard.http_client() as client, client.stream("POST", A + CHAT, json=BODY) as response:
            with contextlib.suppress(httpx.TransportError):
                await response.aread()
    return [a.kind for a in records[0].attempts]


@BACKENDS
@pytest.mark.parametrize(("left", "sent"), [(0.25, False), (0.35, True)])
def test_retry_hedge_and_continuation_agree_on_whether_another_attempt_fits(
    backend: str, left: float, sent: bool
) -> None:
    """With a median TTFT of 0.3 s (and a p95 of 0.9 s), an attempt that would start 0.25 s before its
    first-token deadline is refused by all three, one 0.35 s before it is sent by all three: one
    `fits_deadline`, on the median."""
    decided: dict[str, list[str]] = {}

    async def main() -> None:
        decided["retry"] = await _decided_retry(left)
        decided["hedge"] = await _decided_hedge(left)
        decided["continuation"] = await _decided_continuation(left)

    run_virtual(main, backend)
    assert decided == {
        "retry": ["primary", "retry"] if sent else ["primary"],
        "hedge": ["primary", "hedge"] if sent else ["primary"],
        "continuation": ["primary", "continuation"] if sent else ["primary"],
    }


@BACKENDS
@pytest.mark.parametrize("learn", [False, True], ids=["unmeasured", "measured-shorter"])
@pytest.mark.parametrize(("left", "sent"), [(0.03, False), (0.08, True)])
def test_a_first_token_is_never_taken_to_be_instant(backend: str, left: float, sent: bool, learn: bool) -> None:
    """With no TTFT measured, or a median shorter than 50 ms (a server on this host), a retry or a hedge that would
    start 0.03 s before the 1 s ttft deadline is refused (it used to be sent and cancelled as it started), one
    0.08 s before it is sent."""
    decided: dict[str, list[str]] = {}

    async def main() -> None:
        decided["retry"] = await _decided_retry(left, learn=learn, median=0.005)
        decided["hedge"] = await _decided_hedge(left, learn=learn, median=0.005)

    run_virtual(main, backend)
    assert decided == {
        "retry": ["primary", "retry"] if sent else ["primary"],
        "hedge": ["primary", "hedge"] if sent else ["primary"],
    }


@BACKENDS
def test_a_retry_paced_late_into_a_long_ttft_is_sent_before_any_ttft_is_measured(backend: str) -> None:
    """A 60 s tier, nothing measured yet: a 429 with Retry-After: 55 is retried at 55 s and the call is served, as
    through the plain SDK (a reserve of a tenth of the tier's ttft refused it at once)."""
    fakes = {A: FakeReplica("a", [Plan(status=429, retry_after="55", headers_after=0.1), Plan()])}
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"interactive": Tier(ttft=60.0, total=900.0, stall=30.0)}
        async with guard_for(fakes, records, tiers=tiers) as guard, guard.http_client() as client:
            response = await client.post(A + CHAT, json=BODY)
            assert response.status_code == 200

    run_virtual(main, backend)
    (record,) = records
    assert [(a.kind, a.status_code) for a in record.attempts] == [("primary", 429), ("retry", 200)]


@BACKENDS
def test_a_retry_paced_to_start_just_before_the_ttft_deadline_is_not_sent_before_any_ttft_is_measured(
    backend: str,
) -> None:
    """One endpoint answering every call 429 with Retry-After: 1, 0.495 s after it is sent; tier ttft 3 s, no TTFT
    measured yet. The first retry goes at 1.495 s; the second would start at 2.99 s, 10 ms before the deadline, with
    no chance of a first token. It is not sent: the caller gets the server's 429 (openai's RateLimitError) at 1.99 s,
    where it used to get a ttft timeout at 3 s for an attempt cancelled as it started."""
    refused = Plan(status=429, retry_after="1", headers_after=0.495)
    fakes = {A: FakeReplica("a", [refused])}
    records: list[PhaseRecord] = []
    elapsed: list[float] = []

    async def main() -> None:
        tiers = {"interactive": Tier(ttft=3.0, total=20.0, stall=2.0)}
        async with guard_for(fakes, records, tiers=tiers) as guard:
            client = openai.AsyncOpenAI(
                base_url=A + "/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI)
            )
            start = now()
            with pytest.raises(openai.RateLimitError):
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            elapsed.append(now() - start)
            await client.close()

    run_virtual(main, backend)
    (record,) = records
    assert [(a.kind, a.status_code) for a in record.attempts] == [("primary", 429), ("retry", 429)]
    assert elapsed == [pytest.approx(1.99, abs=1e-6)]
    assert fakes[A].requests == 2
