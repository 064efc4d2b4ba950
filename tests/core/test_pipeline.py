"""The pipeline is declared once: the layers before the first token, the continuation's path through the
same layer objects, and the stream stages after the first token."""

from __future__ import annotations

import pytest

from llmguard_client import ContinuationPolicy, Guard
from llmguard_client._core.outcome import Outcome, Route
from llmguard_client._core.pipeline import Next, Pipeline
from llmguard_client._layers.attempt import AttemptLayer
from llmguard_client._layers.deadline import DeadlineLayer
from llmguard_client._layers.hedge import HedgeLayer
from llmguard_client._layers.retry import RetryLayer
from llmguard_client._stream.continuation import Continuer
from llmguard_client._stream.watchdog import ReadWatchdog


def test_the_guard_runs_the_pipeline_its_composition_declares() -> None:
    guard = Guard(["http://a.test", "http://b.test"], continuation=ContinuationPolicy())
    pipeline = guard.transport.pipeline
    kinds = [type(layer).__name__ for layer in pipeline.layers]
    assert kinds == ["RolloutLayer", "BulkheadLayer", "DeadlineLayer", "RetryLayer", "HedgeLayer", "RateLimitLayer"]
    assert isinstance(pipeline.attempt, AttemptLayer)
    deadline, retry = pipeline.layers[2], pipeline.layers[3]
    assert isinstance(deadline, DeadlineLayer) and isinstance(retry, RetryLayer)
    rate_limit = pipeline.layers[5]
    # the same objects: one deadline, one retry, and a continuation is charged to the rate limit like any attempt
    assert pipeline.continuation_layers == (deadline, retry, rate_limit)
    assert guard.transport.stream.watch == ReadWatchdog.for_response
    assert isinstance(guard.transport.stream.continuation, Continuer)


def test_continuation_layers_must_be_layers_of_the_pipeline() -> None:
    async def attempt(call: object, route: Route) -> Outcome:
        raise AssertionError("not called")

    inner: Next = attempt  # type: ignore[assignment]
    deadline = DeadlineLayer()
    stranger = HedgeLayer(None, None, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="continuation layers must be layers of the pipeline"):
        Pipeline([deadline], inner, [deadline, stranger])
