"""benchmarks/rate_limited_endpoint.py: the endpoint's limit is a token bucket that says when its next token comes."""

from __future__ import annotations

import pytest

from benchmarks.rate_limited_endpoint import RetryAfter, TokenBucket

HEADERS: list[tuple[RetryAfter, list[tuple[str, str]]]] = [
    ("seconds", [("retry-after", "1")]),
    ("ms", [("retry-after-ms", "200")]),
    ("none", []),
]


@pytest.mark.parametrize(("retry_after", "headers"), HEADERS)
def test_a_full_bucket_admits_its_tokens_then_refuses_until_the_next_one(
    retry_after: RetryAfter, headers: list[tuple[str, str]]
) -> None:
    now = [100.0]
    bucket = TokenBucket(5.0, retry_after, clock=lambda: now[0])
    assert [bucket(i, 1) for i in range(5)] == [None] * 5  # answered as scripted
    refused = bucket(5, 1)
    assert refused is not None and refused.status == 429
    assert list(refused.headers.items()) == headers  # 0.2 s to the next token: 1 whole second, or 200 ms
    now[0] += 0.2
    assert bucket(6, 1) is None  # the next token came
