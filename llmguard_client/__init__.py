"""llmguard_client: client-side resilience for OpenAI-compatible LLM endpoints.

SLO-tiered timeouts on the first content token, hedged requests raced on that token,
retries under one shared budget that honours Retry-After, and per-phase timestamps
through OpenTelemetry, all behind one httpx transport::

    guard = Guard(replicas=[...], tiers={"interactive": Tier(ttft=1.0, total=10.0, stall=2.0)})
    client = openai.AsyncOpenAI(base_url=..., api_key=..., http_client=guard.http_client())
"""

from importlib.metadata import PackageNotFoundError, version

from llmguard_client._config import BudgetPolicy, Bulkhead, FailureMode, HedgePolicy, Replica, RetryPolicy, Tier
from llmguard_client._errors import (
    AllAttemptsFailed,
    AllReplicasCooling,
    BudgetExhausted,
    BulkheadFull,
    GuardConfigError,
    GuardFailure,
    GuardStreamError,
    GuardTimeout,
    GuardUnavailable,
    LLMGuardError,
    StallTimeout,
    StreamTruncated,
    TotalTimeout,
    TTFTTimeout,
    UnknownTierError,
    UpstreamStreamError,
)
from llmguard_client._guard import Guard
from llmguard_client._retry_after import RETRY_AFTER_CAP, parse_retry_after
from llmguard_client._transport import GuardTransport
from llmguard_client.telemetry.otel import OpenTelemetryInstrumentation
from llmguard_client.telemetry.record import AttemptRecord, PhaseRecord, RecordLogger

try:
    __version__ = version("llmguard-client")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without metadata
    __version__ = "0.0.0"

__all__ = [
    "RETRY_AFTER_CAP",
    "AllAttemptsFailed",
    "AllReplicasCooling",
    "AttemptRecord",
    "BudgetExhausted",
    "BudgetPolicy",
    "Bulkhead",
    "BulkheadFull",
    "FailureMode",
    "Guard",
    "GuardConfigError",
    "GuardFailure",
    "GuardStreamError",
    "GuardTimeout",
    "GuardTransport",
    "GuardUnavailable",
    "HedgePolicy",
    "LLMGuardError",
    "OpenTelemetryInstrumentation",
    "PhaseRecord",
    "RecordLogger",
    "Replica",
    "RetryPolicy",
    "StallTimeout",
    "StreamTruncated",
    "TTFTTimeout",
    "Tier",
    "TotalTimeout",
    "UnknownTierError",
    "UpstreamStreamError",
    "__version__",
    "parse_retry_after",
]
