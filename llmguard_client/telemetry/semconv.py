"""Every OpenTelemetry name llmguard_client emits, in one place.

The ``gen_ai.*`` names come from the OpenTelemetry semantic conventions v1.41.0, the last
core release that still held the GenAI conventions; all of them have *Development*
status there and may be renamed later, which is why no other module spells them out.
The GenAI conventions now live in their own repository (semantic-conventions-genai, v0.1.0),
which renames the client metrics; those names are emitted instead when
``OTEL_SEMCONV_STABILITY_OPT_IN`` lists ``gen_ai_latest_experimental`` (see `gen_ai_latest`).
``http.*``, ``url.*``, ``server.*`` and ``error.type`` are Stable HTTP/general conventions.
The ``llmguard.*`` names are this library's own.

See ``docs/observability.md`` for what each span, attribute and metric means.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

SCHEMA_URL: Final = "https://opentelemetry.io/schemas/1.41.0"
"""The semantic-conventions schema the tracer and meter are obtained with."""

INSTRUMENTATION_SCOPE: Final = "llmguard_client"
"""Name of the tracer and meter (the instrumentation scope)."""

# --------------------------------------------------------------------------------------------
# GenAI attributes (Development)
# --------------------------------------------------------------------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_STREAM: Final = "gen_ai.request.stream"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"
GEN_AI_TOKEN_MODALITY: Final = "gen_ai.token.modality"
"""Latest GenAI set only: on the ``gen_ai.client.inference.usage.*`` counters."""

# gen_ai.operation.name well-known values
OPERATION_CHAT: Final = "chat"
OPERATION_TEXT_COMPLETION: Final = "text_completion"
OPERATION_EMBEDDINGS: Final = "embeddings"
OPERATION_OTHER: Final = "_OTHER"
"""Used for a path that is none of the three OpenAI endpoints below (not a well-known value)."""

OPERATION_BY_PATH_SUFFIX: Final[tuple[tuple[str, str], ...]] = (
    ("/chat/completions", OPERATION_CHAT),  # before "/completions": it ends the same way
    ("/completions", OPERATION_TEXT_COMPLETION),
    ("/embeddings", OPERATION_EMBEDDINGS),
)
"""Request path suffix -> ``gen_ai.operation.name`` (a ``/v1`` or other prefix is allowed)."""

PROVIDER_OPENAI: Final = "openai"

# gen_ai.token.type values
TOKEN_TYPE_INPUT: Final = "input"
TOKEN_TYPE_OUTPUT: Final = "output"

# gen_ai.token.modality values: OpenAI-compatible usage has no per-modality split
TOKEN_MODALITY_UNKNOWN: Final = "unknown"

# --------------------------------------------------------------------------------------------
# HTTP / URL / server / error attributes (Stable)
# --------------------------------------------------------------------------------------------
HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_REQUEST_RESEND_COUNT: Final = "http.request.resend_count"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
URL_FULL: Final = "url.full"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"
ERROR_TYPE_OTHER: Final = "_OTHER"

REDACTED: Final = "REDACTED"
"""Replaces URL userinfo and query values in ``url.full`` (as the URL conventions advise)."""

URL_QUERY_KEEP: Final = frozenset({"api-version"})
"""Query parameters whose value is kept in ``url.full``; every other value is ``REDACTED``."""

# --------------------------------------------------------------------------------------------
# llmguard attributes (this library's own)
# --------------------------------------------------------------------------------------------
LLMGUARD_TIER: Final = "llmguard.tier"
LLMGUARD_COHORT: Final = "llmguard.cohort"
LLMGUARD_ROLLOUT_FRACTION: Final = "llmguard.rollout.fraction"
"""The rollout fraction in force when the call's cohort was decided (span attribute only: not a metric label)."""
LLMGUARD_REQUEST_ID: Final = "llmguard.request_id"
LLMGUARD_STATUS: Final = "llmguard.status"
LLMGUARD_CAUSE: Final = "llmguard.cause"
LLMGUARD_ATTEMPTS: Final = "llmguard.attempts"
LLMGUARD_HEDGED: Final = "llmguard.hedged"
LLMGUARD_RETRIED: Final = "llmguard.retried"
LLMGUARD_BUDGET_REFUSALS: Final = "llmguard.budget_refusals"
LLMGUARD_SDK_RETRY: Final = "llmguard.sdk_retry"
"""On ``llmguard.client.calls``: the request was an SDK's retry of its call (``x-stainless-retry-count`` > 0), so
the request before it, counted too, was not the call's end."""
LLMGUARD_ATTEMPT_KIND: Final = "llmguard.attempt.kind"
LLMGUARD_ATTEMPT_OUTCOME: Final = "llmguard.attempt.outcome"
LLMGUARD_ATTEMPT_INDEX: Final = "llmguard.attempt.index"
LLMGUARD_RETRY_AFTER: Final = "llmguard.retry_after_s"
LLMGUARD_CHAOS: Final = "llmguard.chaos"
"""Attempt span: the faults `Chaos` injected into the attempt (``status_429``, ``stall``, ``cut``, ...)."""
LLMGUARD_COOLDOWN_REASON: Final = "llmguard.cooldown.reason"
LLMGUARD_CONTINUED: Final = "llmguard.continued"
"""Logical span, only when true: a stream broke after its first token and a continuation finished it."""
LLMGUARD_NOT_CONTINUED: Final = "llmguard.not_continued"
"""Logical span: why a break after the first token was not continued (`record.NotContinued`)."""
LLMGUARD_ONE_ATTEMPT: Final = "llmguard.one_attempt"
"""Logical span: why the guard gave the call one attempt only, no hedge and no retry (`record.OneAttempt`)."""
LLMGUARD_RESUMED_AT: Final = "llmguard.continuation.resumed_at"
"""Continuation attempt span: characters of answer text delivered before it."""
LLMGUARD_RESUMED_TOKENS: Final = "llmguard.continuation.resumed_tokens"
"""Continuation attempt span: tokens generated before it (what ``max_tokens`` was reduced by)."""
LLMGUARD_BREAK_CAUSE: Final = "llmguard.continuation.break_cause"
"""Continuation attempt span: why the stream it continues broke (``read_error``, ``stream_truncated``, ...)."""
LLMGUARD_BUDGET_INDEX: Final = "llmguard.budget.index"
"""On the budget gauge, only when several guards share one meter provider (the first has none)."""

