"""The progress bar counts each client's successes and failures as samples arrive."""

from __future__ import annotations

import io

from rich.console import Console

from llmguard_tools.bench.progress import RichProgress
from tests.bench.reports import sample


def test_counts_ok_and_failed_per_client() -> None:
    out = io.StringIO()
    with RichProgress(Console(file=out, width=80, force_terminal=False)) as bar:
        bar.advance(sample(0))  # before begin: ignored
        bar.begin("plain", 3)
        bar.advance(sample(0))
        bar.advance(sample(1, status="timeout", ttft=None, http=None))
        bar.advance(sample(2))
        bar.end("plain")
        bar.begin("guarded", 1)
        bar.advance(sample(0, "guarded"))
        bar.end("guarded")
    text = out.getvalue()
    assert "plain" in text and "3/3" in text and "ok 2  failed 1" in text
    assert "guarded" in text and "1/1" in text and "ok 1  failed 0" in text
    assert max(len(line) for line in text.splitlines()) <= 80
