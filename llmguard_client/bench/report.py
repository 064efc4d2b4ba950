"""Turn per-request samples and server counters into the side-by-side report (table, JSON, CDF plot).

Definitions (all per client, over the same planned traffic):

* success ratio   requests that streamed to ``[DONE]`` with HTTP 200 / logical requests.
* goodput         successful requests with TTFT <= ``slo.ttft`` and TPOT <= ``slo.tpot`` / logical requests
                  (the seed's definition: good completions over arrivals).
* timeout ratio   client-side timeouts (harness deadline, httpx/SDK/guard timeouts) plus 408/504 answers.
* 429 ratio       requests whose final answer was HTTP 429.
* latency         TTFT / e2e / TPOT percentiles over *successful* requests (the CDF plot shows all
                  requests: failures never reach 1, so the curve tops out at the success ratio).
* percentiles     linear interpolation between closest ranks (numpy's default; the seed's
                  ``percentile``), p in [0, 100].
* amplification   sum of the replicas' ``received`` / logical requests (server-side), plus the
                  client-side attempts / logical requests where the client can count them.
* wasted tokens   ``aborted_work_tokens`` (work done for requests whose client went away: hedge losers,
                  timeouts), also as a % of ``work_tokens``; loser aborts = ``aborted_by_disconnect``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import IO, TYPE_CHECKING, Any

from llmguard_client._quantile import percentile
from llmguard_client.bench.clients import Sample, TierSpec
from llmguard_client.bench.runner import COUNTERS_NOTE, ClientRun, CountersMode
from llmguard_client.bench.traffic import TrafficPlan

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID


@dataclass(frozen=True)
class SLO:
    """Goodput thresholds in seconds: TTFT <= ttft and TPOT <= tpot."""

    ttft: float = 1.0
    tpot: float = 0.08


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


PCTS = (50, 95, 99)


@dataclass
class ClientSummary:
    client: str
    n: int
    ok: int
    success_ratio: float
    goodput: int
    goodput_ratio: float
    goodput_rps: float
    timeout_ratio: float
    ratio_429: float
    other_error_ratio: float
    ttft: dict[str, float | None]
    e2e: dict[str, float | None]
    tpot: dict[str, float | None]
    failure_latency: dict[str, float | None]
    """Time to a failed answer minus the waits the client chose to honour (guarded: Retry-After/backoff)."""
    failure_own_time: dict[str, float | None]
    """guarded: time to a failed answer minus honoured waits minus time with an attempt in flight."""
    completion_tokens: int
    wall_s: float
    client_attempts: int | None
    client_amplification: float | None
    server_received: float | None = None
    amplification: float | None = None
    server_rejected: float | None = None
    work_tokens: float | None = None
    wasted_tokens: float | None = None
    wasted_pct: float | None = None
    loser_aborts: float | None = None
    preemptions: float | None = None
    server_drained: bool | None = None
    status_counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(run: ClientRun, slo: SLO) -> ClientSummary:
    samples = run.samples
    n = len(samples)
    ok = [s for s in samples if s.ok]
    good = [
        s
        for s in ok
        if s.ttft is not None
        and s.ttft <= slo.ttft
        and (s.tpot if s.tpot is not None else math.inf) <= slo.tpot
    ]
    timeouts = sum(1 for s in samples if s.status == "timeout" or s.http_status in (408, 504))
    r429 = sum(1 for s in samples if s.http_status == 429)
    counts: dict[str, int] = {}
    for s in samples:
        counts[s.status] = counts.get(s.status, 0) + 1
    ttfts = [s.ttft for s in ok if s.ttft is not None]
    e2es = [s.e2e for s in ok]
    tpots = [t for s in ok if (t := s.tpot) is not None]
    failed = [s.e2e - (s.waited or 0.0) for s in samples if not s.ok]
    own = [s.e2e - (s.waited or 0.0) - s.in_attempts for s in samples if not s.ok and s.in_attempts is not None]
    known_attempts = [s.attempts for s in samples if s.attempts is not None]
    client_attempts = sum(known_attempts) if len(known_attempts) == n and n else None
    summary = ClientSummary(
        client=run.name,
        n=n,
        ok=len(ok),
        success_ratio=len(ok) / n if n else 0.0,
        goodput=len(good),
        goodput_ratio=len(good) / n if n else 0.0,
        goodput_rps=len(good) / run.wall if run.wall > 0 else 0.0,
        timeout_ratio=timeouts / n if n else 0.0,
        ratio_429=r429 / n if n else 0.0,
        other_error_ratio=(n - len(ok) - timeouts - r429) / n if n else 0.0,
        ttft={f"p{p}": percentile(ttfts, p) for p in PCTS},
        e2e={f"p{p}": percentile(e2es, p) for p in PCTS},
        tpot={f"p{p}": percentile(tpots, p) for p in PCTS},
        failure_latency={f"p{p}": percentile(failed, p) for p in (*PCTS, 100)},
        failure_own_time={f"p{p}": percentile(own, p) for p in (*PCTS, 100)},
        completion_tokens=sum(s.completion_tokens for s in ok),
        wall_s=run.wall,
        client_attempts=client_attempts,
        client_amplification=_ratio(client_attempts, n) if client_attempts is not None else None,
        status_counts=dict(sorted(counts.items())),
        notes=list(run.notes),
    )
    if run.server is not None:
        srv = run.server
        summary.server_received = srv.total("received")
        summary.amplification = _ratio(summary.server_received, n)
        summary.server_rejected = srv.total("rejected")
        summary.work_tokens = srv.total("work_tokens")
        summary.wasted_tokens = srv.total("aborted_work_tokens")
        summary.wasted_pct = (
            _ratio(summary.wasted_tokens * 100.0, summary.work_tokens) if summary.work_tokens else 0.0
        )
        summary.loser_aborts = srv.total("aborted_by_disconnect")
        summary.preemptions = srv.total("preemptions")
        summary.server_drained = srv.drained
    return summary


LATENCY_KEYS = tuple(f"{m}_p{p}" for m in ("ttft", "e2e") for p in PCTS)


def _latency(s: ClientSummary, key: str) -> float | None:
    metric, p = key.split("_")
    value: float | None = getattr(s, metric)[p]
    return value


@dataclass
class BenchReport:
    title: str
    plan: TrafficPlan
    slo: SLO
    tier: TierSpec
    counters: CountersMode
    model: str
    runs: list[ClientRun]
    scenario: str | None = None
    target: list[str] = field(default_factory=list)
    summaries: list[ClientSummary] = field(init=False)

    def __post_init__(self) -> None:
        self.summaries = [summarize(r, self.slo) for r in self.runs]

    def summary(self, client: str) -> ClientSummary | None:
        return next((s for s in self.summaries if s.client == client), None)

    @property
    def baseline(self) -> ClientSummary | None:
        return self.summary("plain")

    def ratios(self) -> dict[str, dict[str, float | None]]:
        """``"<client>/plain"`` -> latency-percentile ratios, plus amplification and goodput ratios."""
        base = self.baseline
        if base is None:
            return {}
        out: dict[str, dict[str, float | None]] = {}
        for s in self.summaries:
            if s is base:
                continue
            r: dict[str, float | None] = {k: _ratio(_latency(s, k), _latency(base, k)) for k in LATENCY_KEYS}
            r["amplification"] = _ratio(s.amplification, base.amplification)
            r["goodput"] = _ratio(s.goodput_ratio, base.goodput_ratio)
            out[f"{s.client}/{base.client}"] = r
        return out

    def interpretation(self) -> str:
        return interpret(self)

    def to_dict(self, *, samples: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "title": self.title,
            "scenario": self.scenario,
            "target": self.target,
            "model": self.model,
            "counters": self.counters,
            "counters_note": COUNTERS_NOTE[self.counters],
            "plan": self.plan.to_dict(),
            "slo": asdict(self.slo),
            "tier": asdict(self.tier),
            "clients": {s.client: s.to_dict() for s in self.summaries},
            "ratios": self.ratios(),
            "interpretation": self.interpretation(),
        }
        d["server_replicas"] = {
            r.name: None if r.server is None else [_flat(x) for x in r.server.replicas] for r in self.runs
        }
        if samples:
            d["samples"] = {r.name: [s.to_dict() for s in r.samples] for r in self.runs}
        return d


def _flat(stats: dict[str, Any]) -> dict[str, Any]:
    """A replica's counters (numbers only, nested dicts such as fault counts kept as they are)."""
    return {k: v for k, v in stats.items() if isinstance(v, (int, float, dict))}


