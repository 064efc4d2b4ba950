"""Attribute values derived from phase records: operation names, error types, scrubbed URLs, timestamps.

Pure functions (public through ``llmguard_client.telemetry.otel`` for tests and for users building their
own adapter) plus a bounded cache of parsed replica URLs. No prompt, completion or header value is read.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.util.types import AttributeValue

from llmguard_client.telemetry import semconv as sc
from llmguard_client.telemetry._record_builder import AnyAttempt, AnyCall
from llmguard_client.telemetry.record import PhaseRecord

__all__ = [
    "ATTEMPT_PHASES",
    "CALL_PHASES",
    "Attrs",
    "UrlCache",
    "attempt_error_type",
    "call_error_type",
    "continuation_attributes",
    "epoch_ns",
    "operation_name",
    "scrub_url",
    "server_of",
    "time_per_output_chunk",
]

Attrs = dict[str, AttributeValue]

_FAILED_STATUSES = frozenset({"timeout", "http_error", "error", "rejected"})
_DEFAULT_PORTS = {"http": 80, "https": 443}
_URL_CACHE_MAX = 512

ATTEMPT_PHASES = (
    (sc.LLMGUARD_PHASE_START, "start"),
    (sc.LLMGUARD_PHASE_SENT, "sent"),
    (sc.LLMGUARD_PHASE_HEADERS, "headers"),
    (sc.LLMGUARD_PHASE_ACCEPTED, "accepted"),
    (sc.LLMGUARD_PHASE_FIRST_TOKEN, "first_token"),
    (sc.LLMGUARD_PHASE_FINISH, "finish"),
)
"""(attribute, field) of the phases an attempt span carries, in seconds since the call started."""
CALL_PHASES = ((sc.LLMGUARD_PHASE_QUEUED, "queued"), *ATTEMPT_PHASES[1:])
"""The same for the logical span (``queued`` instead of ``start``)."""


def operation_name(path: str) -> str:
    """``gen_ai.operation.name`` for a request path: chat, text_completion, embeddings or ``_OTHER``."""
    path = path.split("?", 1)[0].rstrip("/")
    for suffix, name in sc.OPERATION_BY_PATH_SUFFIX:
        if path.endswith(suffix):
            return name
    return sc.OPERATION_OTHER


def call_error_type(record: PhaseRecord) -> str | None:
    """``error.type`` of a logical call, or None when it did not fail.

    Only ``timeout``, ``http_error``, ``error`` and ``rejected`` are failures; ``ok`` and the
    caller's own ``cancelled`` / ``abandoned`` are not. An HTTP error is its status code
    (``"503"``), as in the HTTP conventions; the others are ``record.cause`` (``ttft_timeout``,
    ``connect_error``, ``budget_exhausted``...) or, without a cause, the status itself.
    """
    status = record.status
    if status not in _FAILED_STATUSES:
        return None
    if status == "http_error" and record.http_status is not None:
        return str(record.http_status)
    return record.cause or status


def attempt_error_type(attempt: AnyAttempt) -> str | None:
    """``error.type`` of one attempt, or None (a lost or cancelled attempt has none)."""
    outcome = attempt.outcome
    if outcome == "lost" or outcome == "cancelled":
        return None
    code = attempt.status_code
    if code is not None and code >= 400:
        return str(code)
    if outcome == "failed":
        return attempt.error or sc.ERROR_TYPE_OTHER
    return attempt.error  # a winner whose body then failed (read_error), else None


def continuation_attributes(attempt: AnyAttempt, attrs: Attrs) -> None:
    """Add a continuation attempt's offset (characters and tokens it resumed at) and its break's cause."""
    if attempt.resumed_at is not None:
        attrs[sc.LLMGUARD_RESUMED_AT] = attempt.resumed_at
    if attempt.resumed_tokens is not None:
        attrs[sc.LLMGUARD_RESUMED_TOKENS] = attempt.resumed_tokens
    if attempt.break_cause is not None:
        attrs[sc.LLMGUARD_BREAK_CAUSE] = attempt.break_cause


def scrub_url(url: str) -> str:
    """``url`` fit for ``url.full``: userinfo and every query value but ``api-version`` REDACTED.

    The fragment is dropped. An unparseable URL is reduced to ``REDACTED``.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return sc.REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        cred = f"{sc.REDACTED}:{sc.REDACTED}" if ":" in userinfo else sc.REDACTED
        netloc = f"{cred}@{hostport}"
    query = parts.query
    if query:
        pairs = []
        for pair in query.split("&"):
            name, sep, _value = pair.partition("=")
            if sep and name.lower() not in sc.URL_QUERY_KEEP:
                pair = f"{name}={sc.REDACTED}"
            pairs.append(pair)
        query = "&".join(pairs)
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def server_of(url: str) -> tuple[str, int] | None:
    """``(server.address, server.port)`` of a URL, the port defaulted from the scheme."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError:
        return None
    if not host:
        return None
    if port is None:
        port = _DEFAULT_PORTS.get(parts.scheme.lower())
        if port is None:
            return None
    return host, port


def epoch_ns(record: AnyCall, t: float | None) -> int:
    """Epoch nanoseconds of the monotonic instant ``t`` of ``record``'s call (now when None)."""
    if t is None:
        return time.time_ns()
    return round(record.start_unix * 1e9) + round((t - record.start) * 1e9)


def time_per_output_chunk(record: PhaseRecord) -> float | None:
    """Mean seconds between output chunks after the first, for a stream that completed.

    The record has no per-chunk timestamps, so the metric gets one value per call: the time
    from the first to the last chunk over the chunks after the first. The chunk count is
    ``record.chunks`` when the transport fills it, else ``completion_tokens`` (OpenAI-compatible
    servers send about one token per chunk).
    """
    if record.status != "ok" or record.finish is None or record.first_token is None:
        return None
    chunks: Any = getattr(record, "chunks", None)
    n = chunks if isinstance(chunks, int) else record.completion_tokens
    if n is None or n < 2:
        return None
    return max(record.finish - record.first_token, 0.0) / (n - 1)


class UrlCache:
    """`server_of` and `scrub_url` results per URL, bounded (a guard has a handful of replicas)."""

    __slots__ = ("_servers", "_urls")

    def __init__(self) -> None:
        self._servers: dict[str, tuple[str, int] | None] = {}
        self._urls: dict[str, tuple[str, tuple[str, int] | None]] = {}

    def server(self, base_url: str) -> tuple[str, int] | None:
        """``(server.address, server.port)`` of ``base_url``."""
        try:
            return self._servers[base_url]
        except KeyError:
            server = server_of(base_url)
            if len(self._servers) < _URL_CACHE_MAX:
                self._servers[base_url] = server
            return server

    def url(self, url: str) -> tuple[str, tuple[str, int] | None]:
        """``(url.full, (server.address, server.port))`` of a request URL."""
        try:
            return self._urls[url]
        except KeyError:
            out = (scrub_url(url), server_of(url))
            if len(self._urls) < _URL_CACHE_MAX:
                self._urls[url] = out
            return out
