"""Running a test's scenario in a Python process of its own (a fork, gevent's patching or a process-wide hook
must not reach the test worker)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_script(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -c script args...`` from the repository's root (so ``tests`` imports), its output captured."""
    return subprocess.run(
        [sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
