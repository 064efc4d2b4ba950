"""RateLimitLayer through a Guard in virtual time: attempts charged before they are sent, refused with a computed
retry-after, waiting for their share, corrected from usage, recalibrated from x-ratelimit-* headers."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import anyio
import httpx
import pytest

from llmguard_client import Guard, HedgePolicy, PhaseRecord, RateLimit, RateLimited, RetryPolicy, Tier, guard_failure
from llmguard_client._ratelimit.layer import DEFAULT_OUTPUT_ESTIMATE
from llmguard_client._ratelimit.prompt_estimate import IMAGE_TOKENS, LOW_DETAIL_IMAGE_TOKENS
from tests.virtual import BACKENDS, FakeReplica, Plan, now, run_virtual, virtual_guard

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 20}).encode()
CHARGE = math.ceil(len(BODY) / 4) + 20
"""What one attempt of BODY is charged: its bytes / 4, plus its max_tokens."""
USED = 4
"""What FakeReplica's non-streaming answer reports in its usage (3 prompt + 1 completion)."""


async def post(
    client: httpx.AsyncClient, body: bytes = BODY, tier: str = "t", path: str = "/v1/chat/completions"
) -> httpx.Response:
    headers = {"content-type": "application/json", "x-llmguard-tier": tier}
    return await client.post(f"http://a{path}", content=body, headers=headers)


def limited_guard(
    fakes: dict[str, FakeReplica], records: list[PhaseRecord], limit: RateLimit, **kwargs: object
) -> Guard:
    kwargs.setdefault("tiers", {"t": Tier(ttft=0.5, total=5.0)})
    kwargs.setdefault("failure_mode", "raise")
    return virtual_guard(fakes, records, rate_limit=limit, **kwargs)


def one_call_bucket(headers_after: float, ttft: float) -> tuple[dict[str, FakeReplica], list[PhaseRecord], Guard]:
    """A replica answering after ``headers_after`` s; a bucket holding one call's tokens, refilled in 1 s; tiers
    ``t`` (``ttft``) and ``slow`` (3 s)."""
    fakes = {"http://a": FakeReplica("a", [Plan(headers_after=headers_after)])}
    records: list[PhaseRecord] = []
    limit = RateLimit(tokens_per_minute=60 * CHARGE, burst=1.0)
    tiers = {"t": Tier(ttft=ttft, total=5.0), "slow": Tier(ttft=3.0, total=5.0)}
    return fakes, records, limited_guard(fakes, records, limit, tiers=tiers)


