"""``--plot``: complementary CDFs on log-log axes; failures keep the curve above zero."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmguard_tools.bench.plot import ccdf, plot_latency
from tests.bench.reports import TTFTS, make_report, mixed_run


def test_ccdf_is_the_share_of_requests_at_least_that_slow() -> None:
    xs, ys = ccdf(mixed_run(), "ttft")
    assert xs == sorted(TTFTS)
    # 10 requests: 7 successes, 3 failures that never get a first token, so the curve ends at 0.4, not 0.1
    assert ys == pytest.approx([1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4])


def test_plot_writes_a_png_with_log_axes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.figure

    scales: list[tuple[str, str]] = []
    save = matplotlib.figure.Figure.savefig

    def spy(fig: matplotlib.figure.Figure, *args: object, **kwargs: object) -> None:
        scales.extend((ax.get_xscale(), ax.get_yscale()) for ax in fig.axes)
        save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    png = tmp_path / "tails.png"
    plot_latency([make_report(), make_report("overload")], str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert scales == [("log", "log")] * 4  # two reports, TTFT and e2e
