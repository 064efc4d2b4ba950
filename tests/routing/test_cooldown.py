"""A server's Retry-After, weighed: capped, per replica, probed at growing intervals; a 429 carrying provider
limits feeds the rate limit too, and without a Retry-After only it. The real openai SDK against a real loopback
server for the single-replica case; the exact instants in virtual time on asyncio and trio."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import openai
import pytest

from llmguard_client import AllReplicasCooling, Guard, PhaseRecord, RateLimit, Replica, RetryPolicy, Tier, guard_failure
from llmguard_client._core.clock import loop_clock
from llmguard_client._routing.cooldown import REFUSALS_TO_COOL, mirror_cool_down
from tests.loopback import LoopbackServer, Script
from tests.virtual import BACKENDS, FakeReplica, Plan, now, run_virtual, virtual_guard

MESSAGES: Any = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
BODY: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream": True}


def in_turn(server: LoopbackServer, scripts: list[Script]) -> None:
    """The server answers its requests with ``scripts`` in turn (the last one repeats)."""
    count = [0]

    def script(index: int, attempt: int) -> Script:
        count[0] += 1
        return scripts[min(count[0], len(scripts)) - 1]

    server.scripter = script


async def test_one_replica_after_a_retry_after_120_a_500_is_not_relabelled_and_the_call_succeeds(
    servers: list[LoopbackServer],
) -> None:
    """The case of a hosted endpoint: a 429 with ``Retry-After: 120``, then the server answers a 500 and
    recovers. The cool-down is cut to ``max_retry_after``; a call made before its probe is refused before it is
    sent, with the server's seconds left (it asked for more than the guard waits); the next call is sent (the
    probe), its 500 is retried like the plain SDK does, and it succeeds."""
    server = servers[0]
    in_turn(server, [Script(status=429, headers={"retry-after": "120"}), Script(status=500), Script()])
    records: list[PhaseRecord] = []
    policy = RetryPolicy(max_retry_after=5.0)  # its probe at 2.5 s: beyond a 1.2 s first-token deadline
    async with Guard(
        [server.url], tiers={"t": Tier(ttft=1.2, total=10.0)}, retry=policy, hedge=None, on_record=records.append
    ) as guard:
        client = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI)
        )
        with pytest.raises(openai.RateLimitError) as first:
            await client.chat.completions.create(model="m", messages=MESSAGES)
        assert first.value.response.headers["retry-after"] == "120"  # the server's own answer, handed back
        assert len(server.received) == 1

        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(model="m", messages=MESSAGES)
        assert guard_failure(refused.value) == "all_replicas_cooling"
        assert 5000 < float(refused.value.response.headers["retry-after-ms"]) <= 120_000  # the server's, not the cap
        assert len(server.received) == 1  # refused before it was sent
        assert guard.snapshot().replicas[0].cooling_for <= 5.0

        await anyio.sleep(2.6)  # past the first probe (a second in): this call finds the server again
        done = await client.chat.completions.create(model="m", messages=MESSAGES)
        assert done.choices[0].message.content
    assert len(server.received) == 3  # the 429, the 500 and the answer: nothing refused after the 500
    assert [a.status_code for a in records[-1].attempts] == [500, 200]
    assert records[-1].status == "ok"


@BACKENDS
def test_a_retry_after_cools_the_replica_and_a_call_that_fits_waits_for_its_first_probe(backend: str) -> None:
    """One replica, ``Retry-After: 120`` (the default cap, the openai SDK's): a call whose deadline fits waits
    for the cool-down's first probe, a second in, and succeeds there; one whose deadline does not fit is refused
    at once, with the cool-down's time left as its retry-after; after a winning probe every call goes at once. The
    cool-down starts at the `REFUSALS_TO_COOL`-th refusal in a row (one among calls served holds back no other)."""
    fake = FakeReplica("a", [*[Plan(status=429, retry_after="120")] * REFUSALS_TO_COOL, Plan()])
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {
            "short": Tier(ttft=0.8, total=60.0),
            "mid": Tier(ttft=1.8, total=60.0),  # 1 s of it would fit, but no TTFT is known: at most half
            "long": Tier(ttft=5.0, total=60.0),
        }
        guard = virtual_guard({"http://a.test": fake}, records, tiers=tiers, hedge=None, failure_mode="raise")
        async with guard, guard.http_client() as client:
            started = anyio.current_time()
            for n in range(REFUSALS_TO_COOL):
                first = await client.post("http://a.test" + CHAT, json=BODY, headers={"x-llmguard-tier": "short"})
                assert first.status_code == 429 and first.headers["retry-after"] == "120"  # the server's answer
                assert fake.requests == n + 1  # its own retry could not wait for the Retry-After within 0.8 s
            assert guard.snapshot().replicas[0].cooling_for == pytest.approx(120.0)
            with pytest.raises(AllReplicasCooling) as refused:
                await client.post("http://a.test" + CHAT, json=BODY, headers={"x-llmguard-tier": "short"})
            assert refused.value.retry_after == pytest.approx(120.0)
            cooled = REFUSALS_TO_COOL
            assert fake.requests == cooled and anyio.current_time() == started  # refused at once, before sending
            with pytest.raises(AllReplicasCooling):
                await client.post("http://a.test" + CHAT, json=BODY, headers={"x-llmguard-tier": "mid"})
            assert fake.requests == cooled and anyio.current_time() == started
            response = await client.post("http://a.test" + CHAT, json=BODY, headers={"x-llmguard-tier": "long"})
            assert response.status_code == 200
            assert anyio.current_time() - started == pytest.approx(1.0, abs=0.01)  # the first probe
            assert guard.snapshot().replicas[0].cooling_for == 0.0  # the probe won: the cool-down is over
            second = await client.post("http://a.test" + CHAT, json=BODY, headers={"x-llmguard-tier": "short"})
            assert second.status_code == 200 and fake.requests == cooled + 2

    run_virtual(main, backend)


@BACKENDS
def test_a_call_waits_for_a_cooling_endpoints_probe_no_longer_than_its_clients_pool_timeout(backend: str) -> None:
    """One replica cooling for a Retry-After of 120 s, the default tier (no first-token deadline): a call whose
    client allows a request 0.5 s of waiting before it is sent (``pool=0.5``) is refused at once, with the
    cool-down's time left (it waited 1 s for the first probe, past its caller's timeout); one whose client sets no
    pool timeout waits for the probe. The cool-down starts at the `REFUSALS_TO_COOL`-th refusal in a row."""
    fake = FakeReplica("a", [*[Plan(status=429, retry_after="120")] * REFUSALS_TO_COOL, Plan()])
    records: list[PhaseRecord] = []

    async def main() -> None:
        guard = virtual_guard({"http://a.test": fake}, records, tiers=None, hedge=None, failure_mode="raise")
        async with guard, guard.http_client(timeout=httpx.Timeout(600.0, pool=0.5)) as client:
            for _ in range(REFUSALS_TO_COOL):
                one = {"x-llmguard-max-attempts": "1"}
                assert (await client.post("http://a.test" + CHAT, json=BODY, headers=one)).status_code == 429
            started = anyio.current_time()
            with pytest.raises(AllReplicasCooling) as refused:
                await client.post("http://a.test" + CHAT, json=BODY)
            assert anyio.current_time() == started and fake.requests == REFUSALS_TO_COOL  # refused at once
            assert refused.value.retry_after == pytest.approx(120.0) and "pool timeout (0.5s)" in str(refused.value)
            unbounded = await client.post("http://a.test" + CHAT, json=BODY, timeout=httpx.Timeout(600.0, pool=None))
            assert unbounded.status_code == 200
            assert anyio.current_time() - started == pytest.approx(1.0, abs=0.01)  # the first probe

    run_virtual(main, backend)


@BACKENDS
def test_a_probe_answered_with_a_500_ends_the_cool_down_and_is_retried(backend: str) -> None:
    """The probe meets a 500: the server no longer asks for rest, so the call is retried after its backoff,
    as without a cool-down, instead of coming back as ``all_replicas_cooling``."""
    fake = FakeReplica("a", [Plan(status=429, retry_after="60"), Plan(status=500), Plan()])
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"t": Tier(ttft=5.0, total=60.0)}
        guard = virtual_guard({"http://a.test": fake}, records, tiers=tiers, hedge=None, failure_mode="raise")
        async with guard, guard.http_client() as client:
            assert (await client.post("http://a.test" + CHAT, json=BODY)).status_code == 429
            await anyio.sleep(30.0)
            response = await client.post("http://a.test" + CHAT, json=BODY)
            assert response.status_code == 200

    run_virtual(main, backend)
    assert [a.status_code for a in records[-1].attempts] == [500, 200]


async def test_another_calls_cool_down_does_not_relabel_a_500(servers: list[LoopbackServer]) -> None:
    """Two replicas; one call's 429s cool both for 30 s. The next call is sent (every replica cooling: spread by
    load) and meets a 500 it cannot retry within its deadline: it gets its own 500; the cool-down is only the
    cause named for not retrying it."""
    for server in servers[:2]:
        server.script = Script(status=429, headers={"retry-after": "30"})
    records: list[PhaseRecord] = []
    async with Guard(
        [s.url for s in servers[:2]], tiers={"t": Tier(ttft=2.0, total=10.0)}, hedge=None, on_record=records.append
    ) as guard:
        client = openai.AsyncOpenAI(
            base_url=servers[0].url + "/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI)
        )
        with pytest.raises(openai.RateLimitError):  # both replicas now cool for 30 s
            await client.chat.completions.create(model="m", messages=MESSAGES)
        for server in servers[:2]:
            server.script = Script(status=500)
        with pytest.raises(openai.InternalServerError) as caught:  # every replica cooling: spread by load
            await client.chat.completions.create(model="m", messages=MESSAGES)
    assert caught.value.status_code == 500 and caught.value.message == "Error code: 500 - scripted"
    assert records[-1].attempts[0].status_code == 500


async def test_a_429_with_provider_limits_and_a_retry_after_cools_the_replica_and_lowers_the_bucket(
    servers: list[LoopbackServer],
) -> None:
    """With a `RateLimit` configured, a 429 carrying ``x-ratelimit-*`` and a Retry-After both lowers the bucket to
    the room the provider reports and cools the replica for the Retry-After: 20 s do not fit a 2 s ttft, so the
    call gets the server's 429 at once, as it would without the `RateLimit`."""
    server = servers[0]
    limited = {"retry-after": "20", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1s"}
    in_turn(server, [Script(status=429, headers=limited), Script()])
    replica = Replica(server.url, rate_limit=RateLimit(requests_per_minute=600, burst=1.0))
    async with Guard([replica], tiers={"t": Tier(ttft=2.0, total=10.0)}, hedge=None) as guard:
        client = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI)
        )
        with pytest.raises(openai.RateLimitError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES)
        assert caught.value.response.headers["retry-after"] == "20"
        assert 15.0 < guard.snapshot().replicas[0].cooling_for <= 20.0
        assert guard.rate_limiter is not None
        assert guard.rate_limiter.bucket(server.url).levels()[0] < 1.0  # lowered to the 0 reported, refilling
    assert len(server.received) == 1


