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


RETRY_COUNTING = (
    "test_retries_taken",
    "test_omit_retry_count_header",
    "test_overwrite_retry_count_header",
    "test_api_key_refresh_on_retry",
    "test_bearer_token_refresh_async",
    "test_every_attempt_has_the_qualifiers",
)
"""The tests of the SDK's own retry counting, retry-count header, per-retry credentials and per-request hooks."""


@pytest.mark.peer
def test_with_cooperative_retries_the_sdks_retry_counting_holds(tmp_path: Path) -> None:
    """With the SDK sending the retries the guard allows, its retry counting, retry-count header, per-retry
    credentials and per-request hooks hold in every suite: none of their tests passes plain and fails guarded."""
    report = tmp_path / "cooperative.json"
    done = peer_suites("--retry-mode", "cooperative", "--json", str(report))
    assert done.returncode == 0, done.stdout + done.stderr
    suites = json.loads(report.read_text())
    assert set(suites) == {"openai", "anthropic", "anthropic-httpx"}
    counting = {
        name: [t for t in suite["differences"] if t.split("::")[1].startswith(RETRY_COUNTING)]
        for name, suite in suites.items()
    }
    assert counting == {name: [] for name in suites}, done.stdout
