"""The JSON body an in-stream error becomes: the server's own error object, whole, as the plain SDKs hand it over.

Against a real loopback server that answers every request with one fixed 200 event stream holding an error
before any token: the guarded SDK raises its HTTP-status error, whose ``body`` is the error object the plain SDK
raises with, every key of it (OpenRouter's ``metadata``, Anthropic's ``request_id``) kept.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from llmguard_client import Guard
from llmguard_client.protocols.errors import error_failure
from tests.loopback import answering_stream, raw_server

OPENROUTER_ERROR = {
    "code": 403,
    "message": "Input was flagged by moderation",
    "metadata": {"reasons": ["harassment"], "flagged_input": "...", "provider_name": "OpenAI"},
}
"""OpenRouter's moderation error, sent inside a 200 stream before any token."""
OPENROUTER_STREAM = (
    b": OPENROUTER PROCESSING\n\n"
    + b"data: "
    + json.dumps(
        {
            "id": "gen-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "error": OPENROUTER_ERROR,
            "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
        }
    ).encode()
    + b"\n\n"
)
ANTHROPIC_ERROR = {
    "type": "error",
    "error": {"type": "permission_error", "message": "not allowed", "details": {"policy": "p1"}},
    "request_id": "req_1",
}
ANTHROPIC_STREAM = b"event: error\ndata: " + json.dumps(ANTHROPIC_ERROR).encode() + b"\n\n"
MESSAGES: Any = [{"role": "user", "content": "hi"}]


async def test_an_openrouter_error_keeps_its_metadata() -> None:
    async with raw_server(answering_stream(OPENROUTER_STREAM)) as url, Guard([url], instrumentation=None) as guard:
        errors = []
        for http_client in (None, guard.http_client_for(openai.AsyncOpenAI)):
            kwargs: dict[str, Any] = {} if http_client is None else {"http_client": http_client}
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0, **kwargs) as oai:
                with pytest.raises(openai.APIError) as caught:
                    stream = await oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)
                    async for _ in stream:
                        pass
            errors.append(caught.value)
    plain, guarded = errors
    assert plain.body == OPENROUTER_ERROR
    assert isinstance(guarded, openai.PermissionDeniedError) and guarded.body == OPENROUTER_ERROR
    assert guarded.code == "403" and guarded.type is None  # as the plain SDK's: no type the server did not send


async def test_an_anthropic_error_event_is_the_body_as_it_came() -> None:
    anthropic = pytest.importorskip("anthropic")
    async with raw_server(answering_stream(ANTHROPIC_STREAM)) as url, Guard([url], instrumentation=None) as guard:
        errors = []
        for http_client in (None, guard.http_client_for(anthropic.AsyncAnthropic)):
            kwargs: dict[str, Any] = {} if http_client is None else {"http_client": http_client}
            client = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0, **kwargs)
            with pytest.raises(anthropic.APIStatusError) as caught:
                stream = await client.messages.create(model="m", max_tokens=5, messages=MESSAGES, stream=True)
                async for _ in stream:
                    pass
            await client.close()
            errors.append(caught.value)
    plain, guarded = errors
    assert plain.body == ANTHROPIC_ERROR
    assert isinstance(guarded, anthropic.PermissionDeniedError) and guarded.body == ANTHROPIC_ERROR


@pytest.mark.parametrize(
    ("error", "error_type", "body"),
    [
        ({"code": 502, "metadata": {"raw": "x"}}, None, {"message": '{"code": 502, "metadata": {"raw": "x"}}'}),
        ("Model is overloaded", "overloaded", {"message": "Model is overloaded", "type": "overloaded"}),
        ("something broke", None, {"message": "something broke"}),
    ],
    ids=["no_message", "tgi", "plain_string"],
)
def test_only_a_message_is_added_to_what_the_server_sent(error: object, error_type: object, body: object) -> None:
    failure = error_failure(error, error_type=error_type)
    expected = {**error, **body} if isinstance(error, dict) and isinstance(body, dict) else body
    assert json.loads(failure.body) == {"error": expected}