AZURE_429 = {
    "retry-after": "4",
    "retry-after-ms": "4000",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-remaining-tokens": "0",
}
OPENAI_429 = {
    "retry-after": "4",
    "x-ratelimit-limit-requests": "600",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "4s",
}


@BACKENDS
@pytest.mark.parametrize("headers", [AZURE_429, OPENAI_429], ids=["azure", "openai"])
def test_a_429_with_provider_limits_is_retried_when_its_retry_after_ends(backend: str, headers: dict[str, str]) -> None:
    """Azure's and OpenAI's usual 429 (a Retry-After of 4 s and ``x-ratelimit-*`` headers) under a `RateLimit`:
    the retry goes when the Retry-After ends, as the plain SDK's does, not when the bucket has refilled a
    request (0.1 s at 600 a minute), which the server would answer with another 429."""
    fake = FakeReplica("a", [Plan(status=429, headers=headers), Plan()])
    records: list[PhaseRecord] = []

    async def main() -> None:
        guard = virtual_guard(
            {"http://a.test": fake},
            records,
            rate_limit=RateLimit(requests_per_minute=600, tokens_per_minute=100_000),
            tiers={"t": Tier(ttft=10.0, total=20.0)},
            hedge=None,
        )
        async with guard, guard.http_client() as client:
            response = await client.post("http://a.test" + CHAT, json=BODY)
            assert response.status_code == 200

    run_virtual(main, backend)
    first, retry = records[0].attempts
    assert first.status_code == 429 and first.finish is not None
    assert retry.start - first.finish == pytest.approx(
        4.0, abs=0.01
    )  # when the wait ends, as calls refused together are
    assert fake.requests == 2


