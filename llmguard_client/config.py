"""Configuration values: frozen, slotted, validated when built.

A bad value raises `GuardConfigError` naming the field, the value and what is
accepted, at construction time, never in the middle of a call.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import httpx

from llmguard_client._core.redact import CREDENTIALS, mask_url_secrets, redact_headers, redact_url
from llmguard_client._http.urlpath import names_endpoint
from llmguard_client.errors import GuardConfigError, UnknownTierError

FailureMode = Literal["auto", "response", "raise"]
"""How a guard failure reaches the caller: ``response`` (a proxy-style HTTP error response carrying
``x-should-retry: false``), ``raise`` (a typed httpx exception), or ``auto`` (``response`` when the request
carries the openai SDK's ``x-stainless-*`` headers, ``raise`` otherwise)."""


MAX_ATTEMPTS = 10
"""The most attempts one call may be allowed (`RetryPolicy`, `Tier`, ``x-llmguard-max-attempts``)."""

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP header name (RFC 9110 token)."""


def _check_bool(owner: str, name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise GuardConfigError(f"{owner}.{name} must be True or False, got {value!r}")


_FRAMING = {
    "content-length": "the guard frames each request's body itself, from the body it sends",
    "transfer-encoding": "the guard frames each request's body itself, from the body it sends",
    "connection": "a hop-by-hop header: the connection pool manages its connections itself",
    "keep-alive": "a hop-by-hop header: the connection pool manages its connections itself",
    "proxy-connection": "a hop-by-hop header: the connection pool manages its connections itself",
    "te": "a hop-by-hop header: the connection pool manages its connections itself",
    "upgrade": "a hop-by-hop header: a request through the guard cannot switch protocols",
}
"""Headers a `Replica` may not set (lowercase), and why: each would contradict the request's framing or the pool's
connection handling, failing every call to that replica or misframing its requests."""


def _check_header(name: str, value: str) -> None:
    """One `Replica` header: a name every HTTP/1.1 server takes and the request's framing leaves free, a value that
    cannot end the line early (and is not empty for a credential, an unset environment variable's, nor for
    ``Host``)."""
    if not _TOKEN.fullmatch(name):
        raise GuardConfigError(
            f"Replica.headers name {name!r} is not a valid HTTP header name: use letters, digits and "
            "!#$%&'*+-.^_`|~ only (no spaces or colons), e.g. 'authorization'"
        )
    why = _FRAMING.get(name.lower())
    if why is not None:
        raise GuardConfigError(f"Replica.headers[{name!r}] cannot be set per replica: {why}; leave it out")
    if not value and name.lower() == "host":
        raise GuardConfigError(
            f"Replica.headers[{name!r}] is empty: give the host (and port) the replica's server or ingress expects, "
            "or leave the header out to send the replica URL's"
        )
    if not value and name.lower().encode("latin-1", "replace") in CREDENTIALS:
        raise GuardConfigError(
            f"Replica.headers[{name!r}] is empty: it would replace the caller's credential (an SDK's good API key) "
            "with nothing. Give a non-empty value (the endpoint's own key), or leave the header out to send the "
            "caller's"
        )
    bad = next((c for c in value if c in "\r\n\x00"), None)
    if bad is not None:
        raise GuardConfigError(
            f"Replica.headers[{name!r}] must be a value without CR, LF or NUL (they would end the header early), "
            f"got one with {bad!r}"
        )
    if value != value.strip(" \t"):
        raise GuardConfigError(
            f"Replica.headers[{name!r}] must not start or end with a space or tab (HTTP/1.1 refuses it)"
        )
    try:
        value.encode("latin-1")
    except UnicodeEncodeError as exc:
        raise GuardConfigError(
            f"Replica.headers[{name!r}] must be latin-1 text (ASCII in practice), got one with {value[exc.start]!r}"
        ) from None


def _int_at_least(owner: str, name: str, value: object, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        accepted = f"an integer from {low} to {high}" if high is not None else f"an integer >= {low}"
        raise GuardConfigError(f"{owner}.{name} must be {accepted}, got {value!r}")


def _positive(
    owner: str,
    name: str,
    value: float | None,
    *,
    allow_none: bool = False,
    allow_zero: bool = False,
    allow_inf: bool = False,
) -> None:
    if value is None and allow_none:
        return
    if (
        value is None
        or isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
        or (math.isinf(value) and not (allow_inf and value > 0))
        or value < 0
        or (value == 0 and not allow_zero)
    ):
        accepted = "a positive finite number of seconds" + (" or None" if allow_none else "")
        if allow_inf:
            accepted = "a positive number of seconds or math.inf (no deadline)"
        if allow_zero:
            accepted = "0 (off) or " + accepted
        raise GuardConfigError(f"{owner}.{name} must be {accepted}, got {value!r}")


def deadline_text(seconds: float) -> str:
    """A deadline for a message: ``"2.0s"``, or ``"no deadline"`` for ``math.inf``."""
    return f"{seconds}s" if math.isfinite(seconds) else "no deadline"


@dataclass(frozen=True, slots=True)
class Tier:
    """Deadlines of one SLO tier, in seconds.

    ttft:  from the call's start to the first content token, across every attempt,
           backoff and hedge (for a non-streaming call: to the complete response); ``math.inf``: none.
    total: from the call's start to the last byte of the response; ``math.inf``: none.
    stall: the longest silence between two chunks after the first token, at most ``total``
           (None: no limit besides ``total``).
    Without a ttft or total deadline, the caller's read timeout still bounds each read, as without a guard.
    max_attempts: the most requests one call of this tier sends, retries and hedges included (None: the
           `RetryPolicy`'s ``max_attempts``); a call's ``x-llmguard-max-attempts`` header wins.
    """

    ttft: float
    total: float
    stall: float | None = None
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        _positive("Tier", "ttft", self.ttft, allow_inf=True)
        _positive("Tier", "total", self.total, allow_inf=True)
        _positive("Tier", "stall", self.stall, allow_none=True)
        if self.max_attempts is not None:
            _int_at_least("Tier", "max_attempts", self.max_attempts, 1, MAX_ATTEMPTS)
        if self.ttft > self.total:
            raise GuardConfigError(
                f"Tier.ttft ({self.ttft}) must not exceed Tier.total ({self.total}): "
                "the first token has to arrive within the whole call's deadline"
            )
        if self.stall is not None and self.stall > self.total:
            raise GuardConfigError(
                f"Tier.stall ({self.stall}) must not exceed Tier.total ({self.total}): the whole call's deadline "
                "ends any silence first (None: no stall limit besides total)"
            )


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A provider's rate limit (per API key, across every caller): admission counts requests and tokens.

    requests_per_minute / tokens_per_minute: the provider's limits (None: that one is not limited; at least
        one must be given). Each is a token bucket refilled at limit / 60 per second.
    burst: seconds of refill the bucket holds when full (its capacity is ``limit x burst / 60``). Providers
        enforce a minute's limit over shorter periods too; a small burst keeps a fleet from spending a
        minute's tokens in one second. A call larger than the capacity is admitted when the bucket is full.

    A call is charged before it is sent (1 request, and its prompt estimate + ``max_tokens`` tokens: an image,
    audio clip or file in the prompt counts a fixed allowance, not its bytes) and corrected from the ``usage`` it
    reports; the provider's rate-limit headers (OpenAI's ``x-ratelimit-remaining-*``, Anthropic's
    ``anthropic-ratelimit-*``, ``x-ratelimit-remaining``) lower the bucket when the provider says it has less room.
    A call that does not fit waits for its share if its p95 TTFT still fits its tier's ttft after it, or fails at
    once with `RateLimited` (``retry_after``: missing / refill rate). Calls are admitted in arrival order: small
    calls wait behind a large one waiting for room.
    """

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    burst: float = 1.0

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf
            ):
                raise GuardConfigError(f"RateLimit.{name} must be a positive finite number or None, got {value!r}")
        if self.requests_per_minute is None and self.tokens_per_minute is None:
            raise GuardConfigError(
                "RateLimit needs requests_per_minute or tokens_per_minute (or both), "
                "e.g. RateLimit(requests_per_minute=500, tokens_per_minute=200_000)"
            )
        _positive("RateLimit", "burst", self.burst)


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica's base URL, headers sent only to it (e.g. its own API key), and its own provider
    `RateLimit` when it has one (e.g. a separate API key).

    A ``Host`` among the headers is sent instead of the URL's host and port (an ingress reached by IP that routes
    on it); the framing and hop-by-hop headers (``Content-Length``, ``Transfer-Encoding``, ``Connection``...) are
    refused. A ``user:password@`` in the URL is the replica's credential, sent as ``Authorization: Basic ...`` as if
    given in ``headers`` (so not beside an ``Authorization`` header). Header values and the URL's userinfo are never
    logged nor put in records or telemetry.
    """

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    rate_limit: RateLimit | None = None

    def __post_init__(self) -> None:
        shown = mask_url_secrets(repr(self.url))  # the URL as given, its credentials masked, for the errors below
        if not isinstance(self.url, str) or not self.url:
            raise GuardConfigError(f"Replica.url must be a non-empty 'http(s)://host[:port][/prefix]' URL, got {shown}")
        if any(c.isspace() for c in self.url):
            raise GuardConfigError(f"Replica.url must not contain whitespace (spaces, tabs, newlines), got {shown}")
        try:
            parsed = httpx.URL(self.url)
        except Exception as exc:
            raise GuardConfigError(f"Replica.url {shown} is not a valid URL: {mask_url_secrets(str(exc))}") from exc
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise GuardConfigError(f"Replica.url must be an absolute http:// or https:// URL with a host, got {shown}")
        if parsed.query or parsed.fragment:
            raise GuardConfigError(
                f"Replica.url must not carry a query or fragment, got {shown}: each request keeps the query "
                "its client gives it (e.g. Azure's api-version, which AzureOpenAI adds), so give the URL without it"
            )
        if parsed.port is not None and not 0 < parsed.port < 65536:
            raise GuardConfigError(f"Replica.url port must be from 1 to 65535, got {parsed.port} in {shown}")
        if not isinstance(self.headers, Mapping):
            raise GuardConfigError(
                "Replica.headers must be a mapping (a dict) of header names to string values, e.g. "
                f"{{'authorization': 'Bearer ...'}} (leave it out for none), got {type(self.headers).__name__}"
            )
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.headers.items()):
            raise GuardConfigError(
                f"Replica.headers must map header names to string values (e.g. {{'authorization': 'Bearer ...'}}), "
                f"got a {type(self.headers).__name__} with keys {sorted(map(str, self.headers))}"
            )
        for name, value in self.headers.items():
            _check_header(name, value)
        if parsed.userinfo:
            named = next((name for name in self.headers if name.lower() == "authorization"), None)
            if named is not None:
                raise GuardConfigError(
                    f"Replica.url {redact_url(self.url)!r} carries a user:password (sent to the replica as its "
                    f"'Authorization: Basic ...') and Replica.headers sets {named!r} too: give the replica's "
                    "credential once, in the URL or in the header"
                )
        object.__setattr__(self, "headers", dict(self.headers))
        if self.rate_limit is not None and not isinstance(self.rate_limit, RateLimit):
            raise GuardConfigError(f"Replica.rate_limit must be a RateLimit or None, got {self.rate_limit!r}")

    @property
    def name(self) -> str:
        """The replica's URL without credentials: safe to log."""
        return replica_name(self.url)

    def __repr__(self) -> str:
        """Credentials masked: reprs end up in logs and tracebacks."""
        limit = f", rate_limit={self.rate_limit!r}" if self.rate_limit is not None else ""
        return f"Replica(url={redact_url(self.url)!r}, headers={redact_headers(self.headers)!r}{limit})"

    def __hash__(self) -> int:
        """Hashable like the other frozen configs (a set member, a dict key): the headers, a dict kept
        private to the instance, are hashed by their items."""
        return hash((self.url, frozenset(self.headers.items()), self.rate_limit))


