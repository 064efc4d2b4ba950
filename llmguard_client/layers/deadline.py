"""Deadlines after the first token: the replayed, watched response body.

Before the first token the call runs inside one anyio cancel scope bounded by the
tier's ``ttft`` (see `llmguard_client._transport`). Once a winner is chosen, the
caller gets a response whose body is `WatchedStream`: it first replays the bytes the
winner already read (nothing lost or reordered), then passes the rest through as it
arrives, each read bounded by the tier's ``stall`` and by what is left of ``total``.
A deadline that passes closes the connection (the server sees the disconnect) and
raises `StallTimeout` / `TotalTimeout` (both `httpx.TimeoutException`) into the
caller's iteration. The per-chunk cost is one cancel scope and an SSE line split.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable

import anyio
import httpx

from llmguard_client._call import Call
from llmguard_client._errors import GuardTimeout, StallTimeout, TotalTimeout
from llmguard_client.layers.attempt import AttemptWin, close_quietly, error_kind
from llmguard_client.telemetry.record import CallStatus

Finalizer = Callable[[CallStatus, str | None], None]
"""Called exactly once when the body is done: (status, cause)."""


class WatchedStream(httpx.AsyncByteStream):
    """The winner's body: replayed prefix, then the live remainder under stall/total deadlines."""

    def __init__(
        self,
        call: Call,
        win: AttemptWin,
        finalize: Finalizer,
        clock: Callable[[], float] = time.monotonic,
        enforce: bool = True,
    ) -> None:
        self._call = call
        self._win = win
        self._finalize = finalize
        self._clock = clock
        self._enforce = enforce
        self._finished = False
        self._complete = win.rest is None
        self._unreplayed = len(win.chunks)
        """Buffered chunks not yet handed to the caller (the scanner has already seen them)."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for buffered in self._win.chunks:
            self._unreplayed -= 1
            yield buffered
        self._win.chunks = []
        rest = self._win.rest
        if rest is None:
            return
        scanner = self._win.scanner
        stall = self._call.tier.stall if self._enforce and self._call.tier.stall else math.inf
        deadline = self._call.total_deadline if self._enforce else math.inf
        while True:
            left = deadline - self._clock()
            wait = min(stall, left)
            chunk: bytes | None = None
            with anyio.move_on_after(wait):
                try:
                    chunk = await rest.__anext__()
                except StopAsyncIteration:
                    self._complete = True
                    return
                except (httpx.HTTPError, OSError, anyio.BrokenResourceError) as exc:
                    await self._fail("error", error_kind(exc))
                    raise
            if chunk is None:
                await self._timeout(stall_tripped=stall <= left)
            else:
                if scanner is not None:
                    scanner.feed(chunk)
                yield chunk

    async def _timeout(self, *, stall_tripped: bool) -> None:
        tier, name = self._call.tier, self._call.tier_name
        elapsed = self._clock() - self._call.record.start
        error: GuardTimeout
        if stall_tripped:
            error = StallTimeout(
                f"the stream stalled: no bytes for {tier.stall}s (tier {name!r} stall limit) "
                f"after the first token, {elapsed:.3f}s into the call; the connection was closed",
                request=self._call.request,
                record=self._call.record,
            )
        else:
            error = TotalTimeout(
                f"the call exceeded the total deadline of tier {name!r} ({tier.total}s; "
                f"{elapsed:.3f}s elapsed, mid-stream); the connection was closed",
                request=self._call.request,
                record=self._call.record,
            )
        await self._fail("timeout", error.cause)
        raise error

    async def _fail(self, status: CallStatus, cause: str) -> None:
        await close_quietly(self._win.response)
        self._done(status, cause)

    def _done(self, status: CallStatus, cause: str | None) -> None:
        if not self._finished:
            self._finished = True
            self._finalize(status, cause)

    async def aclose(self) -> None:
        """Close the upstream connection (if still open) and finish the call's record."""
        await close_quietly(self._win.response)
        scanner = self._win.scanner
        if self._complete or (scanner is not None and scanner.done and not self._unreplayed):  # caller read [DONE]
            self._done("ok", None)
        else:
            self._done("abandoned", "closed_by_caller")
