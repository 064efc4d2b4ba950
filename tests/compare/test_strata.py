"""``llmguard compare`` compares the cohorts within one rollout fraction, never pooled across fractions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmguard_tools import cli


def line(cohort: str, fraction: float | None, start_unix: float, *, failed: bool = False, ttft: float = 0.01) -> str:
    record: dict[str, Any] = {"cohort": cohort, "tier": "interactive", "start_unix": start_unix}
    if fraction is not None:
        record["rollout_fraction"] = fraction
    if failed:
        record |= {"status": "timeout", "http_status": None, "ttft": None, "duration": 1.0}
    else:
        record |= {"status": "ok", "http_status": 200, "ttft": ttft, "duration": ttft + 0.2}
    return json.dumps({**record, "attempts": [{"sent": start_unix}]})


def step(fraction: float | None, guarded: int, control: int, start: float, *, busy: bool) -> list[str]:
    """One period of a rollout: a busy one times out every 10th call of each cohort and answers later."""
    cohorts = ["guarded"] * guarded + ["control"] * control
    return [
        line(cohort, fraction, start + i, failed=busy and i % 10 == 0, ttft=0.08 if busy else 0.01)
        for i, cohort in enumerate(cohorts)
    ]


def compare(tmp_path: Path, lines: list[str], capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert cli.main(["compare", str(path), "--json", *args]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def text(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert cli.main(["compare", str(tmp_path / "records.jsonl"), *args]) == 0
    return " ".join(capsys.readouterr().out.split())


def calls(report: dict[str, Any]) -> dict[str, int]:
    return {g["cohort"]: g["calls"] for g in report["groups"]}


def test_a_widening_step_in_a_quieter_period_is_not_a_gain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """5 % guarded in a busy period (10 % timeouts in both cohorts), then 50 % in a quiet one: pooled, the
    guarded cohort is mostly quiet calls and control mostly busy ones, and success looks 6 pp better."""
    lines = step(0.05, 100, 1900, 1000.0, busy=True) + step(0.5, 200, 200, 9000.0, busy=False)
    report = compare(tmp_path, lines, capsys)
    assert report["verdict"]["decision"] == "hold", report["verdict"]
    assert report["rollout_fraction"] == 0.5 and calls(report) == {"guarded": 200, "control": 200}
    assert report["not_compared"] == [{"rollout_fraction": 0.05, "calls": 2000}]
    assert "rollout fraction compared: 0.5 (not compared: 0.05 with 2000 calls)" in text(tmp_path, capsys)


def test_a_step_in_a_busier_period_is_no_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the other order: 50 % in a busy period, then 5 % in a quiet one; pooled, that is a false roll back
    lines = step(0.5, 200, 200, 1000.0, busy=True) + step(0.05, 100, 1900, 9000.0, busy=False)
    report = compare(tmp_path, lines, capsys)
    assert report["verdict"]["decision"] == "hold", report["verdict"]
    assert report["rollout_fraction"] == 0.05 and calls(report) == {"guarded": 100, "control": 1900}


def test_the_newest_fraction_is_the_one_started_last_wherever_its_lines_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = step(0.5, 200, 200, 9000.0, busy=False) + step(0.05, 100, 1900, 1000.0, busy=True)
    report = compare(tmp_path, lines, capsys)
    assert report["rollout_fraction"] == 0.5 and report["verdict"]["decision"] == "hold", report["verdict"]


def test_the_kill_switchs_calls_are_not_compared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The guard switched off during an incident: its calls (all control, fraction 0) failing a fifth of the
    time are no measure of control against the guard, and are left out."""
    off = [line("control", 0.0, 9000.0 + i, failed=i % 5 == 0) for i in range(300)]
    report = compare(tmp_path, step(0.5, 200, 200, 1000.0, busy=False) + off, capsys)
    assert report["verdict"]["decision"] == "hold", report["verdict"]
    assert report["rollout_fraction"] == 0.5 and calls(report) == {"guarded": 200, "control": 200}
    assert report["not_compared"] == [{"rollout_fraction": 0.0, "calls": 300}]
    assert "(not compared: 0 (guard off) with 300 calls)" in text(tmp_path, capsys)


def test_only_kill_switch_calls_is_nothing_to_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(line("control", 0.0, 1000.0 + i) for i in range(50)) + "\n")
    assert cli.main(["compare", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing to compare" in err and "0 (guard off) with 50 calls" in err


def test_fraction_chooses_the_calls_compared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = step(0.05, 100, 1900, 1000.0, busy=True) + step(0.5, 200, 200, 9000.0, busy=False)
    report = compare(tmp_path, lines, capsys, "--fraction", "0.05")
    assert report["rollout_fraction"] == 0.05 and calls(report) == {"guarded": 100, "control": 1900}
    assert report["not_compared"] == [{"rollout_fraction": 0.5, "calls": 400}]
    assert report["verdict"]["decision"] == "hold", report["verdict"]
    assert cli.main(["compare", str(tmp_path / "records.jsonl"), "--fraction", "0.3"]) == 2
    err = capsys.readouterr().err
    assert "--fraction 0.3: no calls of that rollout fraction (fractions: 0.5 with 400 calls, 0.05 with" in err
    assert cli.main(["compare", str(tmp_path / "records.jsonl"), "--fraction", "0"]) == 2
    assert "must be above 0 and at most 1" in capsys.readouterr().err


def test_records_without_a_fraction_are_a_stratum_of_their_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unrecorded = step(None, 40, 40, 9000.0, busy=False)
    report = compare(tmp_path, unrecorded, capsys)
    assert report["rollout_fraction"] is None and calls(report) == {"guarded": 40, "control": 40}
    assert "rollout fraction compared: not recorded (records without one)" in text(tmp_path, capsys)
    # beside recorded fractions, the newest of those is compared and the unrecorded calls are listed
    report = compare(tmp_path, step(0.5, 40, 40, 1000.0, busy=False) + unrecorded, capsys)
    assert report["rollout_fraction"] == 0.5 and report["not_compared"] == [{"rollout_fraction": None, "calls": 80}]
    assert "(not compared: not recorded with 80 calls)" in text(tmp_path, capsys)


def test_a_step_set_by_arithmetic_is_one_fraction(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``set_rollout(0.1 + 0.2)`` records 0.30000000000000004: with the 0.3 of the same step's other processes it is
    one fraction, not two printed alike with half the calls left out."""
    lines = step(0.1 + 0.2, 50, 50, 1000.0, busy=False) + step(0.3, 50, 50, 1200.0, busy=False)
    report = compare(tmp_path, lines, capsys)
    assert report["rollout_fraction"] == 0.3 and calls(report) == {"guarded": 100, "control": 100}
    assert report["not_compared"] == []
    assert calls(compare(tmp_path, lines, capsys, "--fraction", "0.3")) == {"guarded": 100, "control": 100}
