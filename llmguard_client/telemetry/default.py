"""The instrumentation a `Guard` gets when none is passed."""

from __future__ import annotations

from llmguard_client.telemetry.hooks import Instrumentation


def default_instrumentation() -> Instrumentation | None:
    """OpenTelemetry when opentelemetry-api is installed; without it no application can have set up
    OpenTelemetry, so there is nothing to report to: no instrumentation."""
    try:
        from llmguard_client.telemetry.otel import OpenTelemetryInstrumentation
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("opentelemetry"):
            raise
        return None
    return OpenTelemetryInstrumentation()