async def refused_at_once(client: httpx.AsyncClient, after: float) -> RateLimited:
    """A first call (tier ``slow``) takes the bucket; the call made ``after`` s later is refused at once."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(post, client, BODY, "slow")
        await anyio.sleep(after)
        start = now()
        with pytest.raises(RateLimited) as refused:
            await post(client)
        assert now() == start  # never sent, never waited
    return refused.value


@BACKENDS
def test_a_call_that_does_not_fit_in_its_ttft_is_refused_with_the_computed_retry_after(backend: str) -> None:
    # The bucket holds one call's tokens and refills one call's tokens per second. The first call holds its
    # charge until it ends (1 s); the second, 0.1 s in, misses 0.9 of a call's tokens: 0.9 s, more than its
    # ttft (0.5 s) allows, so it is refused at once, never sent.
    async def main() -> None:
        fakes, records, guard = one_call_bucket(headers_after=1.0, ttft=0.5)
        async with guard, guard.http_client() as client:
            refused = await refused_at_once(client, after=0.1)
        assert refused.retry_after == pytest.approx(0.9, abs=1e-9)
        assert guard_failure(refused) == "rate_limited"
        assert refused.status_code == 429
        assert fakes["http://a"].requests == 1
        refused_record = next(r for r in records if r.cause == "rate_limited")
        assert refused_record.attempts == () and refused_record.status == "rejected"

    run_virtual(main, backend)


@BACKENDS
def test_a_call_that_fits_in_its_ttft_waits_for_its_share_then_is_sent(backend: str) -> None:
    async def main() -> None:
        _, records, guard = one_call_bucket(headers_after=1.0, ttft=3.0)
        async with guard, guard.http_client() as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(post, client)
                await anyio.sleep(0.1)
                response = await post(client)
                assert response.status_code == 200
        waited = records[-1]
        assert waited.attempts[0].start - waited.start == pytest.approx(0.9, abs=1e-9)

    run_virtual(main, backend)


@BACKENDS
@pytest.mark.parametrize("pool", [0.5, None])
def test_in_a_tier_without_a_deadline_a_wait_for_room_is_bounded_by_the_clients_pool_timeout(
    backend: str, pool: float | None
) -> None:
    """The default tier has no first-token deadline: a call that must wait 0.9 s for room waits no longer than its
    client's pool timeout (how long httpx lets a request wait for a free connection): with 0.5 s it is refused at
    once, with none it waits its 0.9 s (it used to wait, nothing sent, for whatever the bucket needed: hours for a
    large max_tokens under a small limit, past the caller's own timeout)."""

    async def main() -> None:
        fakes = {"http://a": FakeReplica("a", [Plan(headers_after=1.0)])}
        records: list[PhaseRecord] = []
        limit = RateLimit(tokens_per_minute=60 * CHARGE, burst=1.0)
        guard = limited_guard(fakes, records, limit, tiers=None)
        timeout = httpx.Timeout(600.0, pool=pool)
        async with guard, guard.http_client(timeout=timeout) as client, anyio.create_task_group() as tg:
            tg.start_soon(post, client, BODY, "default")
            await anyio.sleep(0.1)
            start = now()
            if pool is None:
                assert (await post(client, BODY, "default")).status_code == 200
                assert records[-1].attempts[0].start - start == pytest.approx(0.9, abs=1e-9)
            else:
                with pytest.raises(RateLimited) as refused:
                    await post(client, BODY, "default")
                assert now() == start  # never sent, never waited
                assert "(no deadline) or the caller's pool timeout (0.5s)" in str(refused.value)

    run_virtual(main, backend)


@BACKENDS
def test_a_wait_that_leaves_a_median_ttft_but_not_a_p95_is_refused(backend: str) -> None:
    # The replica's first tokens take 0.1 s typically and 0.4 s on its slow tries (p95). The second call's share
    # comes 0.7 s into its 1 s ttft: a median first token would make it, a p95 one would not, and an attempt
    # let through that then times out spends the provider's limit for nothing. It is refused at once.
    async def main() -> None:
        fakes, _, guard = one_call_bucket(headers_after=0.8, ttft=1.0)
        async with guard, guard.http_client() as client:
            for i in range(20):
                guard.ttft_stats.observe("http://a", "t", False, 0.4 if i % 10 == 0 else 0.1)
            assert guard.ttft_stats.typical("t", False) == pytest.approx(0.1)
            assert guard.ttft_stats.high("t", False) == pytest.approx(0.4)
            refused = await refused_at_once(client, after=0.3)
        assert refused.retry_after == pytest.approx(0.7, abs=1e-9)
        assert fakes["http://a"].requests == 1

    run_virtual(main, backend)


@BACKENDS
def test_before_any_ttft_is_known_a_wait_may_take_half_the_time_left(backend: str) -> None:
    # No first token measured yet: a wait to the deadline itself would leave none for the first token. With 1 s
    # of ttft, a share 0.7 s away is refused at once; one 0.4 s away is waited for (each in a fresh Guard: an
    # answer teaches the guard a TTFT and its prompt estimate).
    async def main() -> None:
        fakes, _, guard = one_call_bucket(headers_after=0.8, ttft=1.0)
        async with guard, guard.http_client() as client:
            assert guard.ttft_stats.high("t", False) == 0.0
            refused = await refused_at_once(client, after=0.3)
        assert refused.retry_after == pytest.approx(0.7, abs=1e-9)
        assert fakes["http://a"].requests == 1
        fakes["http://a"] = FakeReplica("a", [Plan(headers_after=2.0), Plan(headers_after=0.1)])
        records: list[PhaseRecord] = []
        limit = RateLimit(tokens_per_minute=60 * CHARGE, burst=1.0)
        tiers = {"t": Tier(ttft=1.0, total=5.0), "slow": Tier(ttft=3.0, total=5.0)}
        guard = limited_guard(fakes, records, limit, tiers=tiers)
        async with guard, guard.http_client() as client, anyio.create_task_group() as tg:
            tg.start_soon(post, client, BODY, "slow")
            await anyio.sleep(0.6)
            (await post(client)).raise_for_status()
        waited = next(r for r in records if r.tier == "t")
        assert waited.attempts[0].start - waited.start == pytest.approx(0.4, abs=1e-9)

    run_virtual(main, backend)


@BACKENDS
def test_a_winner_is_corrected_from_its_usage_when_the_call_ends(backend: str) -> None:
    async def main() -> None:
        fakes = {"http://a": FakeReplica("a")}
        records: list[PhaseRecord] = []
        limit = RateLimit(requests_per_minute=60, tokens_per_minute=600 * CHARGE, burst=1.0)
        async with limited_guard(fakes, records, limit) as guard, guard.http_client() as client:
            assert guard.rate_limiter is not None
            bucket = guard.rate_limiter.bucket("http://a")
            (await post(client)).raise_for_status()
            assert bucket.levels() == pytest.approx((0.0, 10 * CHARGE - USED))

    run_virtual(main, backend)


@BACKENDS
def test_the_prompt_estimate_learns_the_tokens_per_byte_the_answers_report(backend: str) -> None:
    # FakeReplica reports 3 prompt tokens for BODY, far fewer than its bytes / 4: once an answer said so, the next
    # call is charged at that ratio (3 tokens) plus its max_tokens, not at 4 bytes per token.
    async def main() -> None:
        fakes = {"http://a": FakeReplica("a", [Plan(headers_after=1.0)])}
        records: list[PhaseRecord] = []
        limit = RateLimit(tokens_per_minute=60_000, burst=1.0)
        async with limited_guard(fakes, records, limit, tiers={"t": Tier(ttft=2.0, total=5.0)}) as guard:
            assert guard.rate_limiter is not None
            bucket = guard.rate_limiter.bucket("http://a")
            async with guard.http_client() as client:
                charges = []
                for _ in range(2):
                    async with anyio.create_task_group() as tg:
                        before = bucket.levels()[1]
                        tg.start_soon(post, client)
                        await anyio.wait_all_tasks_blocked()
                        charges.append(before - bucket.levels()[1])
        assert charges == pytest.approx([CHARGE, 3 + 20])

    run_virtual(main, backend)


@BACKENDS
def test_a_request_without_max_tokens_is_charged_the_default_output_estimate(backend: str) -> None:
    body = json.dumps({"model": "m", "messages": []}).encode()

    async def main() -> None:
        fakes = {"http://a": FakeReplica("a", [Plan(headers_after=1.0)])}
        records: list[PhaseRecord] = []
        limit = RateLimit(tokens_per_minute=60_000, burst=1.0)
        async with limited_guard(fakes, records, limit, tiers={"t": Tier(ttft=2.0, total=5.0)}) as guard:
            assert guard.rate_limiter is not None
            bucket = guard.rate_limiter.bucket("http://a")
            async with guard.http_client() as client, anyio.create_task_group() as tg:
                tg.start_soon(post, client, body)
                await anyio.wait_all_tasks_blocked()
                assert bucket.levels()[1] == pytest.approx(1000 - math.ceil(len(body) / 4) - DEFAULT_OUTPUT_ESTIMATE)

    run_virtual(main, backend)


@BACKENDS
def test_retries_are_charged_and_a_hedge_that_does_not_fit_is_not_sent(backend: str) -> None:
    # Room for 2 requests, 1 more per second. The first call fails (500) and its retry takes the second request;
    # the next call's primary then waits for its share, and its hedge (which never waits) is not sent.
    async def main() -> None:
        fakes = {
            "http://a": FakeReplica("a", [Plan(status=500), Plan(first_token_after=1.0, tokens=1)]),
            "http://b": FakeReplica("b", [Plan(status=500), Plan(first_token_after=1.0, tokens=1)]),
        }
        records: list[PhaseRecord] = []
        limit = RateLimit(requests_per_minute=60, burst=2.0)
        async with (
            limited_guard(
                fakes,
                records,
                limit,
                tiers={"t": Tier(ttft=3.0, total=5.0)},
                hedge=HedgePolicy(delay=0.1),
                retry=RetryPolicy(backoff_initial=0.001, backoff_max=0.001),
            ) as guard,
            guard.http_client() as client,
        ):
            (await post(client)).raise_for_status()
            first = records[-1]
            assert [a.kind for a in first.attempts][:2] == ["primary", "retry"]
            (await post(client)).raise_for_status()
        second = records[-1]
        assert [a.kind for a in second.attempts] == ["primary"]  # the hedge did not fit: not sent
        sent = sum(f.requests for f in fakes.values())
        assert sent == len(first.attempts) + 1

    run_virtual(main, backend)


@BACKENDS
def test_an_attempt_the_provider_refused_is_refunded(backend: str) -> None:
    # Room for 2 requests. The first attempt gets a 429 (the provider counted it against nothing), the retry wins:
    # only the retry stays charged.
    async def main() -> None:
        fakes = {"http://a": FakeReplica("a", [Plan(status=429)]), "http://b": FakeReplica("b")}
        records: list[PhaseRecord] = []
        limit = RateLimit(requests_per_minute=6, burst=20.0)  # 2 requests, 1 more per 10 s
        async with (
            limited_guard(
                fakes, records, limit, retry=RetryPolicy(backoff_initial=0.001, backoff_max=0.001), budget=None
            ) as guard,
            guard.http_client() as client,
        ):
            assert guard.rate_limiter is not None
            (await post(client)).raise_for_status()
            assert [a.status_code for a in records[-1].attempts] == [429, 200]
            assert guard.rate_limiter.bucket("http://a").levels()[0] == pytest.approx(1.0, abs=0.01)

    run_virtual(main, backend)


@BACKENDS
def test_x_ratelimit_remaining_headers_lower_the_bucket(backend: str) -> None:
    completion = {
        "id": "c",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    headers = {"x-ratelimit-remaining-tokens": "7", "x-ratelimit-remaining-requests": "2"}
    mock = httpx.MockTransport(lambda request: httpx.Response(200, json=completion, headers=headers))

    async def main() -> None:
        limit = RateLimit(requests_per_minute=600, tokens_per_minute=60_000, burst=1.0)
        guard = Guard(
            ["http://a"],
            instrumentation=None,
            transport_factory=lambda r: mock,
            rate_limit=limit,
            tiers={"t": Tier(ttft=1.0, total=5.0)},
        )
        async with guard, guard.http_client() as client:
            assert guard.rate_limiter is not None
            (await post(client)).raise_for_status()
            # Lowered to the provider's room (2 requests, 7 tokens), then the charge's unused part given back.
            assert guard.rate_limiter.bucket("http://a").levels() == pytest.approx((2.0, 7 + CHARGE - USED))

    run_virtual(main, backend)


def test_a_replica_with_its_own_limit_is_charged_to_it_and_the_others_to_the_guards() -> None:
    from llmguard_client import Replica

    own = RateLimit(requests_per_minute=10)
    guard = Guard(
        [Replica("http://a", rate_limit=own), "http://b"],
        rate_limit=RateLimit(requests_per_minute=99),
        instrumentation=None,
    )
    assert guard.rate_limiter is not None
    assert guard.rate_limiter.bucket("http://a").limit is own
    assert guard.rate_limiter.bucket("http://b").limit == RateLimit(requests_per_minute=99)
    assert Guard(["http://a"], instrumentation=None).rate_limiter is None


def test_a_continuation_is_charged_for_the_body_it_sends_not_the_callers() -> None:
    from types import SimpleNamespace
    from typing import cast

    from llmguard_client._core.call import Call
    from llmguard_client._core.outcome import Route
    from llmguard_client._core.request import NO_MEDIA
    from llmguard_client._ratelimit.layer import charge_for
    from llmguard_client._ratelimit.prompt_estimate import PromptEstimator

    call = cast(Call, SimpleNamespace(body=b"x" * 400, record=SimpleNamespace(max_tokens=50), media=NO_MEDIA))
    prompts = PromptEstimator()
    assert charge_for(call, prompts) == charge_for(call, prompts, Route()) == 100 + 50
    assert charge_for(call, prompts, Route(kind="continuation", body=b"y" * 4000)) == 1000 + 50


IMAGE_URL = "data:image/png;base64," + "QUJD" * 100_000
"""A 400 KB image: 100,000 tokens at 4 bytes per token, under 2,000 to a provider."""


def image_body(part: dict[str, object] | None = None) -> bytes:
    """A chat body asking about an image: ``part``, by default `IMAGE_URL` (high detail)."""
    part = part or {"type": "image_url", "image_url": {"url": IMAGE_URL}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, part]}]
    return json.dumps({"model": "m", "messages": messages, "max_tokens": 20}).encode()


