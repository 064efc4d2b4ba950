"""Every file in examples/ runs as its docstring says, and prints what it says it does (under ``-X dev -W error``:
a warning is a failure). The framework examples run with ``-m frameworks``, in the frameworks' venv."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

EXPECTED = {
    "openai_quickstart.py": r"TTFT \d+ ms, ok, [12] attempt\(s\)",  # 2: a hedge, on a busy machine
    "openai_async.py": r"^20 calls, \d+ hedged$",
    "openai_sync.py": (
        r"^12 answers from 4 threads.*\nTTFT min \d+ ms, max \d+ ms; hedged: \d+\nstreamed \d+ words in tier 'batch'"
    ),
    "plain_httpx_tiers.py": r"interactive: TTFTTimeout: no first content token.*\nbatch: HTTP 200, record tier batch",
    "fastapi_app.py": r"(/ask +\{'answer': '[^']+', 'ttft_ms': \d+, 'attempts': \d\}\n){3}/ask/stream +' tok",
    "langchain_chat.py": (
        r"sync: 2 calls through the guard, status \['ok', 'ok'\]\n.*\nasync: 2 calls through the guard"
    ),
}
NEEDS = {"fastapi_app.py": "fastapi", "langchain_chat.py": "langchain_openai"}
FRAMEWORKS = pytest.mark.frameworks


def test_every_example_is_run_here() -> None:
    assert sorted(EXPECTED) == sorted(p.name for p in (ROOT / "examples").glob("*.py") if p.name != "locustfile.py")


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=FRAMEWORKS) if n in NEEDS else n for n in EXPECTED], ids=lambda n: n[:-3]
)
def test_an_example_runs_as_its_docstring_says(name: str) -> None:
    needed = NEEDS.get(name)
    if needed is not None and importlib.util.find_spec(needed) is None:
        pytest.skip(f"{name} needs {needed} (pip install -e '.[frameworks]')")
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error", str(ROOT / "examples" / name)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(EXPECTED[name], done.stdout, re.MULTILINE), done.stdout
