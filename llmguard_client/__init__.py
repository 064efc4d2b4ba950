"""llmguard_client: client-side resilience for OpenAI-compatible LLM endpoints.

SLO-tiered timeouts on the first content token, hedged requests raced on that token,
retries under one shared budget that honours Retry-After, and per-phase timestamps
through OpenTelemetry, all behind one httpx transport::

    guard = Guard(replicas=[...], tiers={"interactive": Tier(ttft=1.0, total=10.0, stall=2.0)})
    client = openai.AsyncOpenAI(base_url=..., api_key=..., http_client=guard.http_client())
"""

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from llmguard_client._admission.policy import Admission
from llmguard_client._chaos import Chaos
from llmguard_client._core.transport import GuardTransport
from llmguard_client._http.retry_after import RETRY_AFTER_CAP, parse_retry_after
from llmguard_client._rollout.rollout import FloatFlagClient, flag_fraction
from llmguard_client.causes import guard_failure
from llmguard_client.config import (
    AffinityPolicy,
    BudgetPolicy,
    Bulkhead,
    ContinuationPolicy,
    FailureMode,
    HedgePolicy,
    RateLimit,
    Replica,
    RetryPolicy,
    Tier,
)
from llmguard_client.errors import (
    AllAttemptsFailed,
    AllAttemptsFailedToConnect,
    AllAttemptsTimedOut,
    AllReplicasCooling,
    BudgetExhausted,
    BulkheadFull,
    GuardClosed,
    GuardConfigError,
    GuardFailure,
    GuardRequestError,
    GuardStreamError,
    GuardTimeout,
    GuardUnavailable,
    LLMGuardError,
    Overloaded,
    RateLimited,
    StallTimeout,
    StreamTruncated,
    TotalTimeout,
    TTFTTimeout,
    UnknownCohortError,
    UnknownTierError,
    UpstreamStreamError,
    WrongEventLoop,
)
from llmguard_client.guard import DEFAULT_POOL_LIMITS, Guard
from llmguard_client.snapshot import (
    AdmissionSnapshot,
    BudgetSnapshot,
    FleetBudgetSnapshot,
    FleetSnapshot,
    GuardSnapshot,
    ReplicaSnapshot,
    TierSnapshot,
)
from llmguard_client.telemetry.capture import Capture, capture
from llmguard_client.telemetry.record import AttemptRecord, PhaseRecord
from llmguard_client.telemetry.record_logger import RecordLogger

if TYPE_CHECKING:
    from llmguard_client.telemetry.otel import OpenTelemetryInstrumentation

try:
    __version__ = version("llmguard-client")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without metadata
    __version__ = "0.0.0"

__all__ = [
    "DEFAULT_POOL_LIMITS",
    "RETRY_AFTER_CAP",
    "Admission",
    "AdmissionSnapshot",
    "AffinityPolicy",
    "AllAttemptsFailed",
    "AllAttemptsFailedToConnect",
    "AllAttemptsTimedOut",
    "AllReplicasCooling",
    "AttemptRecord",
    "BudgetExhausted",
    "BudgetPolicy",
    "BudgetSnapshot",
    "Bulkhead",
    "BulkheadFull",
    "Capture",
    "Chaos",
    "ContinuationPolicy",
    "FailureMode",
    "FleetBudgetSnapshot",
    "FleetSnapshot",
    "FloatFlagClient",
    "Guard",
    "GuardClosed",
    "GuardConfigError",
    "GuardFailure",
    "GuardRequestError",
    "GuardSnapshot",
    "GuardStreamError",
    "GuardTimeout",
    "GuardTransport",
    "GuardUnavailable",
    "HedgePolicy",
    "LLMGuardError",
    "OpenTelemetryInstrumentation",
    "Overloaded",
    "PhaseRecord",
    "RateLimit",
    "RateLimited",
    "RecordLogger",
    "Replica",
    "ReplicaSnapshot",
    "RetryPolicy",
    "StallTimeout",
    "StreamTruncated",
    "TTFTTimeout",
    "Tier",
    "TierSnapshot",
    "TotalTimeout",
    "UnknownCohortError",
    "UnknownTierError",
    "UpstreamStreamError",
    "WrongEventLoop",
    "__version__",
    "capture",
    "flag_fraction",
    "guard_failure",
    "parse_retry_after",
]


def __getattr__(name: str) -> object:
    # Imported on first use, so the package imports (and runs with instrumentation=None or no
    # opentelemetry-api installed at all) without OpenTelemetry.
    if name == "OpenTelemetryInstrumentation":
        from llmguard_client.telemetry.otel import OpenTelemetryInstrumentation

        return OpenTelemetryInstrumentation
    raise AttributeError(f"module 'llmguard_client' has no attribute {name!r}")
