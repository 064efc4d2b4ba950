"""Compile the package's bytecode once per run, so that no test process compiles it again.

Under ``PYTHONDONTWRITEBYTECODE=1`` (as in this project's environment) and on any fresh checkout, the package has
no ``__pycache__``: every Python process that imports it compiles its ~100 modules from source, about 0.2 s of CPU
each time. A run starts dozens of them (each xdist worker, and every subprocess the tests spawn: the CLI, the
docs' commands, the simulated clusters, Locust, the fleet's processes). Python still *reads* bytecode it finds
when writing is off, so writing it once here, before the workers start, saves that in all of them.

``compileall`` writes the ordinary ``__pycache__/*.pyc`` files (ignored by git) and recompiles only a module whose
source changed since, so a run after an edit still imports the edited code.
"""

from __future__ import annotations

import compileall
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("llmguard_client", "tools/llmguard_tools", "tests")
"""The runtime and the tools; ``tests`` too: the fleet's and the affinity tests' child processes import test
helpers (``tests.fleet``)."""


def precompile() -> None:
    """Write the missing or stale bytecode of `PACKAGES`; a failure (a read-only checkout) leaves it to each import."""
    for package in PACKAGES:
        compileall.compile_dir(ROOT / package, quiet=2, workers=1)