@BACKENDS
def test_an_image_is_charged_its_allowance_so_text_calls_beside_it_go_at_once(backend: str) -> None:
    """An image call in flight, charged by its bytes, took a hundred buckets: every text call next to it was
    refused (or, without a deadline, waited minutes), as the plain SDK's were served."""

    async def main() -> None:
        fakes = {"http://a": FakeReplica("a", [Plan(headers_after=1.0), Plan()])}
        records: list[PhaseRecord] = []
        limit = RateLimit(tokens_per_minute=600_000, burst=1.0)  # 10,000 tokens
        tiers = {"t": Tier(ttft=0.5, total=5.0), "slow": Tier(ttft=3.0, total=5.0)}
        async with limited_guard(fakes, records, limit, tiers=tiers) as guard, guard.http_client() as client:
            assert guard.rate_limiter is not None
            bucket = guard.rate_limiter.bucket("http://a")
            body = image_body()
            async with anyio.create_task_group() as tg:
                tg.start_soon(post, client, body, "slow")
                await anyio.wait_all_tasks_blocked()
                media_chars = len("image_url") + len(IMAGE_URL)
                charge = math.ceil((len(body) - media_chars) / 4) + IMAGE_TOKENS + 20
                assert bucket.levels()[1] == pytest.approx(10_000 - charge)
                await anyio.sleep(0.1)
                start = now()
                (await post(client)).raise_for_status()
                assert records[-1].attempts[0].start == start  # sent at once
        assert fakes["http://a"].requests == 2

    run_virtual(main, backend)


