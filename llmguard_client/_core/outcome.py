"""What the layers hand each other: a route in, an outcome out.

A layer is called with the `Call` and a `Route` (which replica, why, who pays, which replicas
to avoid, which body, until when) and returns an `Outcome`: a `Win` (an attempt produced its
first content token; its response now belongs to the call's lease) or `Failed` (every attempt
failed, or the guard stopped the call: ``reason``; ``stopped`` says why no further attempt was
sent). Layers hand each other values: none reads another layer's state off the `Call`.
"""

from __future__ import annotations

import errno
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import anyio
import httpx

from llmguard_client._budget.budget import BudgetTicket, RetryBudget
from llmguard_client._core.lease import CallLease, Hold
from llmguard_client._http.error_body import Unread
from llmguard_client._routing.replicas import ReplicaState
from llmguard_client.errors import GuardFailure
from llmguard_client.protocols import ResponseFacts, StreamFailure, StreamReader
from llmguard_client.protocols.errors import OVERLOAD_STATUSES
from llmguard_client.telemetry._record_builder import AttemptRecordBuilder
from llmguard_client.telemetry.record import AttemptKind

if sys.version_info < (3, 11):  # anyio brings the backport there
    from exceptiongroup import BaseExceptionGroup  # type: ignore[import-not-found, unused-ignore]


@dataclass(slots=True, eq=False)
class Payment:
    """The budget ticket paying for one extra attempt (``ticket`` None: the budget is unbounded)."""

    ticket: BudgetTicket | None = None
    hold: Hold | None = None
    paced: bool = False
    """A retry the server paced (`RetryBudget.try_acquire`): it may pass the budget's bound."""

    def settle(self) -> None:
        """The attempt reached its server (or failed trying): the ticket is spent for good."""
        if self.ticket is not None:
            self.ticket.settle()
        if self.hold is not None:
            self.hold.discharge()

    def refund(self) -> None:
        """The attempt was cut short before its request was written: it put no load on a server, and its
        ticket goes back to the budget now."""
        if self.hold is not None:
            self.hold.release()


Stop = Literal["no_replica", "budget", "deadline", "rounds", "not_retryable", "sdk"]
"""Why the retry layer sent no further attempt (`Failed.stopped`); ``"sdk"``: a retry is allowed, and the SDK
sends it (`RetryPolicy.mode` ``"cooperative"``)."""


class Race:
    """The first winner of a call's attempts, as soon as it is known: a value the deadline layer
    creates and holds, which a hedged round fills in. If the first-token deadline fires while the
    losers are being closed, the deadline layer still delivers the winner it holds."""

    __slots__ = ("winner",)

    def __init__(self) -> None:
        self.winner: Win | None = None