# Phases, as seconds since the logical call started (attributes, double).
LLMGUARD_PHASE_START: Final = "llmguard.phase.start_s"
LLMGUARD_PHASE_QUEUED: Final = "llmguard.phase.queued_s"
LLMGUARD_PHASE_SENT: Final = "llmguard.phase.sent_s"
LLMGUARD_PHASE_HEADERS: Final = "llmguard.phase.headers_s"
LLMGUARD_PHASE_ACCEPTED: Final = "llmguard.phase.accepted_s"
LLMGUARD_PHASE_FIRST_TOKEN: Final = "llmguard.phase.first_token_s"
LLMGUARD_PHASE_FINISH: Final = "llmguard.phase.finish_s"

# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------
# GenAI client metrics, default set (semantic conventions v1.41.0).
GEN_AI_CLIENT_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK: Final = "gen_ai.client.operation.time_to_first_chunk"
GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK: Final = "gen_ai.client.operation.time_per_output_chunk"
GEN_AI_CLIENT_TOKEN_USAGE: Final = "gen_ai.client.token.usage"

# GenAI client metrics, latest set (semantic-conventions-genai v0.1.0), emitted instead of the default
# set when opted in. Inference = every operation but embeddings, which has metrics of its own.
GEN_AI_CLIENT_INFERENCE_DURATION: Final = "gen_ai.client.inference.duration"
GEN_AI_CLIENT_INFERENCE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.client.inference.time_to_first_chunk"
GEN_AI_CLIENT_INFERENCE_TIME_PER_OUTPUT_CHUNK: Final = "gen_ai.client.inference.time_per_output_chunk"
GEN_AI_CLIENT_INFERENCE_USAGE_INPUT_TOKENS: Final = "gen_ai.client.inference.usage.input_tokens"
"""Counter (not a histogram): tokens spent, for totals and rates."""
GEN_AI_CLIENT_INFERENCE_USAGE_OUTPUT_TOKENS: Final = "gen_ai.client.inference.usage.output_tokens"
GEN_AI_CLIENT_INFERENCE_OPERATION_INPUT_TOKENS: Final = "gen_ai.client.inference.operation.input_tokens"
"""Histogram: tokens per operation, for percentiles (not for totals)."""
GEN_AI_CLIENT_INFERENCE_OPERATION_OUTPUT_TOKENS: Final = "gen_ai.client.inference.operation.output_tokens"
GEN_AI_CLIENT_EMBEDDINGS_DURATION: Final = "gen_ai.client.embeddings.duration"
GEN_AI_CLIENT_EMBEDDINGS_OPERATION_INPUT_TOKENS: Final = "gen_ai.client.embeddings.operation.input_tokens"

