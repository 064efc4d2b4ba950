"""The report on a terminal: short sections with one row per client, fitted to the console's width.

Clients are rows and metrics columns, so many clients make a table longer, not wider. A section whose
columns do not fit the width continues in a second table (`llmguard_tools.tables`, the layout ``llmguard
compare`` shares); a column no client has a figure for is left out (e.g. server counters against a target
without ``/sim/stats``). Headers are short; ``llmguard bench
--explain`` (`llmguard_tools.bench.glossary`) defines each one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from llmguard_tools.bench.formatting import fmt_count, fmt_pct, fmt_s, fmt_x
from llmguard_tools.bench.runner import COUNTERS_NOTE
from llmguard_tools.bench.summary import ClientSummary
from llmguard_tools.bench.tiermix import TierFigures
from llmguard_tools.bench.validity import tolerance
from llmguard_tools.tables import fit_columns

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from llmguard_tools.bench.report import BenchReport

__all__ = [
    "EXPLAIN_HINT",
    "SECTIONS",
    "Column",
    "Section",
    "hanging",
    "make_console",
    "render",
    "scenario_line",
    "section_tables",
]

EXPLAIN_HINT = "Every figure is defined by: llmguard bench --explain"


@dataclass(frozen=True)
class Column:
    """A metric column: a header (``\\n`` splits it over two lines) and the cell of one client."""

    header: str
    cell: Callable[[ClientSummary], str]
    ratio_key: str | None = None
    """Key of `BenchReport.ratios` shown in the ``÷ plain`` rows, if any."""


@dataclass(frozen=True)
class Section:
    title: str
    columns: tuple[Column, ...]


def _latency(metric: str, p: int) -> Column:
    label = {"ttft": "TTFT", "e2e": "e2e", "tpot": "TPOT"}[metric]
    key = f"{metric}_p{p}" if metric != "tpot" else None
    return Column(f"{label}\np{p}", lambda s: fmt_s(getattr(s, metric)[f"p{p}"]), key)


def _failed(field: str, label: str, p: str) -> Column:
    return Column(f"{label}\n{'max' if p == 'p100' else p}", lambda s: fmt_s(getattr(s, field)[p]))


def _queue_back(s: ClientSummary) -> str:
    q = s.queue_recovery
    if q is None:
        return "-"
    return f"{q.seconds:.1f} s" if q.seconds is not None else f"> {q.observed:.0f} s"


def _wasted(s: ClientSummary) -> str:
    return "-" if s.wasted_pct is None else f"{s.wasted_pct:.1f}%"


SECTIONS: tuple[Section, ...] = (
    Section(
        "Outcomes (share of the requests)",
        (
            Column("success", lambda s: fmt_pct(s.success_ratio)),
            Column("goodput", lambda s: fmt_pct(s.goodput_ratio)),
            Column("timeouts", lambda s: fmt_pct(s.timeout_ratio)),
            Column("429s", lambda s: fmt_pct(s.ratio_429)),
            Column("other\nerrors", lambda s: fmt_pct(s.other_error_ratio)),
        ),
    ),
    Section(
        "Latency of successful requests",
        tuple(_latency(m, p) for m in ("ttft", "e2e") for p in (50, 95, 99)),
    ),
    Section(
        "Stream pace, and time to learn of a failure",
        (
            _latency("tpot", 50),
            _latency("tpot", 99),
            _failed("failure_latency", "to fail", "p50"),
            _failed("failure_latency", "to fail", "p99"),
            _failed("failure_latency", "to fail", "p100"),
            _failed("failure_own_time", "own time", "p100"),
            _failed("refusal_latency", "refused", "p99"),
        ),
    ),
    Section(
        "Load on the servers",
        (
            Column("attempts\n/ call", lambda s: fmt_count(s.client_amplification, 2)),
            Column("server req\n/ call", lambda s: fmt_count(s.amplification, 2), "amplification"),
            Column("/metrics\n/ call", lambda s: fmt_count(s.metrics_polls, 2) if s.metrics_polls else "-"),
            Column("rejected", lambda s: fmt_count(s.server_rejected)),
            Column("preempted", lambda s: fmt_count(s.preemptions)),
        ),
    ),
    Section(
        "Server work, and the work wasted",
        (
            Column("work\ntokens", lambda s: fmt_count(s.work_tokens)),
            Column("wasted\ntokens", lambda s: fmt_count(s.wasted_tokens)),
            Column("wasted\n% work", _wasted),
            Column("loser\naborts", lambda s: fmt_count(s.loser_aborts)),
            Column("queue back\nafter spike", _queue_back),
        ),
    ),
)


def _ratio_rows(report: BenchReport) -> dict[str, dict[str, float | None]]:
    """client -> its ratios to plain, for the guarded clients (the ones a reader compares)."""
    return {name.split("/")[0]: r for name, r in report.ratios().items() if name.startswith("guarded")}


def _table(columns: list[Column], report: BenchReport) -> Table:
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1))
    table.add_column("client", no_wrap=True)
    for c in columns:
        table.add_column(c.header, justify="right", no_wrap=True)
    ratios = _ratio_rows(report) if any(c.ratio_key for c in columns) else {}
    for s in report.summaries:
        table.add_row(s.client, *(c.cell(s) for c in columns))
        r = ratios.get(s.client)
        if r is not None:
            cells = [fmt_x(r.get(c.ratio_key)) if c.ratio_key else "" for c in columns]
            table.add_row("  ÷ plain", *cells, style="cyan")
    return table


def _width(console: Console, table: Table) -> int:
    from rich.measure import Measurement

    # Measured without the console's limit: a table wider than the console would be squeezed to fit it.
    return Measurement.get(console, console.options.update_width(10_000), table).maximum


def section_tables(section: Section, report: BenchReport, console: Console) -> list[Table]:
    """The section as one table, or several when its columns do not fit ``console.width``."""
    columns = [c for c in section.columns if any(c.cell(s) != "-" for s in report.summaries)]
    groups = fit_columns(columns, lambda group: _width(console, _table(group, report)) <= console.width)
    return [_table(group, report) for group in groups]


def _preamble(report: BenchReport) -> Table:
    from rich.table import Table

    tier, slo = report.tier, report.slo
    stall = f"{tier.stall:g} s" if tier.stall is not None else "none"
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column()
    load, sizes, seed = ([*report.plan.describe().split("; "), "", ""])[:3]
    for key, value in (
        ("scenario", scenario_line(report.scenario)),
        ("traffic", f"{load} ({seed})" if seed else load),
        ("sizes", sizes),
        ("model", report.model),
        ("guard tier", f"TTFT {tier.ttft:g} s, total {tier.total:g} s, stall {stall}"),
        ("server hints", _hints(report)),
        ("goodput SLO", f"TTFT <= {slo.ttft:g} s and TPOT <= {slo.tpot * 1000:g} ms"),
        ("servers", COUNTERS_NOTE[report.counters].removeprefix("server counters: ")),
        ("on plan", _on_plan(report)),
    ):
        if not value:
            continue
        grid.add_row(key, value)
    return grid


def _hints(report: BenchReport) -> str:
    """How often guarded-hints polled the replicas' /metrics, when it ran."""
    if not any(r.name == "guarded-hints" for r in report.runs):
        return ""
    every = "at the poller's default rate" if report.hints_every is None else f"every {report.hints_every:g} s"
    return f"guarded-hints reads each replica's /metrics {every}"