SCREENSHOT = "data:image/png;base64," + "QUJD" * 250_000
"""A 1 MB screenshot: 250,000 tokens at 4 bytes per token, under 2,000 to a provider."""


def responses_body(item: dict[str, object]) -> bytes:
    """A Responses API body sending ``item`` back as its input, after the tool call it answers."""
    call = {"type": "function_call", "call_id": "c1", "name": "screen", "arguments": "{}"}
    return json.dumps({"model": "m", "input": [call, item], "max_output_tokens": 20}).encode()


async def charged_then_text_call(
    client: httpx.AsyncClient, tokens_level: Callable[[], float], body: bytes, path: str
) -> float:
    """``body`` sent (tier ``slow``, answered after 1 s), then a text call 0.1 s later that must go at once: the
    bucket's tokens once ``body`` was charged."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(post, client, body, "slow", path)
        await anyio.wait_all_tasks_blocked()
        level = tokens_level()
        await anyio.sleep(0.1)
        start = now()
        (await post(client)).raise_for_status()
        assert now() == start  # sent at once
    return level


@BACKENDS
@pytest.mark.parametrize(
    ("path", "body", "image_chars"),
    [
        (
            "/v1/chat/completions",
            image_body({"type": "image_url", "image_url": {"url": "https://x/cat.png", "detail": "low"}}),
            len("image_url") + len("https://x/cat.png") + len("low"),
        ),
        (
            "/v1/responses",
            responses_body(
                {
                    "type": "function_call_output",
                    "call_id": "c1",
                    "output": [{"type": "input_image", "image_url": SCREENSHOT, "detail": "low"}],
                }
            ),
            len("input_image") + len(SCREENSHOT) + len("low"),
        ),
    ],
    ids=["chat-url", "responses-tool-output"],
)
def test_a_low_detail_image_is_charged_what_openai_counts_so_a_small_bucket_serves_the_calls_after_it(
    backend: str, path: str, body: bytes, image_chars: int
) -> None:
    """OpenAI counts an image sent with ``"detail": "low"`` as 85 tokens. Charged the 2,500 of any image, it took more
    than a bucket of ``RateLimit(tokens_per_minute=60_000)`` holds (1,000 tokens), and every call after it waited for
    room the provider never used (or was refused, as here, where its tier's ttft leaves no time for that wait)."""

    async def main() -> None:
        fakes = {"http://a": FakeReplica("a", [Plan(headers_after=1.0), Plan()])}
        records: list[PhaseRecord] = []
        tiers = {"t": Tier(ttft=0.5, total=5.0), "slow": Tier(ttft=3.0, total=5.0)}
        limit = RateLimit(tokens_per_minute=60_000, burst=1.0)  # 1,000 tokens, 1,000 a second
        async with limited_guard(fakes, records, limit, tiers=tiers) as guard, guard.http_client() as client:
            assert guard.rate_limiter is not None
            bucket = guard.rate_limiter.bucket("http://a")
            level = await charged_then_text_call(client, lambda: bucket.levels()[1], body, path)
        image = min(LOW_DETAIL_IMAGE_TOKENS, math.ceil(image_chars / 4))  # an image by URL: its bytes, fewer
        assert level == pytest.approx(1_000 - math.ceil((len(body) - image_chars) / 4) - image - 20)
        assert fakes["http://a"].requests == 2

    run_virtual(main, backend)


@BACKENDS
@pytest.mark.parametrize(
    ("item", "image_chars"),
    [
        (
            {
                "type": "computer_call_output",
                "call_id": "c1",
                "output": {"type": "computer_screenshot", "image_url": SCREENSHOT},
            },
            len("computer_screenshot") + len(SCREENSHOT),
        ),
        (
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [
                    {"type": "input_text", "text": "the screen:"},
                    {"type": "input_image", "image_url": SCREENSHOT, "detail": "high"},
                ],
            },
            len("input_image") + len(SCREENSHOT) + len("high"),
        ),
    ],
    ids=["computer_call_output", "function_call_output"],
)
def test_a_screenshot_a_tool_sends_back_is_charged_an_images_allowance_not_its_bytes(
    backend: str, item: dict[str, object], image_chars: int
) -> None:
    """A Responses API tool's output (a computer_call_output's screenshot, a function_call_output's content parts)
    was not looked into: its 1 MB screenshot was charged as text, 250,000 tokens, and the text calls after it were
    refused where the plain SDK served them."""

    async def main() -> None:
        fakes = {"http://a": FakeReplica("a", [Plan(headers_after=1.0), Plan()])}
        records: list[PhaseRecord] = []
        tiers = {"t": Tier(ttft=0.5, total=5.0), "slow": Tier(ttft=3.0, total=5.0)}
        limit = RateLimit(tokens_per_minute=600_000, burst=1.0)  # 10,000 tokens
        body = responses_body(item)
        async with limited_guard(fakes, records, limit, tiers=tiers) as guard, guard.http_client() as client:
            assert guard.rate_limiter is not None
            bucket = guard.rate_limiter.bucket("http://a")
            level = await charged_then_text_call(client, lambda: bucket.levels()[1], body, "/v1/responses")
        assert level == pytest.approx(10_000 - math.ceil((len(body) - image_chars) / 4) - IMAGE_TOKENS - 20)
        assert fakes["http://a"].requests == 2

    run_virtual(main, backend)


