"""The instrumentation a `Guard` gets when none is passed."""

from __future__ import annotations

import importlib.util
import logging

from llmguard_client.telemetry.hooks import Instrumentation

logger = logging.getLogger("llmguard_client")

_reported: set[str] = set()
"""The failures already logged (once each per process: a process may build many Guards)."""


def default_instrumentation() -> Instrumentation | None:
    """OpenTelemetry when opentelemetry-api is installed; without it no application can have set up
    OpenTelemetry, so there is nothing to report to: no instrumentation. Nor when OpenTelemetry itself fails to
    start, as it does on an ``OTEL_*`` variable naming a plugin that is not installed (``OTEL_PROPAGATORS=b3``,
    ``OTEL_PYTHON_TRACER_PROVIDER``), or whose entry point was shipped without its module (a frozen app): the
    caller asked for no telemetry, and the plain SDK serves its calls all the same, so the Guard does too,
    without it, and says why once."""
    try:
        from llmguard_client.telemetry.otel import OpenTelemetryInstrumentation

        return OpenTelemetryInstrumentation()
    except Exception as exc:
        if isinstance(exc, ModuleNotFoundError) and not _api_installed():
            return None
        why = f"{type(exc).__name__}: {exc}".rstrip(": ")
        if why not in _reported:
            _reported.add(why)
            logger.warning(
                "llmguard: OpenTelemetry failed to start (%s), so this Guard reports no spans or metrics; its calls "
                "are served all the same. An OTEL_* environment variable naming a propagator or provider that is "
                "not installed is the usual cause; pass instrumentation=None to say no telemetry is wanted",
                why,
            )
        return None


def _api_installed() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except (ImportError, ValueError):  # its parent missing, or hidden (None in sys.modules)
        return False
