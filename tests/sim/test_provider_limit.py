"""A cluster with a provider rate limit: one bucket over every replica, 429 + Retry-After + x-ratelimit-*."""

from __future__ import annotations

import dataclasses

from llmguard_client import RateLimit
from llmguard_client._http.retry_after import parse_retry_after
from llmguard_client._ratelimit.headers import parse_rate_limits, remaining_room
from llmguard_tools.sim.cluster import SimCluster
from llmguard_tools.sim.scenarios import get_scenario
from tests.clients import plain_httpx
from tests.sim.conftest import chat_body, one_off


async def test_the_limit_is_shared_by_the_replicas_and_a_refusal_says_when_to_come_back() -> None:
    # 2 requests at most (then one more every 30 s): the third, on another replica, is refused.
    scenario = dataclasses.replace(one_off(replicas=2), rate_limit=RateLimit(requests_per_minute=2, burst=60.0))
    async with SimCluster(scenario) as cluster, plain_httpx(timeout=10.0) as http:
        answers = [
            await http.post(cluster.urls[i % 2] + "/v1/chat/completions", json=chat_body(stream=False))
            for i in range(3)
        ]
        assert cluster.provider is not None
        assert (cluster.provider.counters.admitted, cluster.provider.counters.limited) == (2, 1)
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert remaining_room(answers[0].headers)[0] == 1
    refused = answers[2]
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 29.0 < (parse_retry_after(refused.headers) or 0) <= 30.0  # a whole request missing, 1 per 30 s
    hint = parse_rate_limits(refused.headers)  # x-ratelimit-reset-*: until the bucket is full again (2 requests)
    assert hint is not None and 59.0 < hint.no_room_for <= 60.0


async def test_tokens_are_charged_max_tokens_up_front_and_refunded_what_was_not_generated() -> None:
    scenario = dataclasses.replace(one_off(), rate_limit=RateLimit(tokens_per_minute=6, burst=10_000.0))  # 1,000
    async with SimCluster(scenario) as cluster, plain_httpx(timeout=10.0) as http:
        body = chat_body(words=5, max_tokens=50, stream=False, ignore_eos=True)
        body["max_tokens"], body["ignore_eos"] = 50, False  # stops early (sampled length, cap 120)
        answer = await http.post(cluster.urls[0] + "/v1/chat/completions", json=body)
        used = answer.json()["usage"]["total_tokens"]
        assert remaining_room(answer.headers)[1] == 1000 - 55  # charged prompt + max_tokens on arrival
        assert cluster.provider is not None
        after = dict(cluster.provider.headers())  # once the call ended
        assert int(after["x-ratelimit-remaining-tokens"]) == 1000 - used


def test_the_ratelimited_scenario_limits_the_whole_cluster() -> None:
    scenario = get_scenario("ratelimited")
    assert scenario.rate_limit == RateLimit(requests_per_minute=1200, tokens_per_minute=120_000, burst=1.0)
    assert scenario.capacity_rps > 20  # the replicas could serve far more than the provider allows