def _on_plan(report: BenchReport) -> str:
    """How far the load generator fell behind plan, against the tolerance (`llmguard_tools.bench.validity`)."""
    if report.plan.mode == "closed" or not report.runs:
        return ""
    each = ", ".join(f"{r.name} {r.behind:.2f} s" for r in report.runs)
    return f"generator behind plan by at most: {each} (over {tolerance(report.tier):.2f} s: INVALID, no verdict)"


def tier_line(tiers: dict[str, TierFigures]) -> str:
    """``interactive 490 calls: good 61.0 %, completed 61.2 %; batch ...`` (``--tier-mix``)."""
    return "; ".join(
        f"{name} {f.calls} calls: good {100 * f.good:.1f} %, completed {100 * f.completed:.1f} %"
        for name, f in tiers.items()
    )


def render(report: BenchReport, console: Console, *, explain_hint: bool = True) -> None:
    """The report's header, its sections, the runs' notes and one verdict per client against plain."""
    console.print(f"[bold]llmguard bench: {report.title}[/bold]")
    if report.invalid is not None:
        console.print(hanging("[bold red]INVALID[/bold red]", [f"{report.invalid}; no verdict below."]))
    console.print(_preamble(report))
    for section in SECTIONS:
        for i, table in enumerate(section_tables(section, report, console)):
            console.print()
            console.print(f"[bold]{section.title}[/bold]{' (continued)' if i else ''}")
            console.print(table)
    console.print()
    for s in report.summaries:
        for note in s.notes:
            console.print(f"[yellow]note[/yellow] {s.client}: {note}")
        if s.tiers:
            console.print(f"tiers {s.client}: {tier_line(s.tiers)}", highlight=False)
    for client, behind in report.left_out.items():
        console.print(
            hanging(
                "[yellow]left out[/yellow]",
                [
                    f"{client}: its load generator fell behind plan by {behind:.2f} s "
                    f"(over {tolerance(report.tier):.2f} s), so its figures above describe a starved generator; "
                    "it is not compared below"
                ],
            )
        )
    if report.invalid is not None:
        console.print(hanging("[bold red]=>[/bold red]", [report.interpretation()]))
    else:
        console.print(hanging("[bold green]=>[/bold green]", report.verdicts().values()))
    if explain_hint:
        console.print(f"[dim]{EXPLAIN_HINT}[/dim]")


def scenario_line(name: str | None) -> str:
    """``stragglers: 5 % of requests stall ...``: what a simulated scenario models ('' without one)."""
    if not name:
        return ""
    try:
        from llmguard_tools.sim.scenarios import SCENARIOS
    except ImportError:
        return name
    scenario = SCENARIOS.get(name)
    return f"{name}: {scenario.summary}" if scenario is not None and scenario.summary else name


def hanging(label: str, paragraphs: Iterable[str]) -> Table:
    """``label`` before each paragraph, continuation lines indented under the text (a two-column grid)."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for text in paragraphs:
        grid.add_row(label, text)
    return grid


def make_console(stream: IO[str] | None = None, *, stderr: bool = False) -> Console:
    """A console for the report; 80 columns when not a terminal (a file, a pipe) unless COLUMNS says."""
    from rich.console import Console

    console = Console(file=stream, stderr=stderr, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 80
    return console
