"""The hedge delay of a keyed call follows its class, in virtual time: a call sent to the replica that answered
its key's last call (expected to hit the prefix cache) is hedged at the cached calls' p95, any other keyed call
at the uncached calls' p95."""

from __future__ import annotations

from typing import Any

import pytest

from llmguard_client import AffinityPolicy, Guard, HedgePolicy, PhaseRecord, Tier
from llmguard_client._routing.affinity.hashing import affinity_order
from tests.virtual import BACKENDS, FakeReplica, Plan, run_virtual, virtual_guard

CHAT = "/v1/chat/completions"
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
CACHED, UNCACHED = 0.08, 0.4
"""The p95s the replicas' TTFT windows are given: every sample of a class is that value."""


def warm(guard: Guard, replicas: list[str]) -> None:
    """Enough samples of both classes on every replica (20 each; ``min_samples`` is 20)."""
    for replica in replicas:
        for _ in range(20):
            guard.ttft_stats.observe(replica, "interactive", True, CACHED, cached=True)
            guard.ttft_stats.observe(replica, "interactive", True, UNCACHED, cached=False)


@BACKENDS
def test_an_expected_hit_is_hedged_at_the_cached_p95_and_a_miss_at_the_uncached_p95(backend: str) -> None:
    slow, fast = Plan(first_token_after=5.0), Plan()
    first_url, other_url = affinity_order("conversation-1", ["http://a.test", "http://b.test"])
    fakes = {first_url: FakeReplica("first", [slow, fast]), other_url: FakeReplica("other", [fast, slow])}
    records: list[PhaseRecord] = []

    async def main() -> None:
        tiers = {"interactive": Tier(ttft=10.0, total=20.0, stall=10.0)}
        hedge = HedgePolicy(min_samples=20, min_delay=0.01)
        policy = AffinityPolicy(auto=False)
        async with virtual_guard(fakes, records, tiers=tiers, hedge=hedge, affinity=policy) as guard:
            warm(guard, list(fakes))
            overall = guard.ttft_stats.hedge_delay("interactive", True)
            assert CACHED < overall <= UNCACHED
            async with guard.http_client() as client:
                with guard.session("conversation-1"):
                    # Its first call: nothing cached anywhere. It goes to the key's first replica, which is slow;
                    # the hedge to the other wins, and the other becomes the key's home.
                    first = await client.post(first_url + CHAT, json=BODY)
                    # The next call goes home, expected to hit its cache; home is slow now, the first answers.
                    second = await client.post(first_url + CHAT, json=BODY)
            assert first.status_code == second.status_code == 200

    run_virtual(main, backend)
    (miss_primary, miss_hedge), (hit_primary, hit_hedge) = (r.attempts for r in records)
    assert (miss_primary.replica, miss_hedge.outcome) == (first_url, "won")
    assert (hit_primary.replica, hit_hedge.outcome) == (other_url, "won")
    assert miss_hedge.start - miss_primary.start == pytest.approx(UNCACHED, abs=1e-9)
    assert hit_hedge.start - hit_primary.start == pytest.approx(CACHED, abs=1e-9)
