"""Deadlines after the first token: the replayed, watched response body.

Before the first token the call runs inside one anyio cancel scope bounded by the
tier's ``ttft`` (see `llmguard_client._transport`). Once a winner is chosen, the
caller gets a response whose body is `WatchedStream`: it first replays the bytes the
winner already read (nothing lost or reordered), then passes the rest through as it
arrives, each read bounded by the tier's ``stall`` and by what is left of ``total``.
A deadline that passes closes the connection (the server sees the disconnect) and
raises `StallTimeout` / `TotalTimeout` (both `httpx.TimeoutException`) into the
caller's iteration. The per-chunk cost is one cancel scope and an SSE line split.

The winner's protocol reader (`llmguard_client.protocols`) keeps reading: an in-stream error
raises `UpstreamStreamError` at the read after the chunk that carried it (the chunk itself, with
any tokens before the error, is delivered first), and an EOF before the protocol's end marker
raises `StreamTruncated`; the call is recorded ``error`` with the failure's cause. A caller that
closes the body after the end marker (openai 2.x stops at ``[DONE]``) leaves a call recorded ``ok``.
The control cohort gets every byte untouched: its failures are only recorded.
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
from llmguard_client.protocols import StreamFailure, stream_error
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
        self._complete = False
        self._end_delivered = False
        """The chunk holding the protocol's end marker has been handed to the caller."""
        self._failure: StreamFailure | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        reader = self._win.reader
        last = len(self._win.chunks) - 1
        for i, buffered in enumerate(self._win.chunks):
            self._end_delivered = i == last and reader.complete
            yield buffered
        self._win.chunks = []
        if reader.failure is not None:
            await self._upstream_failed(reader.failure)
        rest = self._win.rest
        if rest is None:
            self._complete = reader.failure is None
            return
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
                    failure = reader.end_of_body()
                    if failure is not None:
                        await self._upstream_failed(failure)
                    self._complete = failure is None
                    return
                except (httpx.HTTPError, OSError, anyio.BrokenResourceError) as exc:
                    await self._fail("error", error_kind(exc))
                    raise
            if chunk is None:
                await self._timeout(stall_tripped=stall <= left)
            else:
                reader.feed(chunk)
                self._end_delivered = reader.complete
                yield chunk
                if reader.failure is not None and self._failure is None:
                    await self._upstream_failed(reader.failure)

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

    async def _upstream_failed(self, failure: StreamFailure) -> None:
        """A failure after the first token: raised into the caller's iteration (guarded calls) with
        the connection closed, or, for the control cohort, only remembered for the record."""
        self._failure = failure
        if not self._enforce:
            return
        error = stream_error(
            failure,
            replica=self._win.state.name,
            request=self._call.request,
            record=self._call.record,
            after_first_token=True,
        )
        await self._fail("error", error.cause)
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
        failure = self._failure or self._win.reader.failure
        if failure is not None:
            self._done("error", failure.cause)
        elif self._complete or self._end_delivered:
            self._done("ok", None)
        else:
            self._done("abandoned", "closed_by_caller")
