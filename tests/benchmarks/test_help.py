"""Every benchmark script takes ``--help`` (docs/benchmarks.md says so): it prints its usage and exits 0, running
nothing. One process runs them all (`runpy`, as ``python -m benchmarks.NAME --help`` would), so a script whose
imports no longer resolve fails here, not in a reader's shell."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.scripts import ROOT

SCRIPTS = sorted(path.stem for path in (ROOT / "benchmarks").glob("*.py") if not path.stem.startswith("_"))

DRIVER = """
import contextlib, io, json, runpy, sys

names, results = sys.argv[1:], {}
for name in names:
    out = io.StringIO()
    sys.argv = [name, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_module("benchmarks." + name, run_name="__main__", alter_sys=True)
        code = "ran without exiting"
    except SystemExit as exc:
        code = exc.code
    except BaseException as exc:
        code = f"{type(exc).__name__}: {exc}"
    results[name] = [code, out.getvalue()]
print(json.dumps(results))
"""


def test_every_benchmark_script_prints_its_usage_for_help() -> None:
    assert "vllm_continuation" in SCRIPTS and len(SCRIPTS) > 20
    path = os.pathsep.join([str(ROOT), str(ROOT / "tools")])  # this checkout's runtime and tools
    env = dict(os.environ, PYTHONPATH=path, PYTHONWARNINGS="ignore", COLUMNS="100")
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, *SCRIPTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    failed = {
        name: f"{code!r}: {out[-500:]}"
        for name, (code, out) in results.items()
        if code not in (0, None) or "usage: " not in out
    }
    assert not failed, "\n".join(f"benchmarks.{name} --help -> {why}" for name, why in failed.items())