@BACKENDS
def test_a_429_with_provider_limits_and_no_retry_after_waits_for_the_rate_limits_share(backend: str) -> None:
    """The 429 says no request is left (``x-ratelimit-remaining-requests: 0``) and sends no Retry-After: the
    bucket takes that room, so the retry goes when it refills one request (1 s at 60 a minute), and the
    replica is not cooled down."""
    limited = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1s"}
    fake = FakeReplica("a", [Plan(status=429, headers=limited), Plan()])
    records: list[PhaseRecord] = []

    async def main() -> None:
        replica = Replica("http://a.test", rate_limit=RateLimit(requests_per_minute=60, burst=1.0))
        guard = Guard(
            [replica],
            tiers={"t": Tier(ttft=5.0, total=10.0)},
            hedge=None,
            instrumentation=None,
            on_record=records.append,
            transport_factory=lambda r: fake,
        )
        async with guard, guard.http_client() as client:
            response = await client.post("http://a.test" + CHAT, json=BODY)
            assert response.status_code == 200
            assert guard.snapshot().replicas[0].cooling_for == 0.0

    run_virtual(main, backend)
    first, retry = records[0].attempts
    assert first.status_code == 429 and first.finish is not None
    assert retry.start - first.finish == pytest.approx(1.0, abs=0.01)


