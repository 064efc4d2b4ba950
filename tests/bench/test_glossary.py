"""``llmguard bench --explain``: every figure of the report is defined, readably at 80 columns."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from llmguard_tools import cli
from llmguard_tools.bench.glossary import GLOSSARY, render_glossary
from llmguard_tools.bench.tables import SECTIONS

TERMS = {term for term, _ in GLOSSARY}


def _explained(header: str) -> bool:
    words = " ".join(header.split())
    return any(words.startswith(term) or term in words for term in TERMS)


def test_every_column_header_is_explained() -> None:
    for section in SECTIONS:
        for column in section.columns:
            assert _explained(column.header), column.header
    for term in ("÷ plain", "verdict", "goodput", "TTFT", "TPOT", "server req / call", "wasted", "loser aborts"):
        assert term in TERMS


def test_glossary_wraps_within_80_columns() -> None:
    out = io.StringIO()
    render_glossary(Console(file=out, width=80))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in out.getvalue()
    assert lines[0] == "What the bench reports"


@pytest.mark.parametrize("command", ["bench", "demo"])
def test_explain_needs_no_target(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([command, "--explain"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "amplification" in out.lower() and "loser aborts" in out
