"""An error answer's body: the guard reads and keeps at most its first 64 KiB; the caller gets it whole."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from llmguard_client._http.error_body import ERROR_BODY_LIMIT, WholeErrorBody, read_head

CHUNK = 16 * 1024


class ServerBody(httpx.AsyncByteStream):
    """A body sent in `CHUNK`-byte pieces, counting what was read of it and whether it was closed."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.read = 0
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for start in range(0, len(self.data), CHUNK):
            piece = self.data[start : start + CHUNK]
            self.read += len(piece)
            yield piece

    async def aclose(self) -> None:
        self.closed = True


def answer(size: int) -> tuple[httpx.Response, ServerBody]:
    data = bytes(i % 251 for i in range(size))
    body = ServerBody(data)
    return httpx.Response(500, stream=body), body


@pytest.mark.parametrize("size", [0, 1000, ERROR_BODY_LIMIT - 1, ERROR_BODY_LIMIT])
async def test_a_body_within_the_limit_is_read_whole_with_nothing_left(size: int) -> None:
    response, body = answer(size)
    head, unread = await read_head(response)
    assert head == body.data and unread is None


@pytest.mark.parametrize("size", [ERROR_BODY_LIMIT + 1, 70_000, 300_000, 5_000_000])
async def test_a_longer_body_is_read_only_to_the_limit_and_handed_on_whole(size: int) -> None:
    response, body = answer(size)
    head, unread = await read_head(response)
    assert head == body.data[:ERROR_BODY_LIMIT]
    assert unread is not None and unread.response is response
    assert body.read <= ERROR_BODY_LIMIT + CHUNK  # what the guard holds while it judges: bounded
    handed = httpx.Response(500, stream=WholeErrorBody(head, unread))
    assert await handed.aread() == body.data  # httpx closes the stream once it is read
    assert body.closed


async def test_closing_a_handed_on_body_unread_closes_the_server_response() -> None:
    response, body = answer(300_000)
    head, unread = await read_head(response)
    assert unread is not None
    handed = httpx.Response(500, stream=WholeErrorBody(head, unread))
    await handed.aclose()
    assert body.closed and body.read <= ERROR_BODY_LIMIT + CHUNK
