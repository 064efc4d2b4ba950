"""The default instrumentation: OpenTelemetry if it starts, else none, and the Guard serves its calls."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import ROOT

CALL_THROUGH_A_DEFAULT_GUARD = """
import logging
import anyio, httpx
from llmguard_client import Guard

logging.basicConfig(format="%(levelname)s %(message)s")

async def main():
    ok = httpx.MockTransport(lambda r: httpx.Response(200, json={"ok": True}))
    for _ in range(2):  # the failure is said once per process
        guard = Guard(["http://a"], transport_factory=lambda r: ok)
        async with guard.http_client() as client:
            print((await client.get("http://a/v1/models")).json())
        await guard.aclose()

anyio.run(main)
"""


SHIPPED_WITHOUT_ITS_MODULE = """[opentelemetry_propagator]
vendorprop = vendor_missing_module.prop:Propagator

[opentelemetry_tracer_provider]
vendortp = vendor_missing_module.tp:Provider
oteltp = opentelemetry.sdk_missing.trace:TracerProvider
"""
"""Entry points whose modules are not there, as in an app frozen with a plugin's metadata but not its code."""


@pytest.mark.parametrize(
    ("variable", "value", "error"),
    [
        ("OTEL_PROPAGATORS", "tracecontext,baggage,b3", "ValueError: Propagator b3 not found"),
        ("OTEL_PYTHON_TRACER_PROVIDER", "not_installed", "StopIteration"),
        ("OTEL_PROPAGATORS", "tracecontext,vendorprop", "ModuleNotFoundError: No module named 'vendor_missing_module'"),
        ("OTEL_PYTHON_TRACER_PROVIDER", "vendortp", "ModuleNotFoundError: No module named 'vendor_missing_module'"),
        ("OTEL_PYTHON_TRACER_PROVIDER", "oteltp", "ModuleNotFoundError: No module named 'opentelemetry.sdk_missing'"),
    ],
)
def test_a_guard_serves_its_calls_when_an_otel_variable_names_a_plugin_not_installed(
    variable: str, value: str, error: str, tmp_path: Path
) -> None:
    """OpenTelemetry raises as it starts on such a variable (set for every process of a platform, the plugin
    shipped in its own path that a frozen app does not read): `Guard()` raised it, where the plain SDK, which
    starts no OpenTelemetry, served the calls."""
    metadata = tmp_path / "frozen_plugin-1.0.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: frozen-plugin\nVersion: 1.0\n")
    (metadata / "entry_points.txt").write_text(SHIPPED_WITHOUT_ITS_MODULE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {variable: value}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-c", CALL_THROUGH_A_DEFAULT_GUARD]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["{'ok': True}"] * 2
    [warning] = [line for line in done.stderr.splitlines() if line.startswith("WARNING llmguard")]  # OTel logs too
    assert warning.startswith(f"WARNING llmguard: OpenTelemetry failed to start ({error}")
    assert "OTEL_* environment variable" in warning and "instrumentation=None" in warning