@dataclass(frozen=True, slots=True)
class Route:
    """Where the next attempt goes (None: the retry layer picks), why, what pays for it, and what the
    outer layers decided for it (a value each layer passes inward, never state on the `Call`)."""

    replica: ReplicaState | None = None
    kind: AttemptKind = "primary"
    payment: Payment | None = None
    resumes: tuple[int, int, str] | None = None
    """A continuation's starting point: characters and tokens already delivered, and the break's cause."""
    avoid: tuple[ReplicaState, ...] = ()
    """Replicas this route's attempts must not go to (a continuation: the broken and tried ones), and for a
    hedge, the replicas that already failed this call (retry passes them in)."""
    body: bytes | None = None
    """The request body to send (None: the caller's). A continuation's body asks for the rest of the answer."""
    budget: RetryBudget | None = None
    """Pays for every attempt of this route, the first included (a continuation's own budget); None: the
    call's budget pays for retries and hedges only."""
    deadline: float | None = None
    """Absolute time by which this route's first token must arrive (None: the call's first-token deadline)."""
    rounds: int | None = None
    """At most this many requests for this route, hedges included (None: the retry policy's ``max_attempts``)."""
    race: Race | None = None
    """Where a hedged round records its winner (the deadline layer's `Race`)."""
    spent: int = 0
    """Requests already sent for the call, counted among ``rounds``: by the route's earlier rounds (the retry layer
    sets it for each round, which its hedges read), or by the SDK's earlier requests when this is the SDK's retry of
    a request the guard handed back to it (`llmguard_client._core.given_up.HandedBack`, an `Episode`). The route's
    first round goes all the same."""
    earlier_failures: tuple[ReplicaState, ...] = ()
    """The replica of each failed attempt of the call's earlier requests (the SDK's, when this is its retry of a request
    the guard handed back: `Episode.failed`): the retry layer's wait before going back to a replica grows with the
    times it failed the call, these included. No replica to avoid: the route's hedges and admission may go there."""

    def next(
        self,
        replica: ReplicaState,
        kind: AttemptKind,
        payment: Payment | None,
        avoid: tuple[ReplicaState, ...],
        *,
        rounds: int | None = None,
        spent: int | None = None,
    ) -> Route:
        """This route's next attempt: on ``replica``, paid by ``payment``, avoiding ``avoid``; ``rounds`` and
        ``spent``, when given, replace the route's (the retry layer's count for a round and its hedges)."""
        return replace(
            self,
            replica=replica,
            kind=kind,
            payment=payment,
            avoid=avoid,
            rounds=self.rounds if rounds is None else rounds,
            spent=self.spent if spent is None else spent,
        )


@dataclass(slots=True, eq=False)
class Win:
    """An attempt's first content token (or complete body) arrived."""

    attempt: AttemptRecordBuilder
    state: ReplicaState
    response: httpx.Response
    chunks: list[bytes]
    """Bytes read so far: replayed to the caller first."""
    rest: AsyncIterator[bytes] | None
    """The unread remainder of the body; None when ``chunks`` hold all of it."""
    reader: StreamReader
    """Its protocol's reader, fed every chunk so far; the caller's body keeps feeding it."""
    in_flight: Hold
    """The replica's in-flight count, released when the call ends."""
    waited: float = 0.0
    """Seconds the caller's body spent waiting on ``rest`` for its chunks (the replica's pace after the first token:
    the time between the caller's reads is the caller's, not the replica's)."""

    @property
    def facts(self) -> ResponseFacts:
        return self.reader.facts


_NETWORK_ERRORS = (httpx.TransportError, ssl.SSLError, anyio.BrokenResourceError, anyio.EndOfStream)
"""Network failures of an attempt: retried elsewhere, and given up on as `AllAttemptsFailed` (any other
exception is the caller's or a bug: neither retried nor disguised)."""
_REQUEST_FAULTS = (httpx.LocalProtocolError, httpx.UnsupportedProtocol)
"""Transport errors that are the request's own (a header value with a newline, a body longer than its
``content-length``, a URL scheme no pool speaks): never the replica's failure, so neither retried by the guard
(the SDK retries them or not, as without a guard) nor counted toward the replica's circuit."""
_NEVER_SENT = (httpx.ConnectError, httpx.PoolTimeout)
"""No server saw the request: the replica refused the connection, or no connection of the caller's own pool
came free in the request's pool timeout."""
_LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EADDRNOTAVAIL})
"""A connection this process or host could not open for want of its own resources: file descriptors (EMFILE,
ENFILE), buffers or memory (ENOBUFS, ENOMEM), a local address or port (EADDRNOTAVAIL)."""
_REQUEST_TIMEOUT = 408
"""The server (or a load balancer in front of it) gave up waiting for the request: the replica's failure, as a 5xx."""