# ---------------------------------------------------------------- interpretation


def fmt_ratio(r: float) -> str:
    """0.111 -> '1/9', 0.6 -> '0.60x', 2.5 -> '2.50x'."""
    if r <= 0:
        return "0x"
    if r < 0.5:
        return f"1/{round(1 / r)}"
    return f"{r:.2f}x"


def fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def _pick_challenger(report: BenchReport) -> ClientSummary | None:
    for name in ("guarded", "guarded-nohedge", "guarded-noretry"):
        s = report.summary(name)
        if s is not None:
            return s
    others = [s for s in report.summaries if s.client != "plain"]
    return others[0] if others else None


def _load(g: ClientSummary, b: ClientSummary) -> tuple[float | None, str]:
    if g.amplification is not None and b.amplification is not None:
        return _ratio(g.amplification, b.amplification), "the server load"
    if g.client_amplification is not None and b.client_amplification is not None:
        return _ratio(g.client_amplification, b.client_amplification), "the attempts"
    return None, "the load"


def interpret(report: BenchReport) -> str:
    """One line computed from the numbers: latency headline, or goodput headline under overload."""
    b, g = report.baseline, _pick_challenger(report)
    if b is None or g is None:
        return "(add the plain client to compare against a baseline)"
    load, what = _load(g, b)
    load_s = f"{load:.2f}x {what}" if load is not None else "unknown server load"
    overloaded = report.scenario == "overload" or (b.success_ratio < 0.9 and report.scenario != "stragglers")
    if overloaded:
        amp = (
            f"amplification {g.amplification:.2f} vs {b.amplification:.2f}"
            if g.amplification is not None and b.amplification is not None
            else f"attempts {load_s}"
        )
        gp = _ratio(g.goodput_ratio, b.goodput_ratio)
        gp_s = f" ({gp:.2f}x)" if gp is not None else ""
        wasted = (
            f", wasted work {g.wasted_pct:.1f}% vs {b.wasted_pct:.1f}%"
            if g.wasted_pct is not None and b.wasted_pct is not None
            else ""
        )
        return (
            f"{g.client} goodput {g.goodput_ratio:.1%} vs {b.client} {b.goodput_ratio:.1%}{gp_s}, "
            f"timeouts {g.timeout_ratio:.1%} vs {b.timeout_ratio:.1%}, "
            f"429s {g.ratio_429:.1%} vs {b.ratio_429:.1%}, "
            f"{amp}{wasted}"
        )
    gt, bt = g.ttft["p99"], b.ttft["p99"]
    r = _ratio(gt, bt)
    if r is None:
        return (
            f"{g.client} vs {b.client}: no successful requests to compare TTFT "
            f"(success {g.success_ratio:.0%} vs {b.success_ratio:.0%})"
        )
    head = f"{g.client} TTFT p99 is {fmt_ratio(r)} of {b.client}'s ({fmt_s(gt)} vs {fmt_s(bt)}) at {load_s}"
    return f"{head}; goodput {g.goodput_ratio:.1%} vs {b.goodput_ratio:.1%}"


