"""How a failed call is named for a load tool: the guard's cause and status, a server's status, or the type."""

from __future__ import annotations

import httpx2
import openai

from llmguard_client import TTFTTimeout
from llmguard_tools.loadtest.streaming import ChatFailure, describe_failure

REQUEST = httpx2.Request("POST", "http://replica/v1/chat/completions")


def _status_error(status: int, headers: dict[str, str]) -> openai.APIStatusError:
    response = httpx2.Response(status, headers=headers, json={"error": {"message": "x"}}, request=REQUEST)
    return openai.APIStatusError("failed", response=response, body=None)


def test_a_guard_answer_is_named_by_its_cause_and_status() -> None:
    failure = describe_failure(_status_error(504, {"x-llmguard-cause": "ttft_timeout", "x-should-retry": "false"}))
    assert isinstance(failure, ChatFailure)
    assert str(failure) == "guard ttft_timeout (HTTP 504)"
    assert failure.cause == "ttft_timeout"


def test_a_guard_failure_raised_is_named_as_its_answer_would_be() -> None:
    error = TTFTTimeout("no first token within 1.0 s (tier interactive)")
    failure = describe_failure(error)
    assert str(failure) == "guard ttft_timeout (HTTP 504)"
    assert failure.__cause__ is error


def test_a_servers_own_answer_is_named_by_its_status_not_by_the_guard() -> None:
    failure = describe_failure(_status_error(503, {"x-llmguard-cause": "upstream_status"}))
    assert (str(failure), failure.cause) == ("HTTP 503", "upstream_status")
    assert str(describe_failure(_status_error(429, {}))) == "HTTP 429"


def test_other_errors_are_named_by_their_type_so_that_each_kind_is_one_row() -> None:
    first = describe_failure(openai.APIConnectionError(request=REQUEST))
    second = describe_failure(openai.APIConnectionError(message="refused at 10:02:03", request=REQUEST))
    assert str(first) == str(second) == "APIConnectionError"
    assert first.cause is None
