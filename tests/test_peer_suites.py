"""The openai and anthropic SDKs' own client test suites through a Guard (``-m peer``: needs PyPI, ~2-3 min)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def peer_suites(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/peer_suites.py", "--check", "--workdir", "/tmp/llmguard-peer", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )


@pytest.mark.peer
def test_every_difference_from_the_plain_sdk_is_documented() -> None:
    """A test of the SDKs' suites that passes plain and fails guarded is named, with its reason, in
    docs/compatibility.md; any other difference is a regression."""
    done = peer_suites()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pass guarded" in done.stdout


@pytest.mark.peer
def test_with_cooperative_retries_at_most_six_tests_per_suite_differ(tmp_path: Path) -> None:
    """With the SDK sending the retries the guard allows, its retry counting, retry-count header and per-retry
    credentials hold: at most 6 tests per suite pass plain and fail guarded, each documented."""
    report = tmp_path / "cooperative.json"
    done = peer_suites("--retry-mode", "cooperative", "--json", str(report))
    assert done.returncode == 0, done.stdout + done.stderr
    suites = json.loads(report.read_text())
    assert set(suites) == {"openai", "anthropic"}
    differences = {name: len(suite["differences"]) for name, suite in suites.items()}
    assert all(count <= 6 for count in differences.values()), done.stdout