# ---------------------------------------------------------------- rich output


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _num(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def _rows(report: BenchReport) -> list[tuple[str, list[str]]]:
    slo = report.slo
    S = report.summaries

    def row(label: str, f: Any) -> tuple[str, list[str]]:
        return label, [f(s) for s in S]

    rows = [
        row("requests", lambda s: str(s.n)),
        row("success", lambda s: _pct(s.success_ratio)),
        row(
            f"goodput (TTFT<={fmt_s(slo.ttft)}, TPOT<={slo.tpot * 1000:.0f} ms)",
            lambda s: _pct(s.goodput_ratio),
        ),
        row("timeouts", lambda s: _pct(s.timeout_ratio)),
        row("429s", lambda s: _pct(s.ratio_429)),
        row("other errors", lambda s: _pct(s.other_error_ratio)),
    ]
    for metric in ("ttft", "e2e"):
        for p in PCTS:
            label = f"{'TTFT' if metric == 'ttft' else 'e2e'} p{p}"
            rows.append(row(label, lambda s, m=metric, p=p: fmt_s(getattr(s, m)[f"p{p}"])))
    rows += [
        row("TPOT p50 / p99", lambda s: f"{fmt_s(s.tpot['p50'])} / {fmt_s(s.tpot['p99'])}"),
        row(
            "failed: time to answer p50 / p99 / max (minus honoured waits)",
            lambda s: " / ".join(fmt_s(s.failure_latency[k]) for k in ("p50", "p99", "p100")),
        ),
        row(
            "failed: client's own time p50 / p99 / max (minus waits and attempts)",
            lambda s: " / ".join(fmt_s(s.failure_own_time[k]) for k in ("p50", "p99", "p100")),
        ),
        row("client attempts / request", lambda s: _num(s.client_amplification, 2)),
        row("server received / request", lambda s: _num(s.amplification, 2)),
        row("server rejected", lambda s: _num(s.server_rejected)),
        row("work tokens", lambda s: _num(s.work_tokens)),
        row(
            "wasted tokens (% of work)",
            lambda s: (
                "-" if s.wasted_tokens is None else f"{s.wasted_tokens:,.0f} ({s.wasted_pct or 0:.1f}%)"
            ),
        ),
        row("loser aborts", lambda s: _num(s.loser_aborts)),
        row("preemptions", lambda s: _num(s.preemptions)),
    ]
    return rows


def build_table(report: BenchReport) -> Any:
    from rich.table import Table

    ratios = {k: v for k, v in report.ratios().items() if k.startswith("guarded")}
    table = Table(title=f"llmguard bench: {report.title}", title_justify="left")
    table.add_column("metric", style="bold")
    for s in report.summaries:
        table.add_column(s.client, justify="right")
    for name in ratios:
        table.add_column(name, justify="right", style="cyan")
    latency_rows = {
        f"{'TTFT' if m == 'ttft' else 'e2e'} p{p}": f"{m}_p{p}" for m in ("ttft", "e2e") for p in PCTS
    }
    for label, cells in _rows(report):
        extra: list[str] = []
        for r in ratios.values():
            key = latency_rows.get(label)
            if key is None and label == "server received / request":
                key = "amplification"
            v = r.get(key) if key else None
            extra.append("" if v is None else f"{v:.2f}x")
        table.add_row(label, *cells, *extra)
    return table


def render(report: BenchReport, console: Console) -> None:
    console.print(f"[bold]{report.title}[/bold]: {report.plan.describe()}")
    console.print(
        f"model {report.model}; tier ttft {report.tier.ttft:g} s / total {report.tier.total:g} s / "
        f"stall {report.tier.stall if report.tier.stall is not None else '-'} s; "
        f"SLO TTFT <= {report.slo.ttft:g} s, TPOT <= {report.slo.tpot * 1000:g} ms; "
        f"{COUNTERS_NOTE[report.counters]}"
    )
    console.print(build_table(report))
    for s in report.summaries:
        for note in s.notes:
            console.print(f"[yellow]note[/yellow] {s.client}: {note}")
    console.print(f"[bold green]=>[/bold green] {report.interpretation()}")


def make_console(stream: IO[str] | None = None, *, stderr: bool = False) -> Console:
    from rich.console import Console

    console = Console(file=stream, stderr=stderr, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 160  # piped or redirected: do not squeeze the table into 80 columns
    return console


# ---------------------------------------------------------------- progress


class RichProgress:
    """A rich progress bar per client (on stderr), fed by the runner's `ProgressSink` calls."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress: Progress = Progress(
            TextColumn("[bold]{task.description:<16}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            console=console or make_console(stderr=True),
            transient=False,
        )
        self._task: TaskID | None = None
        self._ok = 0
        self._failed = 0

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def begin(self, client: str, total: int) -> None:
        self._ok = self._failed = 0
        self._task = self._progress.add_task(client, total=total, status="")

    def advance(self, sample: Sample) -> None:
        if self._task is None:
            return
        if sample.ok:
            self._ok += 1
        else:
            self._failed += 1
        self._progress.update(self._task, advance=1, status=f"ok {self._ok}  failed {self._failed}")

    def end(self, client: str) -> None:
        self._task = None


# ---------------------------------------------------------------- plot


def plot_cdfs(reports: Sequence[BenchReport], path: str) -> None:
    """Latency CDFs, one line per client; TTFT and e2e panels; one row per report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(len(reports), 2, figsize=(11, 4.2 * len(reports)), squeeze=False)
    for row, report in zip(axes, reports, strict=True):
        for ax, metric, label in ((row[0], "ttft", "TTFT"), (row[1], "e2e", "end-to-end")):
            for run in report.runs:
                n = len(run.samples)
                values = sorted(
                    v
                    for s in run.samples
                    if s.ok and (v := (s.ttft if metric == "ttft" else s.e2e)) is not None
                )
                if not values or not n:
                    continue
                ys = [(i + 1) / n for i in range(len(values))]
                ax.step(values, ys, where="post", label=f"{run.name} (ok {len(values) / n:.1%})")
            if metric == "ttft":
                ax.axvline(report.slo.ttft, color="grey", linestyle=":", linewidth=1, label="TTFT SLO")
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # no overlapping labels on sub-decade ranges
            ax.set_xlabel(f"{label} (s, log scale)")
            ax.set_ylabel("fraction of logical requests")
            ax.set_ylim(0, 1.02)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(f"{report.title}: {label}")
            ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