@BACKENDS
def test_a_retry_after_longer_than_the_guard_waits_is_handed_back_at_once_and_final(backend: str) -> None:
    """A daily quota's 429 (``Retry-After: 86400``) on the only replica: the call gets it at once, one request,
    marked final so the SDK does not retry either (as the openai SDK, which retries no Retry-After over 120 s),
    not after 2 minutes of capped waits. Later calls are refused before they are sent, with the server's seconds
    left, until the capped cool-down's probe, which goes to the server."""
    fake = FakeReplica("a", [Plan(status=429, retry_after="86400")])
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"t": Tier(ttft=600.0, total=900.0)}
        async with virtual_guard({"http://a.test": fake}, records, tiers=tiers, hedge=None) as guard:
            async with guard.http_client() as client:
                start = now()
                first = await client.post("http://a.test" + CHAT, json=BODY, headers={"x-stainless-lang": "python"})
                assert now() == start
                assert first.status_code == 429 and first.headers["retry-after"] == "86400"
                assert first.headers["x-should-retry"] == "false"
                assert fake.requests == 1
                with pytest.raises(AllReplicasCooling) as refused:
                    await client.post("http://a.test" + CHAT, json=BODY)
                assert now() == start and fake.requests == 1  # not sent, not waited for the probe
                assert refused.value.retry_after > RetryPolicy().max_retry_after  # the server's ask (read up to 300 s)
                await anyio.sleep(RetryPolicy().max_retry_after / 2)  # the probe is due
                probe = await client.post("http://a.test" + CHAT, json=BODY, headers={"x-stainless-lang": "python"})
                assert probe.status_code == 429 and fake.requests == 2

    run_virtual(main, backend)
    assert len(records[0].attempts) == 1


@BACKENDS
def test_a_retry_after_longer_than_the_guard_waits_sends_the_retry_to_another_replica(backend: str) -> None:
    """One replica of two says "come back tomorrow": the call is retried on the other at once and served."""
    fakes = {
        "http://a.test": FakeReplica("a", [Plan(status=429, retry_after="86400")]),
        "http://b.test": FakeReplica("b"),
    }
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"t": Tier(ttft=600.0, total=900.0)}
        async with virtual_guard(fakes, records, tiers=tiers, hedge=None) as guard, guard.http_client() as client:
            start = now()
            assert (await client.post("http://a.test" + CHAT, json=BODY)).status_code == 200
            assert now() == start

    run_virtual(main, backend)
    assert [a.replica for a in records[0].attempts] == ["http://a.test", "http://b.test"]


@BACKENDS
def test_a_retry_after_of_90_s_is_waited_for_whole_as_the_openai_sdk_does(backend: str) -> None:
    """The openai SDK honours a Retry-After of up to 120 s: so does the guard (`RetryPolicy.max_retry_after`), so a
    call the plain SDK serves after 90 s is served after 90 s, not retried into the server's refusal at 60 s."""
    fake = FakeReplica("a", [Plan(status=429, retry_after="90"), Plan()])
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"t": Tier(ttft=600.0, total=900.0)}
        async with virtual_guard({"http://a.test": fake}, records, tiers=tiers, hedge=None) as guard:
            async with guard.http_client() as client:
                assert (await client.post("http://a.test" + CHAT, json=BODY)).status_code == 200

    run_virtual(main, backend)
    first, retry = records[0].attempts
    assert first.finish is not None and retry.start - first.finish == pytest.approx(90.0, abs=0.01)


