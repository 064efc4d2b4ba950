"""What a fresh interpreter has loaded after ``import llmguard_client``: one subprocess per test session,
shared by the import-boundary tests (each used to start its own, ~0.5 s apiece)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def modules_after_import() -> frozenset[str]:
    """Every module in ``sys.modules`` of a new interpreter (run from the project root) that imported the package."""
    code = "import json, sys\nimport llmguard_client\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, check=True
    )
    return frozenset(json.loads(done.stdout))
