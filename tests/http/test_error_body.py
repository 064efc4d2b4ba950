"""An error answer's body: the guard reads and keeps at most its first 64 KiB; the caller gets it whole."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

from llmguard_client._http.error_body import ERROR_BODY_LIMIT, ReadBound, WholeErrorBody, read_head
from tests.virtual import BACKENDS, run_virtual

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


class Expired(Exception):
    """What the bound raised: ``stalled`` (True) or past its total deadline."""

    def __init__(self, stalled: bool) -> None:
        self.stalled = stalled


UNBOUNDED = ReadBound(math.inf, math.inf, Expired, lambda: None)


class DrippingBody(ServerBody):
    """A long body whose rest, after its first ``CHUNK`` pieces past the limit, comes a byte every ``gap`` s."""

    def __init__(self, gap: float) -> None:
        super().__init__(b"x" * (ERROR_BODY_LIMIT + CHUNK))
        self.gap = gap

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for piece in super().__aiter__():
            yield piece
        while True:
            await anyio.sleep(self.gap)
            self.read += 1
            yield b"x"


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
    handed = httpx.Response(500, stream=WholeErrorBody(head, unread, UNBOUNDED))
    assert await handed.aread() == body.data  # httpx closes the stream once it is read
    assert body.closed


async def test_closing_a_handed_on_body_unread_closes_the_server_response() -> None:
    response, body = answer(300_000)
    head, unread = await read_head(response)
    assert unread is not None
    handed = httpx.Response(500, stream=WholeErrorBody(head, unread, UNBOUNDED))
    await handed.aclose()
    assert body.closed and body.read <= ERROR_BODY_LIMIT + CHUNK


class CutBody(ServerBody):
    """A body that ends in ``error`` after its first ``CHUNK`` piece: a server that closed or reset the connection
    before the end its ``content-length`` promised, or one too slow for the caller's read timeout."""

    def __init__(self, error: httpx.TransportError) -> None:
        super().__init__(b"e" * (2 * CHUNK))
        self.error = error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for piece in super().__aiter__():
            yield piece
            raise self.error


@pytest.mark.parametrize(
    "error",
    [httpx.RemoteProtocolError("peer closed connection without sending complete message body"), httpx.ReadError("")],
)
async def test_a_body_cut_short_is_the_answer_with_what_came_and_a_rest_that_raises_the_cut(
    error: httpx.TransportError,
) -> None:
    body = CutBody(error)
    response = httpx.Response(400, stream=body)
    head, unread = await read_head(response)
    assert head == body.data[:CHUNK] and unread is not None  # the status stands: the body came short of its end
    handed = httpx.Response(400, stream=WholeErrorBody(head, unread, UNBOUNDED))
    read: list[bytes] = []
    with pytest.raises(type(error)) as raised:
        async for piece in handed.aiter_raw():
            read.append(piece)
    assert raised.value is error and b"".join(read) == head  # the caller reads what came, then meets the cut


async def test_a_timeout_reading_the_body_is_raised_as_it_is() -> None:
    timeout = httpx.ReadTimeout("timed out")
    with pytest.raises(httpx.ReadTimeout) as raised:
        await read_head(httpx.Response(500, stream=CutBody(timeout)))
    assert raised.value is timeout


@BACKENDS
@pytest.mark.parametrize(("gap", "stalled"), [(0.1, False), (2.0, True)])
def test_a_server_dripping_the_rest_ends_in_the_calls_deadline_and_is_closed(
    backend: str, gap: float, stalled: bool
) -> None:
    """A byte every 0.1 s is no stall: the total deadline (3 s) ends it; a byte every 2 s stalls (limit 1 s)."""

    async def main() -> None:
        body = DrippingBody(gap)
        head, unread = await read_head(httpx.Response(500, stream=body))
        assert unread is not None
        start = anyio.current_time()
        bound = ReadBound(start + 3.0, 1.0, Expired, lambda: None)
        handed = httpx.Response(500, stream=WholeErrorBody(head, unread, bound))
        with pytest.raises(Expired) as raised:
            await handed.aread()
        assert raised.value.stalled is stalled
        assert anyio.current_time() - start == pytest.approx(1.0 if stalled else 3.0, abs=0.11)
        assert body.closed

    run_virtual(main, backend)
