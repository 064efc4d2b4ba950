"""The caller's response body after the first token: stall and total limits, the protocol reader, continuation.

After the first token, `GuardBody` is the caller's response body: it replays the bytes the
winner already read (nothing lost or reordered), then passes the rest through as it arrives,
each read bounded by the tier's ``stall`` and by what is left of ``total``. A deadline that
passes closes the connection (the server sees the disconnect) and raises `StallTimeout` /
`TotalTimeout` (both `httpx.TimeoutException`) into the caller's iteration. A stream handed over at its
headers (`Call.opening_live`: a background job's, which no other attempt may follow) is read from its first
event, each read bounded by the first-token deadline until its first token (`TTFTTimeout` when it passes).
Once the protocol's end marker has been read, the rest of the body is read without them (`GuardBody._answered`).

The winner's protocol reader (`llmguard_client.protocols`) keeps reading: an in-stream error
raises `UpstreamStreamError` at the read after the chunk that carried it (the chunk itself, with
any tokens before the error, is delivered first; a Responses API ``error`` or ``response.failed``,
which the SDK hands over as events, is passed on and the stream read to its end), and an EOF
before the protocol's end marker raises `StreamTruncated`; the call is recorded ``error`` with
the failure's cause. A caller that closes the body after the end marker (openai 2.x stops at
``[DONE]``) leaves a call recorded ``ok``. (The control cohort never gets here:
`llmguard_client._rollout.passthrough` serves it.) The body holds the call's lease and closes it
exactly once: at the end of the stream, on an error or a deadline, when the caller closes the
response, when an unclosed body is garbage-collected (`weakref.finalize`), or when
``Guard.aclose()`` aborts the call (`GuardClosed`).

With a `ContinuationPolicy` a break after the first token (reset, truncation, stall, in-stream error or
malformed event; not the total deadline) is first handed to the call's continuation
(`llmguard_client._stream.continuation`): if another replica takes over, the caller reads on from it as
if nothing happened (the failing event is cut from the chunk that carried it); otherwise it gets the
error above.

"""

from __future__ import annotations

import math
import weakref
from collections import deque
from typing import NoReturn

import anyio
import httpx

from llmguard_client._core.call import Call
from llmguard_client._core.clock import is_cancellation
from llmguard_client._core.failure import read_timeout
from llmguard_client._core.given_up import GivenUp
from llmguard_client._core.lease import CallLease
from llmguard_client._core.outcome import Win
from llmguard_client._http.upload import sent_once
from llmguard_client._layers.attempt import error_kind
from llmguard_client._layers.deadline import ttft_timeout
from llmguard_client._stream.continuation import CallContinuation
from llmguard_client._stream.stages import StreamStages
from llmguard_client._stream.watchdog import ReadWatchdog
from llmguard_client.errors import GuardClosed, GuardStreamError, GuardTimeout
from llmguard_client.protocols import StreamFailure, stream_error
from llmguard_client.protocols.base import StreamReader
from llmguard_client.protocols.splice import cut_before_failure
from llmguard_client.telemetry.record import CallStatus

_READ_ERRORS = (StopAsyncIteration, httpx.HTTPError, OSError, anyio.BrokenResourceError)
"""How a read of the live remainder ends other than with a chunk: EOF, or a transport error."""