@dataclass(slots=True, eq=False)
class AttemptFailure:
    """An attempt that produced no usable answer; its connection is closed (but for an ``unread`` body's)."""

    attempt: AttemptRecordBuilder
    state: ReplicaState
    error: BaseException | None = None
    status_code: int | None = None
    headers: httpx.Headers = field(default_factory=httpx.Headers)
    body: bytes = b""
    retry_after: float | None = None
    extensions: dict[str, Any] = field(default_factory=dict)
    stream_failure: StreamFailure | None = None
    """Set when a 200 answer failed before its first token (then ``status_code`` is the status the
    failure stands for, if any, and ``body`` an equivalent JSON error)."""
    as_sent: tuple[int, httpx.Headers, bytes] | None = None
    """That 200 as it came (status, headers, the body up to its end or its error event), when its SDK reads the
    error event itself (the Responses API's ``error`` / ``response.failed``), or a stream's up to a transport error
    before its first token (``error``: a cut, a reset, the caller's own read timeout; `failed_reading`): what the
    caller gets if it is the call's last answer, as without a guard (no SDK retry either: a 200 is none to retry)."""
    unread: Unread | None = None
    """The rest of an error answer's body longer than ``body`` (`llmguard_client._http.error_body`), its
    response still open: read on by the caller if this is the call's last answer, else closed (`close_unread`)."""
    cut: bool = False
    """Its ``unread`` rest was closed (`close_unread`): ``body`` is only the answer's head."""
    torn: bool = False
    """Its body was cut short by the server, and its caller's SDK reads the body inside its request: kept as the
    answer only for its ``x-should-retry: false`` (which anthropic reads on such a cut); of its status and headers
    the guard learns nothing (no overload, Retry-After or rate limit): it counts as the dropped connection it is."""

    @property
    def overload(self) -> bool:
        """The replica said it is overloaded (429/503/529, or an in-stream overload error)."""
        if self.torn:
            return False
        if self.stream_failure is not None:
            return bool(self.stream_failure.overload)
        return self.status_code in OVERLOAD_STATUSES

    @property
    def injected(self) -> bool:
        """Chaos mode injected a fault into the attempt (`Chaos`): what it teaches stays in this process."""
        return bool(self.attempt.chaos)

    @property
    def replica_failed(self) -> bool:
        """The replica failed the request itself: a transport error (but a connection that failed here: `local`), a
        5xx, or a 408 (it timed out on the request, as a replica that answers nothing in time does). What counts toward
        its circuit and its failure rate, and what is retried, paced, past an empty budget (but for a failure
        `in_ok_answer`); an overload answer (429/503/529) is judged before it (it cools the replica), and other 4xx
        are the request's."""
        status = self.status_code or 0
        if isinstance(self.error, httpx.PoolTimeout):  # the caller's own pool was full: the replica never saw it
            return False
        if self.local:  # this process or host could not connect: nothing the replica did
            return False
        return self.torn or self.is_transport_error or status >= 500 or status == _REQUEST_TIMEOUT

    @property
    def is_transport_error(self) -> bool:
        """A network-level failure (as opposed to an error status or an unexpected exception): httpx's, or one of
        those its pool lets through unmapped (a TLS record error, a stream ended or broken under it)."""
        return isinstance(self.error, _NETWORK_ERRORS) and not isinstance(self.error, _REQUEST_FAULTS)

    @property
    def failed_reading(self) -> bool:
        """A transport error (a cut or reset, the caller's own read timeout) while a stream was read, after its 2xx
        headers, before its first token (`as_sent`): without a guard the SDK had returned the stream, and the error
        met its caller reading it, which no SDK retries."""
        return self.as_sent is not None and self.stream_failure is None and self.is_transport_error

    @property
    def in_ok_answer(self) -> bool:
        """The failure came inside a 2xx answer, before its first token: an error event, a truncated or malformed
        stream, a body that is an error object (`stream_failure`), or an error met reading a stream after its headers
        (`failed_reading`). Without a guard the SDK had that answer as a success, and no SDK retries one, whatever
        status or Retry-After the error inside it names."""
        return self.stream_failure is not None or self.failed_reading

    @property
    def refused(self) -> bool:
        """No server saw the request (`_NEVER_SENT`), so retrying it adds no load to any server (such retries
        are not charged to the budget)."""
        return isinstance(self.error, _NEVER_SENT)

    @property
    def recurs(self) -> bool:
        """Every request to this replica would fail the same way: its TLS certificate was refused (an unknown
        CA, another host's name), or the proxy in front of it asked for credentials (407). Another replica may
        still serve the call; resending to this one only delays the error."""
        if isinstance(self.error, httpx.ProxyError) and str(self.error).startswith("407"):
            return True  # httpcore names the proxy's status only in the message: "407 Proxy Authentication Required"
        return any(isinstance(e, ssl.SSLCertVerificationError) for e in _chain(self.error))

    @property
    def local(self) -> bool:
        """The connection failed here, not at the replica (`local_fault`): counted toward no circuit, failure rate or
        health, told to no fleet, and its retry waits as the plain SDK's would (`RetryLayer`)."""
        return local_fault(self.error)

    @property
    def is_connect_error(self) -> bool:
        """The request never reached the server, so resending it cannot duplicate work."""
        return isinstance(self.error, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))


