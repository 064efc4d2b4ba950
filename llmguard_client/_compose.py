"""The composition root: a Guard's pipeline and transport, assembled from its policies and shared state.

`Guard.__init__` validates the configuration and builds the state every call shares (`SharedState`); this
module wires it together, once per Guard: the layers before the first token (outermost first), the layers a
continuation route goes through (the same objects), the stream stages after the first token (with the
continuation when a tier has a `ContinuationPolicy`), and the `GuardTransport` that runs calls with them.

It sits above the core, the layers and the stream stages and below the public face, so nothing under it
builds a layer or decides their order, and the transport takes what it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass

from llmguard_client._admission.layer import AdmissionLayer
from llmguard_client._budget.budget import RetryBudget
from llmguard_client._core.clock import Clock
from llmguard_client._core.lease import LeaseRegistry
from llmguard_client._core.pipeline import Pipeline
from llmguard_client._core.transport import GuardTransport, RecordCallback
from llmguard_client._layers.attempt import AttemptLayer
from llmguard_client._layers.bulkhead import BulkheadLayer, TierBulkhead
from llmguard_client._layers.deadline import DeadlineLayer
from llmguard_client._layers.hedge import HedgeLayer
from llmguard_client._layers.retry import RetryLayer
from llmguard_client._ratelimit.buckets import RateLimiter
from llmguard_client._ratelimit.layer import RateLimitLayer
from llmguard_client._rollout.passthrough import PassthroughPool
from llmguard_client._rollout.rollout import Rollout, RolloutLayer
from llmguard_client._routing.replicas import ReplicaSet
from llmguard_client._routing.ttft_stats import TTFTStats
from llmguard_client._stream.continuation import Continuer
from llmguard_client._stream.stages import StreamStages
from llmguard_client._stream.watchdog import ReadWatchdog
from llmguard_client.config import ContinuationPolicy, FailureMode, HedgePolicy, RetryPolicy, Tier
from llmguard_client.telemetry.hooks import Instrumentation

__all__ = ["Policies", "SharedState", "build_pipeline", "build_transport"]

_GENERATION_PATHS = HedgePolicy()
"""Which paths are idempotent-safe generation calls, when hedging is off."""


@dataclass(frozen=True, slots=True)
class Policies:
    """A Guard's validated configuration, as the pipeline needs it."""

    tiers: Mapping[str, Tier]
    default_tier: str
    hedge: HedgePolicy | None
    retry: RetryPolicy | None
    continuation: Mapping[str, ContinuationPolicy | None]
    """Each tier's continuation policy (None: that tier's streams are not continued)."""
    failure_mode: FailureMode


@dataclass(frozen=True, slots=True)
class SharedState:
    """What every call of one Guard shares, built by the Guard (which owns it and closes it)."""

    replicas: ReplicaSet
    ttft_stats: TTFTStats
    budgets: Mapping[str, RetryBudget | None]
    """The budget each tier's retries and hedges are paid from (its own, the Guard's, or None: unbounded)."""
    bulkheads: Mapping[str, TierBulkhead]
    rollout: Rollout
    rate_limiter: RateLimiter | None
    registry: LeaseRegistry
    passthrough_pool: PassthroughPool
    instrumentation: Instrumentation
    clock: Clock
    admission: AdmissionLayer | None = None
    """Adaptive admission per replica (`Admission`), which the Guard reads for its snapshot; None: off."""


def build_pipeline(policies: Policies, state: SharedState) -> tuple[Pipeline, StreamStages]:
    """The whole pipeline of a guarded call: the layers (rollout, bulkhead, deadline, retry, hedge, admission when
    on, rate limit) around the attempt, with a continuation's path through the same deadline, retry and rate-limit
    objects; and the stream stages, with the continuation when any tier has a `ContinuationPolicy`."""
    deadline = DeadlineLayer()
    limiter = state.rate_limiter
    retry = RetryLayer(
        state.replicas,
        policies.retry,
        state.instrumentation,
        rate_limited=limiter.applies if limiter else None,
        ttft_stats=state.ttft_stats,
    )
    rate_limit = RateLimitLayer(state.rate_limiter)
    admission = () if state.admission is None else (state.admission,)  # per attempt: its replica is picked
    layers = (
        RolloutLayer(state.rollout),
        BulkheadLayer(state.bulkheads, state.instrumentation),
        deadline,
        retry,
        HedgeLayer(state.replicas, policies.hedge, state.ttft_stats),
        *admission,
        rate_limit,
    )
    pipeline = Pipeline(layers, AttemptLayer(state.registry), (deadline, retry, rate_limit))
    continuer = None
    if any(policies.continuation.values()):
        path = pipeline.continuation
        continuer = Continuer(state.replicas, path, retry, dict(policies.continuation), state.clock)
    return pipeline, StreamStages(ReadWatchdog.for_response, continuer)


def build_transport(
    policies: Policies, state: SharedState, *, tier_var: ContextVar[str | None], on_record: RecordCallback | None
) -> GuardTransport:
    """The transport that runs a Guard's calls through `build_pipeline`'s pipeline and stream stages."""
    pipeline, stream = build_pipeline(policies, state)
    return GuardTransport(
        pipeline,
        stream,
        replicas=state.replicas,
        tiers=policies.tiers,
        default_tier=policies.default_tier,
        tier_var=tier_var,
        budgets=state.budgets,
        ttft_stats=state.ttft_stats,
        rollout=state.rollout,
        passthrough_pool=state.passthrough_pool,
        registry=state.registry,
        instrumentation=state.instrumentation,
        on_record=on_record,
        clock=state.clock,
        failure_mode=policies.failure_mode,
        generation=(policies.hedge or _GENERATION_PATHS).applies_to,
        retries=policies.retry is not None,
        cooperative=policies.retry if policies.retry is not None and policies.retry.mode == "cooperative" else None,
    )
