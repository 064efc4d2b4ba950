"""read_opening: an answer read up to its first content token, a failure, or its end marker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio

from llmguard_client.protocols.chat import ChatReader
from llmguard_client.protocols.opening import read_opening

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}\n\n'
FILTERED = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"content_filter"}]}\n\n'


async def test_an_answer_that_ends_with_no_content_is_the_answer_at_its_end_marker() -> None:
    """A content filter's finish_reason, the body held open after it: the opening ends there (the answer is
    complete and wins, as the plain SDK hands it over), with the rest left to read."""
    held = anyio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield ROLE
        yield FILTERED
        await held.wait()  # the server keeps the body open
        yield b"data: [DONE]\n\n"

    reader = ChatReader()
    with anyio.fail_after(10):  # before: waits for the body's end, here for ever
        opening = await read_opening(body(), reader)
    assert (reader.complete, reader.first_token, reader.failure) == (True, False, None)
    assert reader.facts.finish_reasons == ["content_filter"]
    assert opening.chunks == [ROLE, FILTERED] and opening.rest is not None
    held.set()
    assert [chunk async for chunk in opening.rest] == [b"data: [DONE]\n\n"]
    assert reader.end_of_body() is None
