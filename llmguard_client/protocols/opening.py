"""Reading an answer up to its first content token, or to the failure that disqualifies it."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass

from llmguard_client.protocols.base import StreamReader


@dataclass(slots=True)
class Opening:
    """What was read: every chunk so far (to replay, unchanged) and the unread rest."""

    reader: StreamReader
    chunks: list[bytes]
    rest: AsyncIterator[bytes] | None
    """The unread remainder of the body; None once it was read to EOF."""


async def read_opening(body: AsyncIterable[bytes], reader: StreamReader) -> Opening:
    """Read ``body`` until ``reader`` sees the first content token or a failure, or the body ends
    (then `StreamReader.end_of_body` has settled ``complete`` / ``failure``)."""
    chunks: list[bytes] = []
    rest = body.__aiter__()
    async for chunk in rest:
        chunks.append(chunk)
        if reader.feed(chunk) or reader.failure is not None:
            return Opening(reader, chunks, rest)
    reader.end_of_body()
    return Opening(reader, chunks, None)
