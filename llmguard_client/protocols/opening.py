"""Reading an answer up to its first content token, or to the failure that disqualifies it."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass

import anyio

from llmguard_client.protocols.base import StreamReader

DRAIN_BYTES = 64 * 1024
DRAIN_SECONDS = 0.05
"""After an in-stream error event, what is read on towards EOF (servers end the body right after one: vLLM
sends ``[DONE]``), so the connection goes back to the pool instead of being closed and reopened, a TCP (and
TLS) handshake more with a replica that just said it is overloaded."""


@dataclass(slots=True)
class Opening:
    """What was read: every chunk so far (to replay, unchanged; after an error event in a body that goes on, those
    up to the one carrying it) and the unread rest."""

    reader: StreamReader
    chunks: list[bytes]
    rest: AsyncIterator[bytes] | None
    """The unread remainder of the body; None once it was read to EOF."""


async def read_opening(
    body: AsyncIterable[bytes],
    reader: StreamReader,
    accepted: Callable[[], None] | None = None,
    chunks: list[bytes] | None = None,
) -> Opening:
    """Read ``body`` until ``reader`` sees the first content token, a failure or the protocol's end marker, or the
    body ends (then `StreamReader.end_of_body` has settled ``complete`` / ``failure``); ``accepted`` is called
    once, as soon as the reader sees the server accept the request. The chunks are collected in ``chunks`` if
    given (what was read before an error the body raised)."""
    chunks = [] if chunks is None else chunks
    rest = body.__aiter__()
    async for chunk in rest:
        chunks.append(chunk)
        first_token = reader.feed(chunk)
        if accepted is not None and reader.accepted:
            accepted()
            accepted = None
        if first_token:
            return Opening(reader, chunks, rest)
        if reader.failure is not None:
            if reader.failure.kind == "error_event":
                carried = len(chunks)
                if await _drain(rest, chunks):
                    return Opening(reader, chunks, None)
                del chunks[carried:]  # a body that goes on: up to the chunk carrying the error (no event cut short)
            return Opening(reader, chunks, rest)
        if reader.complete:  # the end marker with no content (a content filter's finish_reason): the answer
            return Opening(reader, chunks, rest)
    reader.end_of_body()
    return Opening(reader, chunks, None)


async def _drain(rest: AsyncIterator[bytes], chunks: list[bytes]) -> bool:
    """Read on, within `DRAIN_BYTES` and `DRAIN_SECONDS`; True if the body ended."""
    size = 0
    with anyio.move_on_after(DRAIN_SECONDS):
        async for chunk in rest:
            chunks.append(chunk)
            size += len(chunk)
            if size > DRAIN_BYTES:
                return False
        return True
    return False
