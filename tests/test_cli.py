"""``llmguard`` CLI: bad input gives one stderr line and exit 2; --json and --plot write files."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmguard_tools import cli
from llmguard_tools.bench import commands, presets
from tests.loopback import LoopbackCluster


def _has_guard() -> bool:
    mod = importlib.import_module("llmguard_client")
    return hasattr(mod, "Guard") and hasattr(mod, "Tier")


SMALL = ["--requests", "20", "--rate", "100", "--length-scale", "0.02", "--no-progress"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "required"),
        (["bench"], "one of the arguments --target --sim is required"),
        (["bench", "--sim", "no-such-scenario"], "scenario"),
        (["bench", "--target", "http://127.0.0.1:1"], "cannot reach http://127.0.0.1:1"),
        (["bench", "--target", "localhost:8000"], "not an http:// or https:// URL"),
        (["bench", "--target", "http://127.0.0.1:1", "--rate", "0"], "--rate: must be > 0"),
        (["bench", "--target", "http://127.0.0.1:1", "--rate", "-2"], "--rate: must be > 0"),
        (["bench", "--target", "http://127.0.0.1:1", "--rate", "abc"], "expected a number"),
        (["bench", "--target", "http://127.0.0.1:1", "--clients", "plain,bogus"], "unknown client 'bogus'"),
        (["bench", "--target", "http://127.0.0.1:1", "--requests", "0"], "--requests: must be >= 1"),
        (["bench", "--target", "http://127.0.0.1:1", "--profile", "zigzag"], "unknown profile 'zigzag'"),
        (["bench", "--target", "http://x:1", "--sim", "overload"], "not allowed with argument"),
        (["bench", "--target", "http://127.0.0.1:1", "--reuse-cluster"], "--reuse-cluster needs --sim"),
        (["bench", "--target", "http://127.0.0.1:1", "--hints-every", "0.1"], "--hints-every needs the guarded-hints"),
        (
            ["bench", "--target", "http://127.0.0.1:1", "--clients", "guarded-hints", "--hints-every", "0.05"],
            "--hints-every: must be at least 0.1 seconds, got 0.05",
        ),
        (["bench", "--target", "http://127.0.0.1:1", "--json", "/no/such/dir/x.json"], "does not exist"),
        (["bench", "--target", "http://127.0.0.1:1", "--unknown-flag"], "unrecognized arguments"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("llmguard: error: ")
    assert needle in lines[0]
    assert "Traceback" not in err


def test_tier_ttft_above_total(cluster: LoopbackCluster, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["bench", "--target", cluster.urls[0], "--tier-ttft", "5", "--tier-total", "2", *SMALL])
    assert rc == 2
    assert "must not exceed --tier-total" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("fleet", "needle"),
    [
        ("http://not-redis:6379", "has scheme 'http'; accepted: redis, rediss"),
        ("redis://:secret@host:99999", "is malformed (Port out of range"),
        ("redis://host/abc", "the path must be a database number such as /0, got /abc"),
    ],
)
def test_a_bad_fleet_url_is_refused_before_any_request_is_sent(
    cluster: LoopbackCluster, fleet: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--fleet`` was checked when the first guarded client was built: the baselines had sent their whole load
    by then, and the run ended with status 1 and no report."""
    rc = cli.main(["bench", "--target", cluster.urls[0], "--clients", "plain,guarded", "--fleet", fleet, *SMALL])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("llmguard: error: argument --fleet: ") and err.count("\n") == 1
    assert needle in err and "'auto'" in err and "secret" not in err
    assert sum(s.counters["received"] for s in cluster.servers) == 0


def test_process_exit_code_and_no_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "llmguard_tools.cli", "bench", "--target", "http://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("llmguard: error: cannot reach")