def test_the_sync_sdk_is_refused_before_sending_while_the_only_replica_cools(servers: list[LoopbackServer]) -> None:
    """``openai.OpenAI`` through the guard: after a 429 + ``Retry-After: 120`` (over a 5 s cap), a call made
    before the probe is refused at once, nothing sent, with the server's seconds left as its retry-after."""
    server = servers[0]
    in_turn(server, [Script(status=429, headers={"retry-after": "120"}), Script()])
    with Guard([server.url], tiers={"t": Tier(ttft=1.2, total=10.0)}, retry=RetryPolicy(max_retry_after=5.0)) as guard:
        client = openai.OpenAI(
            base_url=server.url + "/v1", api_key="k", http_client=guard.http_client_for(openai.OpenAI)
        )
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model="m", messages=MESSAGES)
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(model="m", messages=MESSAGES)
    assert guard_failure(refused.value) == "all_replicas_cooling"
    assert 5000 < float(refused.value.response.headers["retry-after-ms"]) <= 120_000  # the server's seconds left
    assert len(server.received) == 1


@BACKENDS
@pytest.mark.parametrize("status", [429, 503])
def test_with_one_replica_the_calls_waiting_go_at_the_first_probe_and_the_rest_once_it_is_served(
    backend: str, status: int
) -> None:
    """One replica answers `REFUSALS_TO_COOL` calls in a row ``Retry-After: 4`` (the third cools it); three calls
    start 0.2 s later. The first calls' retries wait for the whole Retry-After (the server paces them) without
    taking the cool-down's probe: one new call is the first probe at 1 s, and once it is served (its first token at
    1.5 s) the cool-down is over and the two others go at once, not at 4 s."""
    refusals = [Plan(status=status, retry_after="4")] * REFUSALS_TO_COOL
    fake = FakeReplica("a", [*refusals, Plan(first_token_after=0.5)])
    records: list[PhaseRecord] = []

    async def main() -> None:
        guard = virtual_guard({"http://a.test": fake}, records, hedge=None, failure_mode="raise")
        async with guard, guard.http_client() as client:

            async def call() -> None:
                assert (await client.post("http://a.test" + CHAT, json=BODY)).status_code == 200

            start = now()
            async with anyio.create_task_group() as tg:
                for _ in range(REFUSALS_TO_COOL):
                    tg.start_soon(call)
                await anyio.sleep(0.2)
                for _ in range(3):
                    tg.start_soon(call)
            assert guard.snapshot().replicas[0].cooling_for == 0.0

        sent = sorted(round(a.start - start, 3) for r in records for a in r.attempts)
        cooled = REFUSALS_TO_COOL
        assert sent[: cooled + 3] == [0.0] * cooled + [1.0, 1.5, 1.5]  # the refusals, the probe, the two others
        for retry in sent[cooled + 3 :]:  # the first calls' retries: when their Retry-After ends
            assert retry == pytest.approx(4.0, abs=1e-3)
        firsts = [r for r in records if len(r.attempts) == 2]
        assert [[a.status_code for a in r.attempts] for r in firsts] == [[status, 200]] * cooled

    run_virtual(main, backend)


