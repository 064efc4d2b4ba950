"""guard_failure(exc): the guard's cause, from its own exceptions, translated ones and SDK errors."""

from __future__ import annotations

import sys

import httpx
import pytest

from llmguard_client import BulkheadFull, Guard, Tier, TTFTTimeout, guard_failure
from tests.edges.conftest import pools
from tests.loopback import LoopbackServer, Script

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

openai = pytest.importorskip("openai")
MESSAGES = [{"role": "user", "content": "hi"}]


def test_a_guard_exception_names_its_cause() -> None:
    assert guard_failure(TTFTTimeout("late")) == "ttft_timeout"
    assert guard_failure(BulkheadFull("full")) == "bulkhead_full"


def test_the_cause_is_found_along_cause_context_and_groups() -> None:
    try:
        try:
            raise TTFTTimeout("late")
        except TTFTTimeout as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert guard_failure(outer) == "ttft_timeout"
    try:
        try:
            raise BulkheadFull("full")
        except BulkheadFull:
            raise ValueError("during handling")  # noqa: B904 - __context__ on purpose
    except ValueError as outer:
        assert guard_failure(outer) == "bulkhead_full"
    group = BaseExceptionGroup("many", [ValueError("x"), TTFTTimeout("late")])
    assert guard_failure(group) == "ttft_timeout"


def test_a_response_header_names_the_cause_and_others_are_none() -> None:
    request = httpx.Request("POST", "http://a/v1/chat/completions")
    response = httpx.Response(429, headers={"x-llmguard-cause": "all_replicas_cooling"}, request=request)
    error = httpx.HTTPStatusError("429", request=request, response=response)
    assert guard_failure(error) == "all_replicas_cooling"
    assert guard_failure(httpx.ReadError("reset")) is None
    assert guard_failure(ValueError("x")) is None
    with pytest.raises(TypeError, match="takes an exception"):
        guard_failure("ttft_timeout")  # type: ignore[arg-type]


class MistralStyleError(Exception):
    """An SDK error keeping the answer as ``raw_response`` (mistralai's ``SDKError``)."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__("API error occurred")
        self.raw_response = response


class CohereStyleError(Exception):
    """An SDK error keeping the answer's headers as a plain dict (cohere's ``ApiError``)."""

    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__("status_code: 503")
        self.headers = headers


def test_the_cause_is_read_from_the_answer_other_sdks_keep_on_their_errors() -> None:
    """mistralai keeps the answer as ``raw_response``, cohere its headers as ``headers``: a refusal answered to them
    in response mode is named (it was None)."""
    response = httpx.Response(503, headers={"x-llmguard-cause": "bulkhead_full"})
    assert guard_failure(MistralStyleError(response)) == "bulkhead_full"
    assert guard_failure(CohereStyleError({"x-llmguard-cause": "budget_exhausted"})) == "budget_exhausted"
    assert guard_failure(CohereStyleError({"content-type": "application/json"})) is None


async def test_openai_errors_of_each_mode(servers: list[LoopbackServer]) -> None:
    for server in servers:
        server.script = Script(hang_before_headers=5.0)
    tiers = {"fast": Tier(ttft=0.2, total=5.0)}
    for mode in ("auto", "raise"):  # a deadline is a timeout in either mode
        async with Guard(
            [s.url for s in servers], tiers=tiers, failure_mode=mode, instrumentation=None, transport_factory=pools
        ) as guard:
            client = openai.AsyncOpenAI(
                base_url=servers[0].url + "/v1", api_key="k", max_retries=0, http_client=guard.httpx2_client()
            )
            with pytest.raises(openai.APITimeoutError) as caught:
                await client.chat.completions.create(model="m", messages=MESSAGES)
            assert guard_failure(caught.value) == "ttft_timeout"


@pytest.mark.parametrize(("status", "cause"), [(500, "upstream_status"), (400, None), (409, None)])
async def test_a_server_error_is_marked_upstream_status_only_when_the_guard_retried_it(
    servers: list[LoopbackServer], status: int, cause: str | None
) -> None:
    """A 500 the guard retried and then handed back is its decision; a 400 or a 409, which the guard does not retry
    (the SDK may, as without a guard), carries no cause of the guard's, so a retry loop of the caller's treats it
    as it would without a guard."""
    for server in servers:
        server.script = Script(status=status, body={"error": {"message": "no", "type": "invalid_request_error"}})
    async with Guard([s.url for s in servers], instrumentation=None, transport_factory=pools) as guard:
        client = openai.AsyncOpenAI(
            base_url=servers[0].url + "/v1", api_key="k", max_retries=0, http_client=guard.httpx2_client()
        )
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES)
    assert caught.value.status_code == status and guard_failure(caught.value) == cause
    sent = sum(len(s.received) for s in servers)
    assert sent == (1 if cause is None else 3)  # the guard's three attempts, or its one