def local_fault(error: BaseException | None) -> bool:
    """Whether ``error``, a failure to connect (``httpx.ConnectError``), came from this process or host rather than
    the replica: it ran out of file descriptors, buffers, memory or local ports (`_LOCAL_ERRNOS`), as the chain of
    causes under httpx's error says. A resolver's failure is the replica's name's (a name that does not exist, or
    whose servers fail: ``EAI_AGAIN`` is also what one host's broken zone gives), as before. Every address of a name
    tried at once (an exception group) is local when each of its errors is."""
    return isinstance(error, httpx.ConnectError) and _local_cause(error)


def _local_cause(error: BaseException) -> bool:
    for cause in _chain(error):
        if isinstance(cause, BaseExceptionGroup):
            return bool(cause.exceptions) and all(_local_cause(e) for e in cause.exceptions)
        if isinstance(cause, OSError) and not isinstance(cause, socket.gaierror) and cause.errno in _LOCAL_ERRNOS:
            return True
    return False


def _chain(error: BaseException | None) -> Iterator[BaseException]:
    """``error`` and the exceptions it was raised from (httpx wraps httpcore's, which wraps the socket's)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


@dataclass(slots=True, eq=False)
class Failed:
    """No winner: the attempts' failures (oldest first) and, if the guard chose to stop, why."""

    failures: list[AttemptFailure] = field(default_factory=list)
    reason: GuardFailure | None = None
    stopped: Stop | None = None
    """Why no further attempt was sent, when the retry layer decided it (see `Stop`)."""
    retry_in: float = 0.0
    """With ``stopped="sdk"``: the seconds the SDK should wait before its retry (backoff or Retry-After)."""
    paced: bool = False
    """With ``stopped="sdk"``: that retry is paced by the server's Retry-After (`Payment.paced`)."""
    used_up: bool = False
    """The route sent every request it may (`Route.rounds`, its earlier requests counted: `Route.spent`)."""

    @property
    def last(self) -> AttemptFailure | None:
        """The failure the caller gets: the last one, or the last server answer (kept whole) when every attempt
        after it had its connection refused (`httpx.ConnectError`; not a timeout, which stays a timeout) by replicas
        that never answered the call: with another replica down, the caller gets what a server said, as the plain
        SDK on that replica would, not a connection error that no server made. A replica that answered and then
        refused (a restart) is down as far as the call knows: its refusal stands."""
        if not self.failures:
            return None
        answered = {id(f.state) for f in self.failures if f.status_code is not None}
        for failure in reversed(self.failures):
            if isinstance(failure.error, httpx.ConnectError) and id(failure.state) not in answered:
                continue  # a replica that never answered refused the connection
            if failure is self.failures[-1] or (failure.status_code is not None and not failure.cut):
                return failure
            break
        return self.failures[-1]


Outcome = Win | Failed


async def close_unread(lease: CallLease, failures: Iterable[AttemptFailure]) -> None:
    """Close the open responses of ``failures`` whose error bodies will not be handed on (retried, or another
    attempt won): the server sees the disconnect now, not when the call ends."""
    for failure in failures:
        unread, failure.unread = failure.unread, None
        if unread is not None:
            failure.cut = True
            await lease.close_response(unread.response)