@BACKENDS
def test_a_probe_refused_again_keeps_the_calls_waiting_that_fit_and_refuses_the_others_then(backend: str) -> None:
    """A ``Retry-After: 2``; its probe at 1 s is answered ``Retry-After: 8`` at 1.5 s: the cool-down now ends at
    9.5 s, its next probe 2 s later, at 3.5 s (the retries go when their Retry-After ends). Of the calls waiting
    since 1.2 s (for the end at 2 s), one whose deadline does not fit the wait for that probe is refused then, before
    it is sent; one whose deadline fits keeps waiting and is that probe."""
    refusals = [Plan(status=429, retry_after="2")] * REFUSALS_TO_COOL  # the third in a row cools the replica
    fake = FakeReplica("a", [*refusals, Plan(status=429, retry_after="8", headers_after=0.5), Plan()])
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"long": Tier(ttft=600.0, total=900.0), "short": Tier(ttft=2.5, total=60.0)}
        guard = virtual_guard({"http://a.test": fake}, records, tiers=tiers, hedge=None, failure_mode="raise")
        async with guard, guard.http_client() as client:
            refused: list[tuple[float, AllReplicasCooling]] = []

            async def call(tier: str = "long") -> None:
                try:
                    response = await client.post("http://a.test" + CHAT, json=BODY, headers={"x-llmguard-tier": tier})
                except AllReplicasCooling as error:
                    refused.append((now() - start, error))
                else:
                    assert response.status_code == 200

            start = now()
            async with anyio.create_task_group() as tg:
                for _ in range(REFUSALS_TO_COOL):  # the 429s at 0 s; their retries at 2 s, when the wait ends
                    tg.start_soon(call)
                await anyio.sleep(0.2)
                tg.start_soon(call)  # the probe at 1 s, refused at 1.5 s; its retry at 9.5 s
                await anyio.sleep(1.0)
                tg.start_soon(call, "short")  # fits a wait to 2 s (its deadline is 3.7 s), not one to 3.5 s
                tg.start_soon(call)
            assert fake.requests == 2 * REFUSALS_TO_COOL + 3

        assert [(at, error.retry_after) for at, error in refused] == [(pytest.approx(1.5), pytest.approx(8.0))]
        sent = sorted(round(a.start - start, 3) for r in records for a in r.attempts)
        cooled = REFUSALS_TO_COOL
        assert sent[: cooled + 1] == [0.0] * cooled + [1.0]  # the 429s, the refused probe
        assert sent[2 * cooled + 1] == 3.5  # the next probe
        for retry in sent[cooled + 1 : 2 * cooled + 1]:  # the first calls' retries: when their Retry-After ends
            assert retry == pytest.approx(2.0, abs=1e-3)
        assert sent[-1] - 1.5 == pytest.approx(8.0, abs=1e-3)  # the refused probe's retry, paced by its Retry-After

    run_virtual(main, backend)


@BACKENDS
def test_a_probe_whose_caller_cancels_it_hands_the_probe_to_the_next_call_waiting(backend: str) -> None:
    """The probe at 1 s hangs before its first token and its caller gives up at 1.3 s. Nothing answered it, so
    the cool-down still has no word from the server: the probe is due again, and of the two calls waiting since
    1.1 s one goes as the new probe at once; once that is served (at 1.8 s) the other goes, not at 4 s."""
    refusals = [Plan(status=429, retry_after="4")] * REFUSALS_TO_COOL  # the third in a row cools the replica
    fake = FakeReplica("a", [*refusals, Plan(first_token_after=30.0), Plan(first_token_after=0.5), Plan()])
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"long": Tier(ttft=600.0, total=900.0)}
        guard = virtual_guard({"http://a.test": fake}, records, tiers=tiers, hedge=None, failure_mode="raise")
        async with guard, guard.http_client() as client:

            async def call() -> None:
                assert (await client.post("http://a.test" + CHAT, json=BODY)).status_code == 200

            async def given_up() -> None:
                with anyio.move_on_after(1.1):  # it waits for the probe at 1 s, then hangs there
                    await call()

            start = now()
            async with anyio.create_task_group() as tg:
                for _ in range(REFUSALS_TO_COOL):  # the 429s at 0 s; their retries at 4 s, when the wait ends
                    tg.start_soon(call)
                await anyio.sleep(0.2)
                tg.start_soon(given_up)
                await anyio.sleep(0.9)
                tg.start_soon(call)
                tg.start_soon(call)
            assert guard.snapshot().replicas[0].cooling_for == 0.0

        sent = sorted(round(a.start - start, 3) for r in records for a in r.attempts)
        cooled = REFUSALS_TO_COOL
        # the 429s, the probe given up, the next probe, the other
        assert sent[: cooled + 3] == [0.0] * cooled + [1.0, 1.3, 1.8]
        for retry in sent[cooled + 3 :]:  # the first calls' retries: when their Retry-After ends
            assert retry == pytest.approx(4.0, abs=1e-3)

    run_virtual(main, backend)


@dataclass
class DownUntil(FakeReplica):
    """A replica answering ``status`` with ``Retry-After: 120`` until ``healthy_at`` (virtual time; forever by
    default), then serving; ``sent`` holds when each request came."""

    status: int = 503
    healthy_at: float = math.inf
    sent: list[float] = field(default_factory=list)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(now())
        if now() < self.healthy_at:
            self.requests += 1
            return httpx.Response(self.status, headers={"retry-after": "120"}, json={"error": {"message": "down"}})
        return await super().handle_async_request(request)