def test_bench_writes_json_and_plot(
    cluster: LoopbackCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    js, png = tmp_path / "r.json", tmp_path / "cdf.png"
    argv = ["bench", "--target", ",".join(cluster.urls), "--clients", "plain,naive-retry"]
    rc = cli.main([*argv, *SMALL, "--seed", "3", "--json", str(js), "--plot", str(png)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(js.read_text())
    assert list(doc["clients"]) == ["plain", "naive-retry"]
    assert doc["plan"]["n"] == 20 and doc["plan"]["seed"] == 3 and doc["counters"] == "reset"
    for name in ("plain", "naive-retry"):
        c = doc["clients"][name]
        assert c["n"] == 20 and c["success_ratio"] == 1.0 and c["amplification"] == 1.0
        assert c["ttft"]["p99"] is not None and len(doc["samples"][name]) == 20
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "plain" in out and "naive-retry" in out and "Latency of successful requests" in out


def test_json_to_stdout_keeps_stdout_machine_readable(
    cluster: LoopbackCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "--target", cluster.urls[0], "--clients", "plain", *SMALL, "--json", "-"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["clients"]["plain"]["n"] == 20
    assert "Latency of successful requests" in err  # the human tables went to stderr


def test_closed_loop_and_profile_via_cli(cluster: LoopbackCluster, capsys: pytest.CaptureFixture[str]) -> None:
    base = [
        "bench",
        "--target",
        cluster.urls[0],
        "--clients",
        "plain",
        "--no-progress",
        "--length-scale",
        "0.02",
    ]
    assert cli.main([*base, "--requests", "12", "--concurrency", "3", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["mode"] == "closed" and doc["plan"]["concurrency"] == 3
    assert cli.main([*base, "--requests", "30", "--profile", "spike", "--rate", "60", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["mode"] == "profile" and doc["plan"]["profile"][1][0] == pytest.approx(280)


def test_demo_runs_both_scenarios(
    cluster: LoopbackCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo's flow on the fake cluster standing in for the simulated one (small presets)."""

    @contextlib.contextmanager
    def fake_spawn(scenario: str, **kwargs: object) -> Iterator[list[str]]:
        yield cluster.urls

    monkeypatch.setattr(commands, "_sim_api", lambda scenario: fake_spawn)
    for name in presets.DEMO_SCENARIOS:
        monkeypatch.setitem(
            presets.PRESETS,
            name,
            presets.Preset(requests=15, rate=100.0, lengths=presets.SIM_LENGTHS.scaled(0.05), note=f"fake {name}"),
        )
    if not _has_guard():
        monkeypatch.setattr(presets, "DEMO_CLIENTS", dict.fromkeys(presets.DEMO_SCENARIOS, ("plain", "naive-retry")))
    js = tmp_path / "demo.json"
    assert cli.main(["demo", "--no-progress", "--json", str(js), "--plot", str(tmp_path / "d.png")]) == 0
    out = capsys.readouterr().out
    doc = json.loads(js.read_text())
    assert [r["scenario"] for r in doc["demo"]] == ["stragglers", "collapse"]
    assert "demo summary" in out and "stragglers: " in out and "collapse: " in out
    summary = " ".join(out.split("demo summary", 1)[1].split())
    for client in {c for clients in presets.DEMO_CLIENTS.values() for c in clients} - {"plain"}:
        assert f" {client} TTFT" in summary, client  # a verdict for every guarded client, not only the first
    assert [list(r["clients"]) for r in doc["demo"]] == [list(presets.DEMO_CLIENTS[s]) for s in presets.DEMO_SCENARIOS]
    assert out.count("llmguard bench --explain") == 1  # one pointer, after the summary
    assert (tmp_path / "d.png").exists()


def test_sim_missing_or_unknown_scenario_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--sim", "definitely-not-a-scenario", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "unknown scenario" in err or "needs the simulated cluster" in err


class _StallingProgress:
    """A progress sink that blocks the event loop for ``stall`` s shortly after each client's replay starts, as a
    starved machine would: the load generator really falls behind its plan. The stall is a loop timer due 50 ms
    in, earlier than the generator's later arrivals, so it lands inside the plan however slow the machine is
    (waiting for a first answer instead could come after the last arrival was sent)."""

    def __init__(self, stall: float) -> None:
        self.stall = stall

    def begin(self, client: str, total: int) -> None:
        asyncio.get_running_loop().call_later(0.05, time.sleep, self.stall)

    def advance(self, sample: object) -> None:
        pass

    def end(self, client: str) -> None:
        pass


def test_a_run_behind_plan_is_invalid_and_gets_no_verdict(
    cluster: LoopbackCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    @contextlib.contextmanager
    def stalling(enabled: bool) -> Iterator[_StallingProgress]:
        yield _StallingProgress(1.2)  # the default tier (TTFT 1 s) tolerates 0.5 s

    monkeypatch.setattr(commands, "_progress", stalling)
    js = tmp_path / "r.json"
    argv = ["bench", "--target", ",".join(cluster.urls), "--clients", "plain,naive-retry", *SMALL, "--json", str(js)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    doc = json.loads(js.read_text())
    assert doc["valid"] is False and doc["verdicts"] == {}
    assert min(doc["generator_behind_s"].values()) > 0.5
    text = " ".join(out.split())
    assert "INVALID the load generator fell behind plan by up to" in text
    assert "=> NO VERDICT: this run is INVALID" in text and "fewer calls/s" in text
    assert "=> naive-retry" not in text and "Worst regression" not in text


DEGRADED = (
    "llmguard: replica %s is degraded (ttft %s, per token %s, failures %.0f%%; median replica ttft %s, per token "
    "%s); drained: probed in %g s, then at most once per %g s"
)


class _LoggingProgress:
    """A progress sink that logs the router's degraded-replica warning through the library logger at each
    client's first answer, i.e. in the middle of the run; ``console`` is where rich would draw the bars."""

    def __init__(self, console: object = None) -> None:
        if console is not None:
            self.console = console
        self.first = False

    def begin(self, client: str, total: int) -> None:
        self.first = True

    def advance(self, sample: object) -> None:
        if self.first:
            self.first = False
            args = ("http://127.0.0.1:9", "812 ms", "95 ms", 0.0, "31 ms", "9 ms", 0.5, 2.0)
            logging.getLogger("llmguard_client").warning(DEGRADED, *args)

    def end(self, client: str) -> None:
        pass


def _bench_argv(cluster: LoopbackCluster) -> list[str]:
    clients = "plain,naive-retry,guarded" if _has_guard() else "plain,naive-retry"
    return ["bench", "--target", ",".join(cluster.urls), "--clients", clients, *SMALL]


def test_log_records_of_a_run_go_below_the_report_and_it_fits_80_columns(
    cluster: LoopbackCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    @contextlib.contextmanager
    def logging_progress(enabled: bool) -> Iterator[_LoggingProgress]:
        yield _LoggingProgress()  # no console: as with --no-progress

    monkeypatch.setattr(commands, "_progress", logging_progress)
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main(_bench_argv(cluster)) == 0
    out, err = capsys.readouterr()
    assert "degraded" not in err  # not left to Python's last-resort handler
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    start = next(i for i, line in enumerate(lines) if line.startswith("llmguard bench: "))
    end = next(i for i, line in enumerate(lines) if line.startswith("Every figure is defined by"))
    report, below = "\n".join(lines[start : end + 1]), " ".join(" ".join(lines[end + 1 :]).split())
    assert "degraded" not in report and "log " not in report
    assert "log warning llmguard_client: llmguard: replica http://127.0.0.1:9 is degraded" in below
    clients = _bench_argv(cluster)[4].count(",") + 1
    assert f"then at most once per 2 s (x{clients})" in below  # once per client, printed once with its count


def test_log_records_go_above_live_progress_bars(
    cluster: LoopbackCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rich.console import Console

    bars = io.StringIO()

    @contextlib.contextmanager
    def live(enabled: bool) -> Iterator[_LoggingProgress]:
        yield _LoggingProgress(Console(file=bars, width=80))

    monkeypatch.setattr(commands, "_progress", live)
    assert cli.main(_bench_argv(cluster)) == 0
    out, err = capsys.readouterr()
    assert "degraded" not in out and "degraded" not in err
    assert bars.getvalue().count("is degraded") == _bench_argv(cluster)[4].count(",") + 1


def test_top_level_help_lists_every_command_on_one_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "usage: llmguard [-h] {bench,demo,compare,rollout} ..."
    for command in ("bench", "demo", "compare", "rollout"):
        (line,) = [line for line in out.splitlines() if line.startswith(f"    {command} ")]
        assert len(line.split(None, 1)[1]) > 20 and len(line) <= 80, line  # its help, on the same line


def test_bench_help_lists_the_scenarios_and_the_invalid_run_rule(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmguard_tools.sim.scenarios import SCENARIOS

    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    listed = out.split("--sim scenarios:\n", 1)[1]
    for name, scenario in SCENARIOS.items():
        assert f"  {name} " in listed and scenario.summary in listed, name
    assert "is INVALID and gets no verdict" in " ".join(listed.split())
