"""The openai and anthropic SDKs' own client test suites through a Guard (``-m peer``: needs PyPI, ~2-3 min)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.peer
def test_every_difference_from_the_plain_sdk_is_documented(tmp_path: Path) -> None:
    """A test of the SDKs' suites that passes plain and fails guarded is named, with its reason, in
    docs/compatibility.md; any other difference is a regression."""
    done = subprocess.run(
        [sys.executable, "scripts/peer_suites.py", "--check", "--workdir", "/tmp/llmguard-peer"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pass guarded" in done.stdout
