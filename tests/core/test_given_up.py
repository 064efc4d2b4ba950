"""The SDK call a request is a request of: the id its retries share."""

from __future__ import annotations

import httpx

from llmguard_client._core.given_up import sdk_call

URL = "http://r1.test:8000/v1/chat/completions"


def request(retry: int, **headers: str) -> httpx.Request:
    return httpx.Request("POST", URL, json={"model": "m"}, headers={"x-stainless-retry-count": str(retry), **headers})


async def test_an_sdk_calls_requests_share_its_id_and_count_their_retries() -> None:
    first, retry = await sdk_call(request(0), held=True), await sdk_call(request(1), held=True)
    assert first[0] is not None and (first[0], first[1], retry[1]) == (retry[0], 0, 1)
    assert await sdk_call(httpx.Request("POST", URL, json={"model": "m"}), held=True) == (None, 0)  # no SDK's


async def test_idempotency_keys_with_one_long_prefix_are_different_calls() -> None:
    """The id places a keyless call in its cohort: keys an SDK builds as ``stainless-python-retry-<uuid>`` must not
    all be one call (before: the id was the key's first 16 characters, the same for all)."""
    keys = [f"stainless-python-retry-{i:032x}" for i in range(3)]
    ids = {(await sdk_call(request(0, **{"Idempotency-Key": key}), held=True))[0] for key in keys}
    assert len(ids) == 3