class _Embeddings(httpx.AsyncBaseTransport):
    """Answers an embeddings call after 1 s with OpenAI's usage: ``prompt_tokens`` and ``total_tokens``, no
    ``completion_tokens``."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await anyio.sleep(1.0)
        body = {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
            "model": "emb",
            "usage": {"prompt_tokens": 5, "total_tokens": 5},
        }
        return httpx.Response(200, json=body)


@BACKENDS
def test_an_embeddings_call_is_charged_no_output_and_corrected_to_its_prompt_tokens(backend: str) -> None:
    """It was charged 256 output tokens an embedding never generates, and never corrected (its usage has no
    completion count): single-query embeddings went at a twenty-fifth of what the limit allows."""
    body = json.dumps({"model": "emb", "input": "what is the weather in Paris?"}).encode()

    async def main() -> None:
        limit = RateLimit(tokens_per_minute=60, burst=1000.0)  # 1,000 tokens, 1 a second
        guard = Guard(["http://a"], instrumentation=None, transport_factory=lambda r: _Embeddings(), rate_limit=limit)
        async with guard, guard.http_client() as client:
            assert guard.rate_limiter is not None
            bucket = guard.rate_limiter.bucket("http://a")
            headers = {"content-type": "application/json"}
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: client.post("http://a/v1/embeddings", content=body, headers=headers))
                await anyio.wait_all_tasks_blocked()
                assert bucket.levels()[1] == pytest.approx(1000 - math.ceil(len(body) / 4))
            assert bucket.levels()[1] == pytest.approx(1000 - 5 + 1)  # corrected to its usage (and 1 s of refill)

    run_virtual(main, backend)