SEMCONV_OPT_IN_ENV: Final = "OTEL_SEMCONV_STABILITY_OPT_IN"
"""OpenTelemetry's comma-separated list of convention categories to emit in their newer form."""
GEN_AI_LATEST_EXPERIMENTAL: Final = "gen_ai_latest_experimental"
"""The value of that list that switches the GenAI metrics to the latest set."""


def gen_ai_latest(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``OTEL_SEMCONV_STABILITY_OPT_IN`` (a comma-separated list) holds ``gen_ai_latest_experimental``.

    Read once, when an instrumentation is built, as OpenTelemetry's own instrumentations do.
    """
    values = environ.get(SEMCONV_OPT_IN_ENV, "")
    return GEN_AI_LATEST_EXPERIMENTAL in (v.strip() for v in values.split(","))


HTTP_CLIENT_REQUEST_DURATION: Final = "http.client.request.duration"

LLMGUARD_CLIENT_CALLS: Final = "llmguard.client.calls"
LLMGUARD_CLIENT_ATTEMPTS: Final = "llmguard.client.attempts"
LLMGUARD_CLIENT_BUDGET_REFUSALS: Final = "llmguard.client.budget.refusals"
LLMGUARD_CLIENT_BUDGET_LEVEL: Final = "llmguard.client.budget.level"
LLMGUARD_CLIENT_REPLICA_COOLDOWNS: Final = "llmguard.client.replica.cooldowns"
LLMGUARD_CLIENT_REPLICA_COOLDOWN_DURATION: Final = "llmguard.client.replica.cooldown.duration"
LLMGUARD_CLIENT_BULKHEAD_REJECTIONS: Final = "llmguard.client.bulkhead.rejections"

UNIT_SECONDS: Final = "s"
UNIT_TOKEN: Final = "{token}"
UNIT_CALL: Final = "{call}"
UNIT_ATTEMPT: Final = "{attempt}"
UNIT_COOLDOWN: Final = "{cooldown}"

# Advised explicit bucket boundaries (passed as ``explicit_bucket_boundaries_advisory``).
GEN_AI_DURATION_BUCKETS: Final[tuple[float, ...]] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
"""For every GenAI duration histogram: ``gen_ai.client.operation.*``, ``gen_ai.client.inference.*``, embeddings."""

GEN_AI_TOKEN_BUCKETS: Final[tuple[float, ...]] = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
"""For gen_ai.client.token.usage and the ``*.operation.*_tokens`` histograms of the latest set."""

HTTP_DURATION_BUCKETS: Final[tuple[float, ...]] = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
"""For http.client.request.duration (HTTP semantic conventions)."""

COOLDOWN_BUCKETS: Final[tuple[float, ...]] = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""For llmguard.client.replica.cooldown.duration (Retry-After is capped at 300 s)."""
