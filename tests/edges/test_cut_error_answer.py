"""An error answer whose body is cut short (the server closed the connection before the end its ``content-length``
promised) reaches the SDK as it does without a guard: the status and headers the server sent, the bytes that came,
then the cut. The SDK then does what it does plain (the openai SDK reads the body inside its request and retries
the cut as a connection error; anthropic raises its connection error at once), with as many requests: the guard
does not retry a streamed call's status it would not retry whole, such as a 400, nor a cut the server marked
``x-should-retry: false`` (which anthropic reads on it), as it retried a cut it took for a dropped connection.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import pytest

from llmguard_client import Guard
from tests.loopback import raw_server

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
pytest.importorskip("httpx2")

ERROR = json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": "bad request"}}).encode()


CHAT = {
    "id": "c",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
}
MESSAGE = {
    "id": "msg",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [{"type": "text", "text": "hi"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 1, "output_tokens": 1},
}
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any]


def cut_first(first: bytes, then: bytes) -> tuple[Handler, list[int]]:
    """A handler answering ``first`` (an HTTP/1.1 status line and headers) with a body cut short, then ``then``
    (another status and headers) with ``ERROR`` whole, or the SDK's answer for a 200; and its count of requests."""
    requests: list[int] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with suppress(asyncio.IncompleteReadError, ConnectionError):
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
            requests.append(1)
            status = first if len(requests) == 1 else then
            body = ERROR
            if status.startswith(b"HTTP/1.1 200"):
                body = json.dumps(MESSAGE if b"/v1/messages" in head else CHAT).encode()
            promised = len(body) + (100 if len(requests) == 1 else 0)
            writer.write(
                status + b"content-type: application/json\r\nconnection: close\r\n"
                b"content-length: %d\r\n\r\n" % promised + body
            )
            await writer.drain()
        writer.close()

    return answer, requests


async def ask(sdk: str, url: str, guard: Guard | None, stream: bool) -> str:
    """The call's outcome through ``sdk`` (a guarded client when ``guard`` is given): the error's module and name, or
    served."""
    messages: Any = [{"role": "user", "content": "hi"}]
    try:
        if sdk == "openai":
            cls: Any = openai.AsyncOpenAI
            http_client = None if guard is None else guard.http_client_for(cls)
            client = cls(base_url=url + "/v1", api_key="k", http_client=http_client)
            answer = await client.chat.completions.create(model="m", messages=messages, stream=stream)
        else:
            cls = anthropic.AsyncAnthropic
            http_client = None if guard is None else guard.http_client_for(cls)
            client = cls(base_url=url, api_key="k", http_client=http_client)
            answer = await client.messages.create(model="m", max_tokens=5, messages=messages, stream=stream)
        if stream:
            async for _ in answer:
                pass
    except Exception as exc:
        return f"{type(exc).__module__.split('.')[0]}.{type(exc).__name__}"
    return "served"


async def plain_and_guarded(
    sdk: str, first: bytes, then: bytes, stream: bool = False
) -> tuple[tuple[str, int], tuple[str, int]]:
    """The outcome and the requests sent, through the plain SDK and through a Guard, each against a fresh server."""
    outcomes = []
    for guarded in (False, True):
        handler, requests = cut_first(first, then)
        async with raw_server(handler) as url, Guard([url], hedge=None, instrumentation=None) as guard:
            outcomes.append((await ask(sdk, url, guard if guarded else None, stream), len(requests)))
    return outcomes[0], outcomes[1]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("marked", [True, False], ids=["x-should-retry false", "400"])
@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
async def test_a_cut_error_answer_meets_the_sdk_as_without_a_guard(sdk: str, marked: bool, stream: bool) -> None:
    bad_request = b"HTTP/1.1 400 Bad Request\r\n" + (b"x-should-retry: false\r\n" if marked else b"")
    plain, guarded = await plain_and_guarded(sdk, bad_request, bad_request, stream)
    assert plain[0] != "served" and guarded == plain


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
async def test_a_whole_calls_cut_answer_teaches_the_guard_nothing_of_its_headers(sdk: str) -> None:
    """A cut 503 marked ``x-should-retry: false`` asking for 130 s of rest: an SDK that reads the body inside its
    request takes it for a dropped connection (openai retries it), so the guard neither holds the replica to that
    rest nor cools it: the calls after it are served at once, as without a guard."""
    unavailable = b"HTTP/1.1 503 Service Unavailable\r\nx-should-retry: false\r\nretry-after: 130\r\n"
    handler, _ = cut_first(unavailable, b"HTTP/1.1 200 OK\r\n")
    async with raw_server(handler) as url, Guard([url], hedge=None, instrumentation=None) as guard:
        await ask(sdk, url, guard, stream=False)
        later = [await ask(sdk, url, guard, stream=False) for _ in range(3)]
    assert later == ["served"] * 3


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
async def test_a_streamed_calls_cut_answer_is_judged_by_its_status(sdk: str) -> None:
    """A call that streams has the status first: a cut 429 is retried after its Retry-After, as the SDK retries it,
    and the next answer (a 400, whole) is the call's."""
    rate_limited = b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 0.2\r\n"
    plain, guarded = await plain_and_guarded(sdk, rate_limited, b"HTTP/1.1 400 Bad Request\r\n", stream=True)
    assert plain[0].endswith("BadRequestError") and guarded == plain


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
async def test_a_cut_answer_asking_for_a_days_rest_is_retried_as_a_dropped_connection(sdk: str) -> None:
    """The SDKs never judge the status of an answer they could not read whole: a 529 with ``Retry-After: 86400``
    cut short is retried after their backoff, and served; so is it through the guard (not held to that rest)."""
    overloaded = b"HTTP/1.1 529 Overloaded\r\nretry-after: 86400\r\n"
    plain, guarded = await plain_and_guarded(sdk, overloaded, b"HTTP/1.1 200 OK\r\n")
    assert plain == ("served", 2) and guarded == plain
