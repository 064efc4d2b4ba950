"""The per-call context every layer sees: the request to replay, the tier, the deadlines,
the lease that owns what the call acquires, and the phase record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from llmguard_client._budget.budget import RetryBudget
from llmguard_client._core.caller_intent import RETRY_COUNT_HEADER, with_retry_count
from llmguard_client._core.clock import Clock, TimeSource
from llmguard_client._core.lease import CallLease, Phase
from llmguard_client._core.redact import CREDENTIALS, credential_key
from llmguard_client._core.request import NO_MEDIA, PromptMedia
from llmguard_client._http.upload import framing_headers
from llmguard_client._routing.caller import limit_scope
from llmguard_client._routing.replicas import ReplicaState
from llmguard_client._routing.ttft_stats import TTFTStats, size_class
from llmguard_client.config import Tier
from llmguard_client.telemetry._record_builder import AttemptRecordBuilder, CallRecordBuilder
from llmguard_client.telemetry.hooks import CallObservation

if TYPE_CHECKING:
    from llmguard_client._core.outcome import Payment, Win

__all__ = ["Call"]

_BODY_METHODS = ("POST", "PUT", "PATCH")
"""Methods httpx sends ``Content-Length: 0`` for when the body is empty."""


@dataclass(slots=True, eq=False)
class Call:
    """One logical call: the caller's request and everything the layers decide about it."""

    request: httpx.Request
    body: bytes
    headers: list[tuple[bytes, bytes]]
    """The caller's headers each attempt forwards (`llmguard_client._core.headers.CallerHeaders.forwarded`)."""
    tier_name: str
    tier: Tier
    respond_with_errors: bool
    record: CallRecordBuilder
    """The call's record as it is built (telemetry writes it; the caller gets frozen copies)."""
    observation: CallObservation
    lease: CallLease
    clock: Clock
    """The Guard's clock, bound for this call (``time.now``): every deadline below is on it."""
    time: TimeSource
    """The call's time source (`llmguard_client._core.clock`): its loop's time line, timers and tasks."""
    first_token_deadline: float
    """Absolute time (on ``clock``) by which the first content token must arrive."""
    total_deadline: float
    """Absolute time by which the whole response must have arrived."""
    pool_wait: float
    """The longest the guard holds an attempt before sending it (for a rate limit's room, a cooling replica's
    probe, an admission line, a bulkhead slot): the caller's pool timeout, as httpx bounds a request's wait for
    a free connection (inf: none). It bounds those waits in a tier without a first-token deadline too."""
    hedgeable: bool
    retry_any_status: bool
    generation: bool = True
    """A call on a generation path (chat, completions, responses...): only its answers' statuses say how the
    replica serves generation calls (cool-downs, circuit); another API's (files, models, embeddings) do not."""
    host: bytes | None = None
    """The ``Host`` the caller set itself (`CallerHeaders.host`; None: each attempt sends its replica's)."""
    signed: frozenset[bytes] = frozenset()
    """The headers the client signed (and those carrying its signature): each attempt forwards them exactly as they
    came, over a replica's own headers and the guard's (`llmguard_client._http.signed`)."""
    signed_url: bool = False
    """The client signed the request's URL (its host and path): each attempt sends it to that URL as it is (the
    routing only offers replicas on its origin that would: `llmguard_client._routing.reach.own`)."""
    replica_bases: tuple[httpx.URL, ...] = ()
    """Every replica's base URL, to recognise a request already aimed at one of them."""
    outside: tuple[ReplicaState, ...] = ()
    """Replicas this request must not go to: its URL means nothing there, or its state lives on another
    (`llmguard_client._routing.reach`). Every route of the call avoids them."""
    beside: bool = False
    """Its URL is on a replica's origin but outside every replica's base path (another Azure deployment, the
    resource's own APIs: `llmguard_client._routing.reach.beside`): it speaks for that deployment only."""
    budget: RetryBudget | None = None
    """The budget this call's retries and hedges are paid from (its tier's, or the Guard's)."""
    ttft_stats: TTFTStats | None = None
    """The recent time-to-first-token of the call's class (`fits_deadline` reads its median)."""
    delivered: Win | None = None
    """The attempt whose stream the caller reads (set by `deliver` only; the end of the call reports it)."""
    affinity_key: str | None = None
    """The call's cache-affinity key (None: unkeyed, or affinity off): its attempts prefer the key's replicas."""
    sdk_retries: bool = False
    """The caller's SDK sends this call's retries (`RetryPolicy.mode` "cooperative" and a Stainless-built SDK
    calling): one attempt round per request, a retry the guard allows is handed back to the SDK."""
    keeps_text: bool = False
    """A continuation may resume this call (its tier's `ContinuationPolicy` is on and the request qualifies):
    its attempts' readers keep the text they deliver, which a continuation resumes from."""
    max_attempts: int | None = None
    """The most attempts (``x-llmguard-max-attempts``, else the tier's; None: the retry policy's)."""
    streamed: httpx.AsyncByteStream | None = None
    """The caller's body when the guard sends it as it is read (`llmguard_client._http.upload`; ``body`` is then
    empty): an iterator's, sent as it comes on the call's one attempt, or a `ReplayableBody`, read again for
    each attempt."""
    opening_live: bool = False
    """Its stream is handed to the caller at its headers, the events before the first token (its opening) as they
    come, under the first-token deadline: no other attempt can follow this one's answer, so there is nothing to
    decide on it (`llmguard_client._stream.body`). A background job's (`RequestFacts.background`)."""
    prompt_chars: int | None = None
    """Characters of the prompt's text in the body (None: no prompt field found, or no body read)."""
    media: PromptMedia = NO_MEDIA
    """The media parts (images, audio, files) the body's prompt sends."""
    choices: int = 1
    """The choices the request asks for (its ``n``): a streamed answer is complete when that many have finished."""
    ttft_size: int = field(init=False)
    """The class of its prompt's size its first tokens are judged in (`llmguard_client._routing.ttft_stats`)."""
    scope: str | None = field(init=False)
    """The rate limit it draws on (`limit_scope` of its key and account headers): a 429 it gets cools its replicas
    for that scope's calls only (None: for every call, a signed request's)."""
    judges: bool = field(init=False)
    """Whether the call's answers speak for its replicas' generation calls, and their cool-downs and circuits for
    it: a generation call under a replica's base path. Another API's call (files, embeddings) or one `beside` the
    replicas' paths (another deployment) neither waits for a replica's cool-down nor feeds it."""

    def __post_init__(self) -> None:
        self.ttft_size = size_class(self.prompt_size())
        self.judges = self.generation and not self.beside
        self.scope = limit_scope(self.request.headers, bool(self.signed) or self.signed_url)

    @property
    def known_by(self) -> bytes | None:
        """The body the given-up memory knows this call by (`llmguard_client._core.given_up`): ``body``, or None
        for one the guard sends as it is read (known by its URL, caller and content type instead)."""
        return self.body if self.streamed is None else None

    def phase_until(self, deadline: float) -> Phase:
        """A wait of this call that ends at ``deadline`` (on ``clock``) or when the Guard closes
        (`CallLease.phase`)."""
        return self.lease.phase(self.time.loop_deadline(deadline))

    def deliver(self, win: Win) -> None:
        """``win``'s stream is the one the caller reads from now on (its first token, or a continuation's)."""
        self.delivered = win

    def prompt_size(self) -> int:
        """Characters of the prompt (the body's length where no prompt field was found)."""
        return len(self.body) if self.prompt_chars is None else self.prompt_chars

    def expected_ttft(self) -> float:
        """About how long a fresh attempt of this call needs for its first token: the median TTFT of the
        median healthy replica for the call's tier, kind and prompt size (0 while unknown)."""
        stats = self.ttft_stats
        return 0.0 if stats is None else stats.typical(self.tier_name, self.record.stream, self.ttft_size)

    def slow_ttft(self) -> float:
        """How long a fresh attempt of this call needs for its first token on all but its slowest tries: the
        p95 (``HedgePolicy.quantile``) TTFT of the median healthy replica for its tier, kind and prompt size (0
        while unknown)."""
        stats = self.ttft_stats
        return 0.0 if stats is None else stats.high(self.tier_name, self.record.stream, self.ttft_size)

    def pay_extra(self, budget: RetryBudget | None = None, paced: bool = False) -> Payment | None:
        """A payment for one extra attempt (retry, hedge, continuation) from ``budget`` (default: the
        call's), held by the lease until the attempt is sent; None when the budget refuses (never for a
        ``paced`` retry: `RetryBudget.try_acquire`). The one place an attempt is paid for."""
        from llmguard_client._core.outcome import Payment

        budget = budget if budget is not None else self.budget
        if budget is None:
            return Payment(paced=paced)
        ticket = budget.try_acquire(paced)
        if ticket is None:
            self.observation.budget_refused(self.record)
            return None
        return Payment(ticket, self.lease.hold(ticket.refund), paced)

    def attempt_request(
        self, state: ReplicaState, attempt: AttemptRecordBuilder, body: bytes | None = None
    ) -> httpx.Request:
        """The caller's request re-aimed at one replica, with that replica's own headers (and ``body``
        instead of the caller's, for a continuation)."""
        signed = self.signed
        url = self.request.url if self.signed_url else state.target_for(self.request.url, self.replica_bases)
        own = state.header_items
        if own and signed:  # a signed header is sent as signed, never replaced by the replica's
            own = [(k, v) for k, v in own if k.lower() not in signed]
        if own:
            names = state.header_names - signed if signed else state.header_names
            forwarded = [(k, v) for k, v in self.headers if k.lower() not in names]
            if state.replaces_credential:  # and the caller's others carrying the same key, or another's (`CREDENTIALS`)
                keys = {credential_key(v) for k, v in self.headers if k.lower() in names and k.lower() in CREDENTIALS}
                keys |= state.foreign_keys
                forwarded = [
                    (k, v)
                    for k, v in forwarded
                    if k.lower() not in CREDENTIALS or credential_key(v) not in keys or k.lower() in signed
                ]
            forwarded += own
        else:
            forwarded = self.headers
        if attempt.index and RETRY_COUNT_HEADER not in signed:  # the SDK's retry count, as if it had sent it itself
            forwarded = with_retry_count(forwarded, attempt.index)
        # Host and Content-Length given up front with the body as a ready stream: httpx then skips
        # re-encoding the body and rebuilding the headers (a quarter of the cost, same bytes on the wire).
        host = self.host or url.netloc if self.signed_url else state.host or self.host or url.netloc
        headers = [(b"Host", host), *forwarded]  # the replica's own Host wins, unless the client signed its own
        streamed = self.streamed if body is None else None
        if body is None:
            body = self.body
        if streamed is not None:
            headers += framing_headers(self.request)
        elif body or self.request.method in _BODY_METHODS:
            headers.append((b"Content-Length", str(len(body)).encode()))
        request = httpx.Request(
            self.request.method,
            url,
            headers=headers,
            stream=streamed if streamed is not None else httpx.ByteStream(body),
            extensions=dict(self.request.extensions),
        )
        if streamed is None:
            request.read()
        plain: dict[str, str] = {}
        self.observation.attempt_started(attempt, state.url_text(url), plain)
        for key, value in plain.items():
            if (
                not signed or key.lower().encode("latin-1") not in signed
            ):  # the guard's own (traceparent), unless the client signed it
                request.headers[key] = value
        return request