class GuardBody(httpx.AsyncByteStream):
    """The winner's body: replayed prefix, then the live remainder under stall/total deadlines,
    judged by its protocol reader."""

    def __init__(
        self,
        call: Call,
        win: Win,
        stages: StreamStages,
        continuation: CallContinuation | None = None,
        given_up: GivenUp | None = None,
    ) -> None:
        self._call = call
        self._given_up = given_up
        """Where a call that asked for no stream is remembered when its total deadline passes mid-body: the SDK
        reads such a body before it returns, and retries its failure, which must then fail at once."""
        self._lease: CallLease | None = call.lease
        """The call's lease until it is closed (then None)."""
        self._pending = deque(win.chunks)
        win.chunks = []
        self._rest = win.rest
        self._reader = win.reader
        self._win = win
        """The attempt whose stream the caller reads (a continuation's after one took over)."""
        self._stall = call.tier.stall or math.inf
        self._deadline = call.total_deadline
        self._stages = stages
        self._opening = call.opening_live and win.rest is not None and win.attempt.first_token is None
        """Handed over at its headers (`Call.opening_live`): until its first token, each read is bounded by the
        first-token deadline (`_opened` then puts the stall and total limits on it)."""
        self._caller_held = 0.0
        """Seconds of the opening the caller spent between its reads (saving the response's id, say): the server
        is not waited on then, so they move the first-token deadline back (not the total one)."""
        self._last_read = call.clock()
        """When the last read of the opening ended (first: when the stream was handed over)."""
        if self._opening:
            self._stall, self._deadline = math.inf, min(call.first_token_deadline, call.total_deadline)
        self._complete = win.rest is None and win.reader.failure is None
        self._end_delivered = False
        """The chunk holding the protocol's end marker has been handed to the caller."""
        self._failure: StreamFailure | None = None
        self._raise_next: GuardStreamError | None = None
        """The error of a failure delivered with its chunk, for the caller's next read (the call ended then)."""
        self._ended = False
        self._read_cancelled = False
        """A read was cancelled by the caller (its task, or a scope of its own; the stream under it ends with that
        read): a close then ends the call ``cancelled``, as a cancellation before the first token does."""
        self._gc = weakref.finalize(self, call.lease.close_from_gc)
        self._gc.atexit = False
        self._resume = continuation
        if continuation is not None and win.reader.failure is not None and self._pending:
            # The opening's last read carried the first token, then the failure: handed over up to the failure, as
            # `_delivering` hands a read, and the continuation decides at the next read.
            kept = cut_before_failure(self._pending.pop())
            if kept:
                self._pending.append(kept)
        self._stall_tripped = False
        self._watchdog: ReadWatchdog | None = None
        self._steady: ReadWatchdog | None = None
        """The watchdog while the next chunk is simply the next live read (nothing replayed, failed, ended)."""
        if win.rest is not None and not self._opening:  # an opening is read with a scope per read (`_read`)
            self._watch()

    def _watch(self) -> None:
        """Bound the live remainder's reads by the stall and total limits with a watchdog, where one can."""
        call = self._call
        self._watchdog = self._stages.watch(self._win.response, self._stall, self._deadline, call.time)
        if self._watchdog is not None:
            call.lease.cancellables.add(self._watchdog)
            if call.lease.aborted:
                self._watchdog.cancel()

    def _opened(self, reader: StreamReader) -> None:
        """A chunk of an opening read by the caller was fed to ``reader``: the attempt's acceptance and first token
        stamped as they come; past its first token (or a failure, or the end), the stall and total limits apply."""
        call, attempt = self._call, self._win.attempt
        now = call.clock()
        if reader.accepted and attempt.accepted is None:
            attempt.attempt_accepted(now)
        if reader.first_token or reader.failure is not None or reader.complete:
            self._opening = False
            if reader.first_token:
                attempt.attempt_first_token(now)
            self._stall, self._deadline = call.tier.stall or math.inf, call.total_deadline
            self._watch()
        call.record.opening_read(attempt)

    def __aiter__(self) -> GuardBody:
        return self

    def take_whole(self) -> bytes | None:
        """A body that arrived whole before it was handed over (an answer that is not a stream, or a stream that
        ended within its opening), taken at once: a reader on another thread then has every byte even if the loop
        running the call ends before the body's end is read (which finishes the call). None for any other body,
        or once a chunk was read."""
        if not self._complete or self._ended or self._raise_next is not None or self._end_delivered:
            return None
        whole = b"".join(self._pending)
        self._pending.clear()
        self._end_delivered = self._reader.complete
        return whole

    async def __anext__(self) -> bytes:
        watchdog = self._steady
        if watchdog is not None and watchdog.tripped is None:
            # The steady state, once per chunk, inlined: a live read under the watchdog.
            watchdog.start_read()
            try:
                chunk = await self._rest.__anext__()  # type: ignore[union-attr]  # steady: rest is set
            except BaseException as exc:
                waited = watchdog.end_read()
                if self._win is not None:  # None once another task closed the body under this read
                    self._win.waited += waited
                if not isinstance(exc, _READ_ERRORS):
                    if is_cancellation(exc):
                        self._read_cancelled = True
                    raise  # a cancellation: the caller's own
                self._steady = None
                # Handled inside the except block, which unbinds ``exc`` however it is left: a frame
                # holding its own exception is a cycle (exception -> traceback -> frame -> exception).
                return await self._read_ended(exc)
            self._win.waited += watchdog.end_read()
            reader = self._reader
            reader.feed(chunk)
            if reader.failure is None:
                self._end_delivered = reader.complete
                if self._end_delivered:
                    self._answered()
                return chunk
            self._steady = None
            return await self._delivering(chunk)
        try:
            return await self._next()
        except BaseException as exc:
            if is_cancellation(exc):  # the caller's (a deadline's or Guard.aclose's ends a read without one)
                self._read_cancelled = True
            raise

    async def _next(self) -> bytes:
        """Every chunk but the steady state's: the replayed prefix, a failure the last chunk carried,
        the end, reads without a watchdog (or after it tripped)."""
        if self._raise_next is not None:
            error, self._raise_next = self._raise_next, None
            raise error
        if self._ended:
            await self._end("abandoned", None)
            raise StopAsyncIteration
        reader = self._reader
        if self._pending:
            chunk = self._pending.popleft()
            self._end_delivered = not self._pending and reader.complete
            if not self._pending:
                await self._end_if_failed(reader)
            return chunk
        if reader.failure is not None and self._failure is None:  # carried by the chunk just delivered
            if await self._continued(reader.failure.cause):
                return await self.__anext__()
            if not reader.errors_are_events:
                await self._upstream_failed(reader.failure)
            self._failure = reader.failure  # an event the caller reads past, as the server goes on: noted
        if self._complete or self._rest is None:
            await self._end("ok" if self._complete else "abandoned", None)
            raise StopAsyncIteration
        if reader.complete:
            self._answered()
        watchdog = self._watchdog
        if watchdog is not None and watchdog.tripped is None:
            self._steady = watchdog
            return await self.__anext__()
        try:
            read = await self._read()
        except _READ_ERRORS as exc:
            return await self._read_ended(exc)  # inside the block: see `__anext__`
        if read is None:
            return await self._interrupted()
        reader.feed(read)
        if self._opening:
            self._opened(reader)
        return await self._delivering(read)

    def _answered(self) -> None:
        """The protocol's end marker was read: the answer is whole. What is left of the body (a usage event, ``[DONE]``,
        the end of a chunked body that a server or proxy holds open) is read as without a guard, under the caller's
        own read timeout: the tier's stall and total deadlines no longer end the call, which would turn a complete
        answer into a timeout."""
        self._steady = None
        self._stall = self._deadline = math.inf
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.close()
            if self._lease is not None:
                self._lease.cancellables.discard(watchdog)

    async def _read(self) -> bytes | None:
        """The next chunk of the live remainder when no watchdog watches it (`__anext__` reads under a
        watchdog itself); None if a deadline or ``Guard.aclose`` ended the read (``_stall_tripped`` says
        which deadline). EOF and transport errors propagate."""
        assert self._rest is not None
        if self._watchdog is not None:  # it tripped: the stream was interrupted
            self._stall_tripped = self._watchdog.tripped == "stall"
            return None
        # Without one (trio, HTTP/2, no socket): one cancel scope per read, on the loop's own time line.
        call = self._call
        lease = call.lease
        now = call.clock()
        if self._opening:
            self._caller_held += now - self._last_read
            self._deadline = min(call.first_token_deadline + self._caller_held, call.total_deadline)
        left = self._deadline - now
        self._stall_tripped = self._stall <= left
        scope = anyio.CancelScope(deadline=call.time.loop_deadline(now + min(self._stall, left)))
        if lease.aborted:
            scope.cancel()
        lease.cancellables.add(scope)
        try:
            with scope:
                return await self._rest.__anext__()
        except _READ_ERRORS:
            if lease.aborted:  # Guard.aclose() closed the connection between two reads: this EOF is its doing
                return None
            raise
        finally:
            lease.cancellables.discard(scope)
            ended = call.clock()
            if self._opening:  # not the time per token's: no token has come yet
                self._last_read = ended
            elif self._win is not None:  # see `__anext__`
                self._win.waited += ended - now
        return None

    async def _delivering(self, chunk: bytes) -> bytes:
        """A chunk just read and fed to the reader: handed over (with a continuation on, only up to
        a failure it carries; the failure itself is handled at the next read)."""
        reader = self._reader
        if reader.failure is not None and self._resume is not None:
            chunk = cut_before_failure(chunk)
            if not chunk:
                return await self.__anext__()
        self._end_delivered = reader.complete
        await self._end_if_failed(reader)
        return chunk

    async def _end_if_failed(self, reader: StreamReader) -> None:
        """The chunk about to be handed over carries a failure that ends the answer: end the call now, the
        error raised at the caller's next read. An SDK raises at the error event itself and may never read
        again (openai 1.x leaves such a stream open), which would leave the call open until collected. Not
        with a continuation (it decides at the next read) nor for errors the SDK reads past as events."""
        failure = reader.failure
        if failure is not None and self._failure is None and self._resume is None and not reader.errors_are_events:
            self._raise_next = await self._fail(failure)

    async def _read_ended(self, error: BaseException) -> bytes:
        """A read ended without a chunk: interrupted by the watchdog, EOF, or a transport error.
        With a continuation on, a break is handed to it; otherwise it ends the call."""
        watchdog = self._watchdog
        if watchdog is not None and watchdog.tripped is not None:  # the watchdog shut the socket
            self._stall_tripped = watchdog.tripped == "stall"
            return await self._interrupted()
        if isinstance(error, StopAsyncIteration):
            failure = self._reader.end_of_body()
            if failure is None or failure is self._failure:  # complete, or after an error the caller read
                self._complete = failure is None
                await self._end("ok" if failure is None else "error", None if failure is None else failure.cause)
                raise StopAsyncIteration
            if await self._continued(failure.cause):
                return await self.__anext__()
            await self._upstream_failed(failure)
        if self._failure is None and await self._continued(error_kind(error)):  # not after an error passed on
            return await self.__anext__()
        await self._end("error", error_kind(error))
        raise error

    async def _interrupted(self) -> bytes:
        """A read ended by a deadline (``_stall_tripped`` says which) or by ``Guard.aclose``."""
        call = self._call
        if call.lease.aborted:
            await self._end("error", GuardClosed.cause)
            raise GuardClosed(
                "the Guard was closed while this stream was being read; the connection was closed",
                request=call.request,
                record=call.record,
            )
        if self._opening and call.first_token_deadline + self._caller_held <= call.total_deadline:  # no first token
            timeout = ttft_timeout(call, "its opening was handed over as it came; the connection was closed")
            await self._end("timeout", timeout.cause)
            raise timeout
        error = self._timeout(self._stall_tripped)
        if self._stall_tripped and await self._continued(error.cause):
            return await self.__anext__()
        if not self._stall_tripped and self._resume is not None:
            call.record.not_continued_because("total_deadline")
        if not self._stall_tripped and self._given_up is not None and not call.record.stream:
            error.final = True  # the total deadline is the call's, across every attempt: nothing more is sent
            if not sent_once(call.streamed):  # a body sent once as it came is never taken for a retry
                self._given_up.remember(call.request, call.known_by, error, call.clock())
        await self._end("timeout", error.cause)
        raise error

    async def _continued(self, cause: str) -> bool:
        """Hand a break after the first token to the call's continuation; True if another replica took over (never
        after the end marker: the answer is whole)."""
        if self._resume is None or self._reader.complete:
            return False
        call = self._call
        resumed = await self._resume.resume(call, self._win, self._reader, cause)
        if resumed is None:
            return False
        call.deliver(resumed.win)
        self._pending.extend(resumed.chunks)
        self._rest, self._reader, self._win = resumed.rest, resumed.reader, resumed.win
        self._complete = False
        self._rewatch()
        return True

    def _rewatch(self) -> None:
        """After a continuation: watch the new response's socket, or fall back to a scope per read."""
        watchdog = self._watchdog
        if watchdog is not None and not watchdog.rebind(self._win.response):
            watchdog.close()
            self._call.lease.cancellables.discard(watchdog)
            self._watchdog = None

    async def _upstream_failed(self, failure: StreamFailure) -> NoReturn:
        """A failure after the first token: raised into the caller's iteration with the connection closed."""
        raise await self._fail(failure)

    async def _fail(self, failure: StreamFailure) -> GuardStreamError:
        """End the call with ``failure`` after the first token (its connection closed): the error to raise."""
        self._failure = failure
        call = self._call
        error = stream_error(
            failure, replica=self._win.state.name, request=call.request, record=call.record, after_first_token=True
        )
        await self._end("error", error.cause)
        return error

    def _timeout(self, stall_tripped: bool) -> GuardTimeout:
        if stall_tripped:
            return read_timeout(self._call, True, what="the stream", during="after the first token")
        return read_timeout(self._call, False, what="the stream", during="mid-stream")

    async def _end(self, status: CallStatus, cause: str | None) -> None:
        self._steady = None
        lease = self._lease
        if lease is None:  # closed
            return
        if status == "ok" and self._reader.facts.failed:  # an answer that failed, handed over as it came
            status, cause = "error", self._reader.facts.failed
        if self._ended:  # another task is closing it: wait until it is done
            await lease.aclose(status, cause)
            return
        self._ended = True
        self._gc.detach()
        if self._watchdog is not None:
            self._watchdog.close()
            lease.cancellables.discard(self._watchdog)
        await lease.aclose(status, cause)
        self._forget()

    def _forget(self) -> None:
        """After the end, let go of the call: its lease, records, winner, response and reader are freed
        at once. (httpx's response and its stream refer to each other, so the response the caller holds,
        and this body, are freed only by the garbage collector; the whole call would otherwise wait for
        it too, and make the collector run far more often.)"""
        self._pending.clear()
        self._lease = self._rest = self._resume = self._watchdog = None
        self._call = self._reader = self._win = None  # type: ignore[assignment]  # never read after the end

    async def aclose(self, *, cause: str | None = None) -> None:
        """Close the upstream connection (if still open) and finish the call's record: ``ok`` if the
        caller was handed the protocol's end marker (openai 2.x stops reading at ``[DONE]``), else
        ``cancelled`` (``cancelled_by_caller``) if the caller's read was cancelled, else ``abandoned``
        (``closed_by_caller``). ``cause``: why the sync edge that reads the body closed it (after cancelling its
        read): ``abandoned`` with it (``garbage_collected`` for a body its caller dropped unclosed)."""
        if self._ended:
            await self._end("abandoned", None)
            return
        failure = self._failure or self._reader.failure
        if failure is not None:
            await self._end("error", failure.cause)
        elif self._complete or (self._end_delivered and not self._pending):
            await self._end("ok", None)
        elif cause is None and self._read_cancelled:
            await self._end("cancelled", "cancelled_by_caller")
        else:
            await self._end("abandoned", cause or "closed_by_caller")
