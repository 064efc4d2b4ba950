"""The terminal report fits an 80-column console: no line wider, no header cut, every client shown."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from llmguard_tools.bench.runner import ClientRun
from llmguard_tools.bench.tables import SECTIONS, make_console, render, section_tables
from tests.bench.reports import make_report, mixed_run, server

FOUR = ("plain", "openai-default", "naive-retry", "guarded")
SIX = (*FOUR, "guarded-nohedge", "guarded-noretry")


def runs(names: tuple[str, ...], *, with_server: bool = True) -> list[ClientRun]:
    out = [
        mixed_run(n, 1 / (i + 1), server(10 + i, 44_654 + i, 3_368 * i) if with_server else None)
        for i, n in enumerate(names)
    ]
    for run in out:
        for s in run.samples:
            if not s.ok and run.name.startswith("guarded"):
                s.in_attempts = s.e2e - 0.002  # the guard's own time: 2 ms
    return out


def rendered(names: tuple[str, ...], width: int, **kw: bool) -> str:
    out = io.StringIO()
    render(make_report("stragglers", runs(names, **kw)), Console(file=out, width=width, highlight=False))
    return out.getvalue()


SPIKE_ONLY = ("queue back", "after spike", "refused", "/metrics")
"""The queue's recovery after a spike, refusals by admission and server hints' polls: columns left out (all '-')
for the stragglers reports rendered here."""


def headers() -> list[str]:
    lines = [line for section in SECTIONS for c in section.columns for line in c.header.split("\n")]
    return [line for line in lines if line not in SPIKE_ONLY]


@pytest.mark.parametrize("names", [FOUR, SIX], ids=["4 clients", "6 clients"])
@pytest.mark.parametrize("width", [80, 60])
def test_fits_the_width_and_cuts_nothing(names: tuple[str, ...], width: int) -> None:
    text = rendered(names, width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, max(lines, key=len)
    assert "…" not in text
    for section in SECTIONS:
        assert section.title in text
    for header in headers():
        assert header in text, header
    for name in names:  # a client's name is never wrapped or cut
        assert re.search(rf"^{re.escape(name)} ", text, re.MULTILINE), name
    guarded = sum(n.startswith("guarded") for n in names)
    assert text.count("  ÷ plain") >= 2 * guarded  # latency + load (more when a section continues)


def test_a_narrow_console_continues_a_section_instead_of_squeezing_it() -> None:
    report = make_report("stragglers", runs(FOUR))
    console = Console(file=io.StringIO(), width=50)
    latency = next(s for s in SECTIONS if s.title.startswith("Latency"))
    tables = section_tables(latency, report, console)
    assert len(tables) == 2 and sum(len(t.columns) - 1 for t in tables) == 6  # the client column, repeated
    text = rendered(FOUR, 50)
    assert "Latency of successful requests (continued)" in text
    assert max(len(line) for line in text.splitlines()) <= 50


def test_columns_nobody_has_are_left_out() -> None:
    text = rendered(("plain", "naive-retry"), 80, with_server=False)  # a --target without /sim/stats
    assert "server req" not in text and "wasted" not in text and "loser" not in text
    assert "attempts" in text and "server counters" not in text


def test_the_metrics_polls_column_shows_only_when_a_client_polled() -> None:
    assert "/metrics" not in rendered(("plain", "guarded"), 80)
    polled = runs(("plain", "guarded-hints"))
    assert polled[1].server is not None
    polled[1].server.replicas.append({"received": 0, "metrics_requests": 25})  # 25 polls over 10 calls
    out = io.StringIO()
    render(make_report("stragglers", polled), Console(file=out, width=80, highlight=False))
    section = out.getvalue().split("Load on the servers\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert section[0].split() == ["attempts", "server", "req", "/metrics"]  # the two-line headers' first lines
    rows = {line.split()[0]: line.split()[3] for line in section[3:5]}  # client, attempts, server req, /metrics
    assert rows == {"plain": "-", "guarded-hints": "2.50"}


def test_verdict_per_client_and_the_pointer_to_the_glossary() -> None:
    text = " ".join(rendered(FOUR, 80).split())
    for name in FOUR[1:]:
        assert f"=> {name} " in text
    assert "Worst regression:" in text
    assert text.rstrip().endswith("Every figure is defined by: llmguard bench --explain")


def test_piped_output_is_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert make_console(io.StringIO()).width == 80
    monkeypatch.setenv("COLUMNS", "100")
    assert make_console(io.StringIO()).width == 100


def test_the_header_says_what_the_scenario_models_and_how_far_the_generator_fell_behind() -> None:
    from llmguard_tools.sim.scenarios import SCENARIOS

    text = " ".join(rendered(FOUR, 80).split())
    assert f"scenario stragglers: {SCENARIOS['stragglers'].summary}" in text
    assert (
        "on plan generator behind plan by at most: plain 0.00 s, openai-default 0.00 s, naive-retry 0.00 s, "
        "guarded 0.00 s (over 0.50 s: INVALID, no verdict)"
    ) in text
    assert "INVALID the load generator" not in text


def test_an_invalid_run_is_marked_at_the_top_and_has_no_verdict() -> None:
    bad = runs(FOUR)
    bad[3].behind = 18.06
    out = io.StringIO()
    render(make_report("stragglers", bad), Console(file=out, width=80, highlight=False))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[1].startswith("INVALID the load generator fell behind plan by up to 18.06 s (guarded)")
    text = " ".join(out.getvalue().split())
    assert "=> NO VERDICT: this run is INVALID" in text and "=> guarded" not in text


def test_a_baseline_whose_generator_fell_behind_is_left_out_and_the_run_keeps_its_verdict() -> None:
    """A retrying baseline can starve its own replay under overload; plain and guarded ran on plan."""
    lagging = runs(FOUR)
    assert lagging[2].name == "naive-retry"
    lagging[2].behind = 1.8
    report = make_report("stragglers", lagging)
    assert report.invalid is None and report.left_out == {"naive-retry": 1.8}
    assert set(report.verdicts()) == {"openai-default", "guarded"}
    assert "naive-retry" not in report.verdicts()["guarded"]
    out = io.StringIO()
    render(report, Console(file=out, width=80, highlight=False))
    text = " ".join(out.getvalue().split())
    assert "left out naive-retry: its load generator fell behind plan by 1.80 s (over 0.50 s)" in text
    assert "=> guarded" in text and "INVALID the load generator" not in text