def replica_name(url: str) -> str:
    """The name of the replica at base URL ``url`` (`Replica.name`): without credentials, its scheme and host in
    lower case, without a default port or a trailing slash."""
    return str(httpx.URL(url).copy_with(username=None, password=None)).rstrip("/")


@dataclass(frozen=True, slots=True)
class HedgePolicy:
    """When and how often to send the same call to another replica.

    delay:         fixed seconds before a hedge, or None for adaptive: the ``quantile`` of
                   recent time-to-first-token of the call's tier, clamped to
                   [``min_delay``, ``max_delay``], ``warmup_delay`` until ``min_samples``.
                   ``max_delay`` caps a heavy tail (calls typically 0.3 s, a few stalled 10 s: hedged
                   at 2 s), but the cap and the warm-up delay (once 3 samples are in) are never below
                   twice the typical (median) TTFT: calls that all take 3 s (a reasoning model
                   thinking) are hedged at their p95, not each at 2 s by a hedge that needs 3 s too.
    max_hedges:    extra attempts per round at most; with the retries, within the call's ``max_attempts`` requests.
    on_failure:    a failed attempt before the first token sends the hedge at once.
    paths:         path suffixes hedged by default (idempotent-safe generation calls; a
                   Responses API call with ``store: true`` stores the loser's response too);
                   ``hedge_all_paths=True`` hedges every path.
    non_streaming: hedge calls that ask for no stream too (off by default). Such an answer comes
                   whole, so a hedge races a whole generation and the loser's is wasted, and the
                   delay learned from those calls' durations measures mostly their answers' length:
                   the longest answers are hedged, for nothing, until the budget is spent, and a
                   straggler only once it is longer than those (``python -m benchmarks.non_streaming_hedges``).
    """

    delay: float | None = None
    quantile: float = 0.95
    min_delay: float = 0.05
    max_delay: float = 2.0
    warmup_delay: float = 0.5
    min_samples: int = 20
    max_hedges: int = 1
    on_failure: bool = True
    paths: tuple[str, ...] = ("/chat/completions", "/completions", "/responses", "/messages")
    hedge_all_paths: bool = False
    non_streaming: bool = False

    def __post_init__(self) -> None:
        for name in ("on_failure", "hedge_all_paths", "non_streaming"):
            _check_bool("HedgePolicy", name, getattr(self, name))
        paths = self.paths
        if isinstance(paths, (str, bytes)) or not isinstance(paths, (tuple, list, frozenset, set)):
            raise GuardConfigError(
                f"HedgePolicy.paths must be a tuple of path suffixes, e.g. ('/chat/completions',), got {paths!r}"
            )
        if not all(isinstance(p, str) and p for p in paths):
            raise GuardConfigError(f"HedgePolicy.paths must hold non-empty path suffixes (str), got {paths!r}")
        object.__setattr__(self, "paths", tuple(paths))
        _positive("HedgePolicy", "delay", self.delay, allow_none=True)
        _positive("HedgePolicy", "min_delay", self.min_delay)
        _positive("HedgePolicy", "max_delay", self.max_delay)
        _positive("HedgePolicy", "warmup_delay", self.warmup_delay)
        if self.min_delay > self.max_delay:
            raise GuardConfigError(
                f"HedgePolicy.min_delay ({self.min_delay}) must not exceed max_delay ({self.max_delay})"
            )
        if isinstance(self.quantile, bool) or not isinstance(self.quantile, (int, float)) or not 0 < self.quantile < 1:
            raise GuardConfigError(f"HedgePolicy.quantile must be in (0, 1), e.g. 0.95; got {self.quantile!r}")
        _int_at_least("HedgePolicy", "min_samples", self.min_samples, 1)
        _int_at_least("HedgePolicy", "max_hedges", self.max_hedges, 1, 4)

    def applies_to(self, path: str) -> bool:
        return self.hedge_all_paths or names_endpoint(path, self.paths)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Which failures are retried, how often, and how long to back off.

    Backoff is exponential with full jitter (uniform in [0, min(``backoff_max``,
    ``backoff_initial`` x 2^(round-1))]); a server's Retry-After replaces it
    for the replica that sent it. A retry happens only before the first
    token reached the caller, only if the shared budget allows (a retry the plain SDK would send goes paced past it:
    back to the replica that sent a Retry-After or a 429 once that wait or its cool-down is over, or after the
    same-replica backoff to a ready replica after a failure: `BudgetPolicy`), and only if it fits the tier deadline.

    ``same_replica_backoff``: the least backoff before a retry goes back to a replica that already failed the
    call (no other replica is ready: one hosted endpoint, or every replica tried): uniform in [3/4, 1] x
    ``same_replica_backoff`` x 2^(times it failed the call - 1), at most ``backoff_max`` (a positive Retry-After in
    that replica's last answer replaces it, as it replaces the SDKs' backoff): 0.5 s and this draw are
    the openai and anthropic SDKs' own, so a replica that fails for a moment (a restart, a gateway's blip) is
    tried again once it may have recovered, as the plain SDK would; 0 retries it after the ordinary backoff.
    A failure to connect sends the retry at once to a ready replica the call has not tried (one or two replicas
    down cost the call nothing while another is ready). When none is left untried and the retry goes back to a
    replica after two refused the call, or when the connection failed in this process (out of file descriptors,
    buffers, memory or local ports: EMFILE, ENFILE, ENOBUFS, ENOMEM, EADDRNOTAVAIL), the retry goes no sooner than
    the plain SDK's would: it waits this backoff for its round (0.375-0.5 s, then 0.75-1 s), plus that of each
    earlier retry that went at once to another replica after a failure to connect, so a short outage of every
    replica (with attempts to spare: two replicas, or ``max_attempts`` above the replicas), or of this process, is
    ridden out as through the plain SDK. A connection that failed in this process counts toward no replica's
    circuit or failure rate and is never told to a fleet; a resolver's failure is the replica's name's and counts.

    ``overload_cooldown``: seconds a replica that signalled overload without a Retry-After
    (a 429/503/529 without the header, or an in-stream error such as vLLM's ``code: 503``
    or Anthropic's ``overloaded_error``) is ranked after ready replicas and not retried.

    ``max_retry_after``: the longest Retry-After the guard waits (120 s, the longest the current openai SDK
    honours). A longer one (a daily quota's 86400) cools the replica for this long only, and the call that got
    it is not sent there again: another replica may serve it, else the server's answer is handed back at once,
    marked final (``x-should-retry: false``), and while that replica is the only one left, calls are refused
    before they are sent until its cool-down's probe.

    ``panic_threshold``: the share of replicas that must be healthy (circuit closed, not degraded) for
    health to exclude any (Envoy's panic threshold): below it, replicas with an open circuit still take
    calls, ranked after the others, so a guard with one replica never stops sending to it.

    ``mode``: ``"guard"`` (default): the guard sends the retries itself, below the SDK.
    ``"cooperative"``: for calls from an SDK that retries (openai, anthropic: ``x-stainless-*`` headers;
    other callers keep the default), one attempt round per SDK request (hedges included), and the SDK sends the
    retries the guard allows: the guard decides (budget, Retry-After, deadline, attempts) and says so
    with ``x-should-retry`` and ``retry-after-ms`` on the failure it returns; the SDK's next request of
    the same call keeps its deadlines, its attempts and the replicas it must avoid. The SDK's ``max_retries``
    then sets how many requests a call gets: ``max_attempts`` here does not cap them (it still does for other
    callers), a tier's ``max_attempts`` or the call's ``x-llmguard-max-attempts`` does, and each retry is
    paid from the budget; 10 requests at most.
    """

    max_attempts: int = 3
    backoff_initial: float = 0.05
    backoff_max: float = 2.0
    retry_statuses: frozenset[int] = frozenset({408, 429, 500, 502, 503, 504})
    circuit_failures: int = 5
    circuit_cooldown: float = 5.0
    overload_cooldown: float = 1.0
    max_retry_after: float = 120.0
    panic_threshold: float = 0.5
    mode: Literal["guard", "cooperative"] = "guard"
    same_replica_backoff: float = 0.5

    def __post_init__(self) -> None:
        if self.mode not in ("guard", "cooperative"):
            raise GuardConfigError(f"RetryPolicy.mode must be 'guard' or 'cooperative', got {self.mode!r}")
        _int_at_least("RetryPolicy", "max_attempts", self.max_attempts, 1, MAX_ATTEMPTS)
        _positive("RetryPolicy", "overload_cooldown", self.overload_cooldown)
        _positive("RetryPolicy", "max_retry_after", self.max_retry_after)
        share = self.panic_threshold
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
            raise GuardConfigError(
                f"RetryPolicy.panic_threshold must be a share of replicas from 0 to 1 (0: never panic), got {share!r}"
            )
        _positive("RetryPolicy", "backoff_initial", self.backoff_initial)
        _positive("RetryPolicy", "backoff_max", self.backoff_max)
        _positive("RetryPolicy", "same_replica_backoff", self.same_replica_backoff, allow_zero=True)
        if self.backoff_max < self.backoff_initial:
            raise GuardConfigError(
                f"RetryPolicy.backoff_max ({self.backoff_max}) must not be below backoff_initial "
                f"({self.backoff_initial}): it caps the backoff, which starts at backoff_initial and doubles"
            )
        _positive("RetryPolicy", "circuit_cooldown", self.circuit_cooldown)
        _int_at_least("RetryPolicy", "circuit_failures", self.circuit_failures, 1)
        statuses = self.retry_statuses
        if isinstance(statuses, (str, bytes)) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in statuses
        ):
            raise GuardConfigError(
                f"RetryPolicy.retry_statuses must be a set of integer HTTP statuses (408, 429, 5xx), got {statuses!r}"
            )
        bad = sorted(s for s in self.retry_statuses if not 400 <= s <= 599 or (s < 500 and s not in (408, 429)))
        if bad:
            raise GuardConfigError(
                f"RetryPolicy.retry_statuses may hold 408, 429 and 5xx only (other 4xx are the caller's "
                f"mistake and fail the same way again), got {bad}"
            )
        object.__setattr__(self, "retry_statuses", frozenset(self.retry_statuses))


@dataclass(frozen=True, slots=True)
class BudgetPolicy:
    """The shared budget of extra attempts (retries + hedges): at most ``ratio`` x the logical calls of the last
    ``window`` seconds, plus ``floor`` so a quiet client can still retry. ``scope="fleet"`` counts the calls and
    extra attempts of every process of ``Guard(fleet=..., name=...)``, one ``floor`` for all (docs/fleet.md).
    The budget bounds the load the guard adds to the plain SDK's (retries sent at once elsewhere, hedges); a retry
    the plain SDK would send goes *paced* past it, charged to it (``snapshot().paced`` counts those past the
    bound): back to the replica that answered with a Retry-After, or a 429 without one, once that wait or the
    cool-down standing in for it is over; after the replica's own failure (a 5xx, a 408, a transport error, but
    not a failure inside a 2xx answer before its first token, a stream cut after its headers or an error event in
    it: the plain SDK meets that one reading the stream, unretried), after the
    same-replica backoff, to a ready replica (circuit closed, not cooling; the one that failed when no other
    is); after an overload answer without a Retry-After (vLLM's 503 for a full queue), at once to another replica
    that is ready. Every replica cooling or open leaves none ready, and the bound holds; the only replica left
    (nowhere else to go) takes it at its cool-down's end, and once its circuit has opened it cools for
    `RetryPolicy.overload_cooldown` unless it is cooling already."""

    ratio: float = 0.1
    floor: int = 4
    window: float = 10.0
    scope: Literal["process", "fleet"] = "process"

    def __post_init__(self) -> None:
        if isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float)) or not 0 <= self.ratio <= 10:
            raise GuardConfigError(f"BudgetPolicy.ratio must be a number from 0 to 10, got {self.ratio!r}")
        _int_at_least("BudgetPolicy", "floor", self.floor, 0)
        _positive("BudgetPolicy", "window", self.window)
        if self.scope not in ("process", "fleet"):
            raise GuardConfigError(f"BudgetPolicy.scope must be 'process' or 'fleet', got {self.scope!r}")


@dataclass(frozen=True, slots=True)
class Bulkhead:
    """Per-tier cap on calls in flight, with a bounded waiting line; past both the call
    fails at once (`BulkheadFull`) instead of queueing without bound."""

    max_in_flight: int
    max_waiting: int = 0

    def __post_init__(self) -> None:
        _int_at_least("Bulkhead", "max_in_flight", self.max_in_flight, 1)
        _int_at_least("Bulkhead", "max_waiting", self.max_waiting, 0)


@dataclass(frozen=True, slots=True)
class ContinuationPolicy:
    """Mid-stream failover (opt-in): a streamed chat or completions answer that breaks after its first
    token (reset, EOF before the end marker, a stall past the tier's ``stall``, an in-stream error or a
    malformed event) is finished by another replica, sent the prompt plus the text already delivered
    (chat: a trailing assistant message with vLLM's ``continue_final_message``). The caller sees one
    answer.

    max_continuations: continuation attempts per call at most: a second one may try a third replica after a
                       continuation failed before its first token, or finish a continuation that broke too.
    min_time_left:     seconds that must be left before the tier's ``total`` deadline to send one.
    budget:            the continuations' own sliding-window budget: at most ``ratio`` x the continuable
                       calls (streamed single-choice chat/completions) of the last ``window`` seconds, plus
                       ``floor``. Separate from the retry/hedge budget: a continuation replaces the rest of a
                       broken answer instead of repeating it, and must not starve the retries and hedges of
                       calls that have not started yet (nor they it).
    """

    max_continuations: int = 2
    min_time_left: float = 0.2
    budget: BudgetPolicy = BudgetPolicy()

    def __post_init__(self) -> None:
        _int_at_least("ContinuationPolicy", "max_continuations", self.max_continuations, 1, 5)
        _positive("ContinuationPolicy", "min_time_left", self.min_time_left)
        if not isinstance(self.budget, BudgetPolicy) or self.budget.scope != "process":
            shape = "a BudgetPolicy(ratio=0.1, floor=4) with scope='process' (continuations budget per process)"
            raise GuardConfigError(f"ContinuationPolicy.budget must be {shape}, got {self.budget!r}")


@dataclass(frozen=True, slots=True)
class AffinityPolicy:
    """Cache-aware routing: a keyed call prefers the same replica, so its prompt prefix is already cached there
    (docs/routing.md). ``Guard(affinity="auto")`` is ``AffinityPolicy()``, ``"explicit"`` is ``auto=False``.

    auto:         derive a key from a chat request's system prompt and first user message when the call has
                  no explicit one (``x-llmguard-session`` header, ``with guard.session(key)``).
    load_factor:  a key's replica takes the call only while it would hold at most ``load_factor`` x the mean
                  load (calls in flight) of the replicas it could go to, plus ``load_slack``; past that the
                  key spills to its next replica.
    load_slack:   calls in flight a key's replica may hold beyond ``load_factor`` x the mean: under light load
                  a call or two more on one replica costs less than a cache miss elsewhere.
    """

    auto: bool = True
    load_factor: float = 1.25
    load_slack: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.auto, bool):
            raise GuardConfigError(f"AffinityPolicy.auto must be True or False, got {self.auto!r}")
        c = self.load_factor
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not (math.isfinite(c) and c >= 1):
            raise GuardConfigError(
                f"AffinityPolicy.load_factor must be a finite number >= 1 (1 = perfectly even load), got {c!r}"
            )
        _int_at_least("AffinityPolicy", "load_slack", self.load_slack, 0)


AffinityChoice = AffinityPolicy | Literal["auto", "explicit"] | None
"""What ``Guard(affinity=...)`` takes."""


def per_tier_continuation(
    value: ContinuationPolicy | Mapping[str, ContinuationPolicy] | None, tiers: Mapping[str, Tier]
) -> dict[str, ContinuationPolicy | None]:
    """``Guard(continuation=...)`` checked: one policy for every tier, or a mapping of some tiers to one."""
    if value is None or isinstance(value, ContinuationPolicy):
        return dict.fromkeys(tiers, value)
    if not isinstance(value, Mapping):
        raise GuardConfigError(
            f"continuation must be a ContinuationPolicy, a mapping of tier names to ContinuationPolicy, or None; "
            f"got {value!r}"
        )
    unknown = sorted(set(value) - set(tiers))
    if unknown:
        raise GuardConfigError(f"continuation names unknown tier(s) {unknown}; tiers: {', '.join(sorted(tiers))}")
    for name, policy in value.items():
        if not isinstance(policy, ContinuationPolicy):
            raise GuardConfigError(f"continuation[{name!r}] must be a ContinuationPolicy, got {policy!r}")
    return {name: value.get(name) for name in tiers}


_T = TypeVar("_T")


def per_tier(
    label: str, values: Mapping[str, _T] | None, tiers: Mapping[str, Tier], kind: type[_T], shape: str
) -> dict[str, _T]:
    """A per-tier option of the Guard checked: known tier names, values of ``kind``."""
    checked = dict(values or {})
    unknown = sorted(set(checked) - set(tiers))
    if unknown:
        raise UnknownTierError(f"{label} name unknown tier(s) {unknown}; tiers: {', '.join(sorted(tiers))}")
    for name, value in checked.items():
        if not isinstance(value, kind):
            raise GuardConfigError(f"{label}[{name!r}] must be {shape}, got {value!r}")
    return checked


def resolve_replicas(replicas: Sequence[str | Replica]) -> list[Replica]:
    """The Guard's ``replicas`` argument checked: a non-empty list of distinct base URLs / `Replica` values."""
    if isinstance(replicas, (str, Replica)) or not isinstance(replicas, Sequence):
        raise GuardConfigError(
            f"replicas must be a list of base URLs or Replica values, got {type(replicas).__name__}: "
            f"{mask_url_secrets(repr(replicas))}"
        )
    if not replicas:
        raise GuardConfigError("replicas must name at least one base URL, e.g. ['http://10.0.0.1:8000']")
    resolved = [r if isinstance(r, Replica) else Replica(r) for r in replicas]
    seen: set[str] = set()
    for replica in resolved:
        url = httpx.URL(replica.name)
        key = str(url.copy_with(scheme=url.scheme.lower(), host=url.host.lower())).rstrip("/")
        if key in seen:
            raise GuardConfigError(f"replica {replica.name!r} is listed twice; each replica must appear once")
        seen.add(key)
    return resolved
