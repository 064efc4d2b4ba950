"""``--plot``: the latency tail of every client, as complementary CDFs on log-log axes.

Each curve is the share of logical requests still without a first token (or without their end) after
``x`` seconds. On log axes the tail is spread out: p50, p95 and p99 are the curve's crossings of the 0.5,
0.05 and 0.01 guides, and a curve that levels off above them instead of falling is the share of requests
that never completed (failures and timeouts count as never arriving).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from llmguard_tools.bench.runner import ClientRun

if TYPE_CHECKING:
    from llmguard_tools.bench.report import BenchReport

__all__ = ["ccdf", "plot_latency"]

_GUIDES = ((0.5, "p50"), (0.05, "p95"), (0.01, "p99"))


def ccdf(run: ClientRun, metric: str) -> tuple[list[float], list[float]]:
    """``(x, y)``: for each successful request's ``metric`` (``ttft`` or ``e2e``) in increasing order, the
    share of all logical requests whose value is at least that (failed requests count as infinite)."""
    n = len(run.samples)
    values = sorted(v for s in run.samples if s.ok and (v := getattr(s, metric)) is not None)
    return values, [(n - i) / n for i in range(len(values))]


def plot_latency(reports: Sequence[BenchReport], path: str) -> None:
    """One row per report, TTFT and e2e panels, one line per client; written as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(len(reports), 2, figsize=(11, 4.4 * len(reports)), squeeze=False)
    for row, report in zip(axes, reports, strict=True):
        floor = 1.0
        for ax, metric, label in ((row[0], "ttft", "time to first token"), (row[1], "e2e", "end to end")):
            for run in report.runs:
                xs, ys = ccdf(run, metric)
                if not xs:
                    continue
                ok = len(xs) / len(run.samples)
                ax.step(xs, ys, where="post", label=f"{run.name} (success {ok:.1%})")
                floor = min(floor, 1 / len(run.samples))
            for level, name in _GUIDES:
                ax.axhline(level, color="grey", linestyle=":", linewidth=0.8)
                ax.annotate(name, (1.0, level), xycoords=("axes fraction", "data"), xytext=(2, 0),
                            textcoords="offset points", va="center", fontsize=7, color="grey")  # fmt: skip
            if metric == "ttft":
                ax.axvline(report.slo.ttft, color="tab:red", linestyle="--", linewidth=0.8, label="TTFT SLO")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # no overlapping labels on sub-decade ranges
            ax.set_ylim(floor / 1.5, 1.1)
            ax.set_xlabel(f"{label} x (s, log scale)")
            ax.set_ylabel("share of requests slower than x (log)")
            ax.grid(True, which="major", alpha=0.3)
            ax.set_title(f"{report.title}: {label}")
            ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