ONCE = {"x-llmguard-max-attempts": "1"}
"""The server's answer handed back as it is (no retry paced by its Retry-After)."""

FIRSTS = [(f"first{n}", 0.0, "default") for n in range(REFUSALS_TO_COOL)]
"""Calls refused together at 0 s, the last of them the refusal in a row that cools the replica."""


def timeline(backend: str, fake: DownUntil, healthy_at: float, calls: list[tuple[str, float, str]]) -> dict[str, float]:
    """Each of ``calls`` (name, when, tier) sent once (no retry) through one Guard over ``fake``, healthy from
    ``healthy_at`` (s): when each was served (its first token), or minus its status; ``fake.sent`` is made
    relative to the start."""
    served: dict[str, float] = {}
    start = 0.0

    async def main() -> None:
        nonlocal start
        start = now()
        fake.healthy_at = start + healthy_at
        tiers = {"default": Tier(ttft=math.inf, total=math.inf, stall=None), "interactive": Tier(ttft=2.0, total=10.0)}
        guard = virtual_guard({"http://a.test": fake}, [], tiers=tiers, hedge=None, failure_mode="raise")
        async with guard, guard.http_client(timeout=httpx.Timeout(600.0, pool=None)) as client:

            async def call(name: str, at: float, tier: str) -> None:
                await anyio.sleep(at - (now() - start))
                response = await client.post(
                    "http://a.test" + CHAT, json=BODY, headers={**ONCE, "x-llmguard-tier": tier}
                )
                served[name] = now() - start if response.status_code == 200 else -response.status_code

            async with anyio.create_task_group() as tg:
                for name, at, tier in calls:
                    tg.start_soon(call, name, at, tier)

    run_virtual(main, backend)
    fake.sent = [round(t - start, 3) for t in fake.sent]
    return served


@BACKENDS
@pytest.mark.parametrize("status", [429, 503])
def test_a_short_outage_behind_a_retry_after_of_120_s_is_found_over_within_seconds(backend: str, status: int) -> None:
    """One replica answers ``Retry-After: 120`` for 2 s, then serves. The cool-down's first probe goes a second in
    (refused), the next 2 s later, at 3 s (served): a call waiting since 2.5 s goes then, and a call of a tier with
    a 2 s first-token deadline arriving at 3.2 s is served at once, where a probe half-way (at 60 s) had it
    refused and the other wait a minute. The server saw one request per probe meanwhile."""
    fake = DownUntil("a", status=status)
    calls = [*FIRSTS, ("waiting", 0.5, "default"), ("recovered", 2.5, "default")]
    served = timeline(backend, fake, 2.0, [*calls, ("interactive", 3.2, "interactive")])
    # the first answers, the probes at 1 s (refused) and 3 s, the last
    assert fake.sent == [0.0] * len(FIRSTS) + [1.0, 3.0, 3.2]
    assert served == {
        **{name: -status for name, _, _ in FIRSTS},
        "waiting": -status,
        "recovered": pytest.approx(3.0),  # the second probe, served
        "interactive": pytest.approx(3.2),  # at once
    }


@BACKENDS
def test_a_server_that_keeps_refusing_sees_probes_at_doubling_intervals_six_in_120_s(backend: str) -> None:
    """One replica answers every request ``503, Retry-After: 120`` while a call comes every 0.5 s, each waiting
    for the cool-down's probe: each probe refused renews the cool-down and doubles the wait for the next (1, 2,
    4, 8, 16, 32 s, then half of the renewed cool-down, 60 s), so over 120 s the server sees the first answer and 6
    probes (a bound of about log2(60)), where every call would have gone with the SDK's retries."""
    start = 0.0
    fake = DownUntil("a")
    records: list[PhaseRecord] = []

    async def main() -> None:
        nonlocal start
        start = now()
        guard = virtual_guard({"http://a.test": fake}, records, hedge=None, failure_mode="raise")
        async with guard, guard.http_client(timeout=httpx.Timeout(600.0, pool=None)) as client:

            async def call() -> None:
                await client.post("http://a.test" + CHAT, json=BODY, headers=ONCE)

            async with anyio.create_task_group() as tg:
                for _ in range(REFUSALS_TO_COOL):  # refused in a row: the third cools the replica
                    tg.start_soon(call)
                while now() - start < 120.0:
                    await anyio.sleep(0.5)
                    tg.start_soon(call)
                tg.cancel_scope.cancel()

    run_virtual(main, backend)
    first = [0.0] * REFUSALS_TO_COOL
    assert [round(t - start, 3) for t in fake.sent] == [*first, 1.0, 3.0, 7.0, 15.0, 31.0, 63.0]


