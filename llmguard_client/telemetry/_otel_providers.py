"""Which OpenTelemetry signals reach an SDK: provider detection, cheap enough to run per call.

Only ``opentelemetry-api`` is imported. A guard is often built before the application configures the
SDK; the API's global proxies then start delegating, and `SignalState` notices it on the next call.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import MeterProvider, NoOpMeterProvider
from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, TracerProvider

__all__ = ["VERSION", "SignalState", "global_meter_provider", "global_tracer_provider"]

try:
    VERSION = importlib.metadata.version("llmguard-client")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    VERSION = "0.0.0"

_NOOP_TRACER_PROVIDERS = (ProxyTracerProvider, NoOpTracerProvider)

_metrics_internal: Any
try:  # the API module holding the global meter provider (private: used only for a fast check)
    _metrics_internal = importlib.import_module("opentelemetry.metrics._internal")
except ImportError:  # pragma: no cover - another API version: global_meter_provider falls back
    _metrics_internal = None


def global_tracer_provider() -> TracerProvider | None:
    """The global tracer provider once one was set, else None (cheaply: no environment lookup)."""
    try:
        return trace._TRACER_PROVIDER  # set once, never unset
    except AttributeError:  # pragma: no cover - another API version: the public way
        tp = trace.get_tracer_provider()
        return None if isinstance(tp, ProxyTracerProvider) else tp


def global_meter_provider() -> MeterProvider | None:
    """The global meter provider once one was set, else None (cheaply: no environment lookup)."""
    try:
        return _metrics_internal._METER_PROVIDER  # type: ignore[no-any-return]  # set once, never unset
    except AttributeError:  # pragma: no cover - another API version: the public way
        mp = metrics.get_meter_provider()
        return None if type(mp).__name__ == "_ProxyMeterProvider" else mp


class SignalState:
    """Whether traces and metrics reach an SDK, for the providers an instrumentation was given.

    ``None`` for a signal means "the global provider, not set so far": it is looked up again on the
    next call. A global provider, once set, cannot be replaced, so the answer is then kept.
    """

    __slots__ = ("_metrics_on", "_traces_on")

    def __init__(self, tracer_provider: TracerProvider | None, meter_provider: MeterProvider | None) -> None:
        self._traces_on = None if tracer_provider is None else not isinstance(tracer_provider, _NOOP_TRACER_PROVIDERS)
        self._metrics_on = None if meter_provider is None else not isinstance(meter_provider, NoOpMeterProvider)

    def disabled(self) -> bool:
        """True while no SDK would receive anything and there is no trace context to pass on."""
        traces = self._traces_on
        if traces is None:
            tp = global_tracer_provider()
            if tp is not None:
                traces = self._traces_on = not isinstance(tp, _NOOP_TRACER_PROVIDERS)
        if traces:
            return False
        on = self._metrics_on
        if on is None:
            mp = global_meter_provider()
            if mp is not None:
                on = self._metrics_on = not isinstance(mp, NoOpMeterProvider)
        if on:
            return False
        # With no SDK an incoming context (e.g. extracted by a server framework) is still passed on.
        return not trace.get_current_span().get_span_context().is_valid
