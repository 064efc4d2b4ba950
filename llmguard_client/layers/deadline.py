"""Deadlines: the one owner of a call's ttft, stall and total limits.

Before the first token, `DeadlineLayer` runs the rest of the pipeline (retries, hedges,
attempts, backoff) inside one cancel scope that expires at the call's absolute first-token
deadline (start + tier ttft; the bulkhead's wait is bounded by the same instant). If a
winner was published while the scope fired (its token arrived in time, the losers were
still being closed), it is delivered all the same.

After the first token, `GuardBody` is the caller's response body: it replays the bytes the
winner already read (nothing lost or reordered), then passes the rest through as it arrives,
each read bounded by the tier's ``stall`` and by what is left of ``total``. A deadline that
passes closes the connection (the server sees the disconnect) and raises `StallTimeout` /
`TotalTimeout` (both `httpx.TimeoutException`) into the caller's iteration. The body holds
the call's lease and closes it exactly once: at the end of the stream, on an error or a
deadline, when the caller closes the response, when an unclosed body is garbage-collected
(`weakref.finalize`), or when ``Guard.aclose()`` aborts the call (`GuardClosed`).
"""

from __future__ import annotations

import math
import weakref
from collections import deque

import anyio
import httpx

from llmguard_client._call import Call
from llmguard_client._clock import scope_until
from llmguard_client._errors import GuardClosed, GuardTimeout, StallTimeout, TotalTimeout, TTFTTimeout
from llmguard_client._failure import describe_attempts
from llmguard_client._outcome import Failed, Outcome, Route, Win
from llmguard_client._pipeline import Next
from llmguard_client.layers.attempt import error_kind
from llmguard_client.telemetry.record import CallStatus


def ttft_timeout(call: Call, detail: str) -> TTFTTimeout:
    """The error of a call whose first token did not arrive within its tier's ttft."""
    elapsed = call.clock() - call.record.start
    return TTFTTimeout(
        f"no first content token within the ttft deadline of tier {call.tier_name!r} ({call.tier.ttft}s; "
        f"{elapsed:.3f}s elapsed); {describe_attempts(call.record)}; {detail}",
        request=call.request,
        record=call.record,
    )


class DeadlineLayer:
    """Bounds everything before the first token by the call's first-token deadline."""

    async def __call__(self, call: Call, route: Route, call_next: Next) -> Outcome:
        if not call.guarded:
            return await call_next(call, route)
        outcome: Outcome | None = None
        with scope_until(call.clock, call.first_token_deadline):
            outcome = await call_next(call, route)
        if outcome is not None:
            return outcome
        if call.winner is not None:  # the token came in time; the scope fired while losers were closed
            return call.winner
        return Failed(reason=ttft_timeout(call, "in-flight attempts were closed"))


class GuardBody(httpx.AsyncByteStream):
    """The winner's body: replayed prefix, then the live remainder under stall/total deadlines."""

    def __init__(self, call: Call, win: Win, *, enforce: bool) -> None:
        self._call = call
        self._pending = deque(win.chunks)
        win.chunks = []
        self._rest = win.rest
        self._scanner = win.scanner
        self._stall = call.tier.stall if enforce and call.tier.stall else math.inf
        self._deadline = call.total_deadline if enforce else math.inf
        self._complete = win.rest is None
        self._ended = False
        self._gc = weakref.finalize(self, call.lease.close_from_gc)
        self._gc.atexit = False

    def __aiter__(self) -> GuardBody:
        return self

    async def __anext__(self) -> bytes:
        if self._pending:
            return self._pending.popleft()
        if self._complete or self._ended:
            await self._end("ok" if self._complete else "abandoned", None)
            raise StopAsyncIteration
        call = self._call
        lease = call.lease
        now = call.clock()
        left = self._deadline - now
        stall_tripped = self._stall <= left
        wait = min(self._stall, left)
        # One scope per read, its deadline on the loop's own time line (no anyio.current_time per chunk).
        at = now + wait if call.clock is call.loop_time else call.loop_time() + wait
        scope = anyio.CancelScope(deadline=at)
        if lease.aborted:
            scope.cancel()
        lease._scopes.add(scope)
        try:
            with scope:
                try:
                    chunk = await self._rest.__anext__()  # type: ignore[union-attr]
                except StopAsyncIteration:
                    self._complete = True
                    await self._end("ok", None)
                    raise
                except (httpx.HTTPError, OSError, anyio.BrokenResourceError) as exc:
                    await self._end("error", error_kind(exc))
                    raise
                if self._scanner is not None:
                    self._scanner.feed(chunk)
                return chunk
        finally:
            lease._scopes.discard(scope)
        if lease.aborted:
            await self._end("error", GuardClosed.cause)
            raise GuardClosed(
                "the Guard was closed while this stream was being read; the connection was closed",
                request=call.request,
                record=call.record,
            )
        error = self._timeout(stall_tripped)
        await self._end("timeout", error.cause)
        raise error

    def _timeout(self, stall_tripped: bool) -> GuardTimeout:
        call = self._call
        tier, name = call.tier, call.tier_name
        elapsed = call.clock() - call.record.start
        if stall_tripped:
            return StallTimeout(
                f"the stream stalled: no bytes for {tier.stall}s (tier {name!r} stall limit) "
                f"after the first token, {elapsed:.3f}s into the call; the connection was closed",
                request=call.request,
                record=call.record,
            )
        return TotalTimeout(
            f"the call exceeded the total deadline of tier {name!r} ({tier.total}s; "
            f"{elapsed:.3f}s elapsed, mid-stream); the connection was closed",
            request=call.request,
            record=call.record,
        )

    async def _end(self, status: CallStatus, cause: str | None) -> None:
        if not self._ended:
            self._ended = True
            self._gc.detach()
        await self._call.lease.aclose(status, cause)

    async def aclose(self) -> None:
        """Close the upstream connection (if still open) and finish the call's record."""
        scanner = self._scanner
        if self._complete or (scanner is not None and scanner.done and not self._pending):  # the caller read [DONE]
            await self._end("ok", None)
        else:
            await self._end("abandoned", "closed_by_caller")