@BACKENDS
def test_a_call_arriving_while_the_probe_is_in_flight_waits_for_its_answer(backend: str) -> None:
    """One replica answers ``Retry-After: 120`` until 0.5 s, then serves, its first token 0.3 s after a request.
    The cool-down's first probe goes at 1 s; a call of a tier with a 2 s first-token deadline arriving at 1.1 s,
    while that probe is in flight, waits for its answer (1.3 s) and goes then. It used to be refused at once: with
    the probe taken, its next chance was counted as the cool-down's end, two minutes on."""
    fake = DownUntil("a", [Plan(first_token_after=0.3)])
    calls = [*FIRSTS, ("probe", 0.5, "default"), ("interactive", 1.1, "interactive")]
    served = timeline(backend, fake, 0.5, calls)  # "probe" waits for the first probe, at 1 s, and is it
    assert fake.sent == [0.0] * len(FIRSTS) + [1.0, 1.3]
    firsts = {name: -503 for name, _, _ in FIRSTS}
    assert served == {**firsts, "probe": pytest.approx(1.3), "interactive": pytest.approx(1.6)}


@dataclass
class Mirrored:
    """The cool-down fields of a replica, as `mirror_cool_down` reads and writes them."""

    cooling_until: float = 0.0
    probe_at: float = math.inf
    probing: bool = False
    probes: int = 0
    probes_refused: int = 0

    def cooling(self, now: float) -> bool:
        return now < self.cooling_until


def test_a_mirrored_cool_down_is_probed_a_step_after_the_learning_process_would_probe() -> None:
    """Another process learned a 30 s cool-down at 0 (its probes: 1 s in, then 2, 4 ... s after each refused one).
    Here the probe is due at 2 s; each renewal that process's refused probe publishes (at 1 s, then 3 s) puts this
    one's back a step further (4 s, then 8 s later), never beyond half-way; a new cool-down starts over."""
    s = Mirrored()
    mirror_cool_down(s, 0.0, 30.0)
    assert s.probe_at == 2.0
    mirror_cool_down(s, 1.0, 31.0)
    assert s.probe_at == 5.0
    mirror_cool_down(s, 3.0, 33.0)
    assert s.probe_at == 11.0
    mirror_cool_down(s, 11.5, 16.0)  # a renewal ending sooner than a step: half-way through what is left
    assert s.probe_at == pytest.approx(13.75)
    mirror_cool_down(s, 100.0, 130.0)  # long after it ended: a new cool-down
    assert s.probe_at == 102.0


@BACKENDS
def test_a_clock_that_went_back_leaves_a_cool_down_no_longer_than_it_was_set_for(backend: str) -> None:
    # The caller's clock jumps back (a test's frozen clock let go): a cool-down must not last until the clock is
    # back (1e9 s), only what was left of it, with its probe; nor may an instant never set (0.0) become a wait.
    # A snapshot read on a clock behind the loop's (from sync code, beside a loop a test froze ahead) reads the
    # cool-down as what is left of it and leaves it as it was for the loop (it used to move it back).
    fake = FakeReplica("a", [Plan()])
    shift = [0.0]
    guard = virtual_guard({"http://a.test": fake}, [], clock=lambda: loop_clock() + shift[0])

    async def main() -> None:
        async with httpx.AsyncClient(transport=guard.transport, base_url="http://a.test") as client:
            assert (await client.post(CHAT, json=BODY)).status_code == 200
            guard._replica_set.cool_down(guard._replica_set.states[0], guard._clock(), 20.0)
            shift[0] -= 1e9
            assert guard.snapshot().replicas[0].cooling_for == pytest.approx(20.0)
            shift[0] += 1e9
            view = guard.snapshot().replicas[0]
            assert view.cooling_for == pytest.approx(20.0) and not view.healthy
            shift[0] -= 1e9
            assert 0.0 < guard.snapshot().replicas[0].cooling_for <= 20.0
            assert (await client.post(CHAT, json=BODY)).status_code == 200  # its probe, as before the jump
            assert fake.requests == 2

    run_virtual(main, backend)
