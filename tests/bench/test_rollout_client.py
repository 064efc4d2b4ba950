"""``llmguard bench --rollout F --records PATH``: one stream through one Guard, then ``llmguard compare``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmguard_client._rollout.rollout import key_position
from llmguard_tools import cli
from tests.loopback import LoopbackCluster

# Tier limits far beyond what a loaded machine adds: every call must end ok, whatever the machine is doing.
SMALL = [
    "--requests",
    "40",
    "--rate",
    "100",
    "--length-scale",
    "0.02",
    "--no-progress",
    "--tier-ttft",
    "10",
    "--tier-total",
    "30",
    "--tier-stall",
    "10",
]


def test_bench_rollout_writes_records_that_compare_reads(
    cluster: LoopbackCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = tmp_path / "out.jsonl"
    argv = ["bench", "--target", ",".join(cluster.urls), "--rollout", "0.5", "--records", str(records), *SMALL]
    assert cli.main([*argv, "--json", str(tmp_path / "r.json")]) == 0
    out = "".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert f"phaserecordswrittento{records}" in out
    assert list(json.loads((tmp_path / "r.json").read_text())["clients"]) == ["rollout"]  # the only client
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(lines) == 40 and {r["status"] for r in lines} == {"ok"}
    assert {r["rollout_fraction"] for r in lines} == {0.5}
    guarded = sum(key_position(f"req-{i}") < 0.5 for i in range(40))  # one sticky key per planned request
    assert sum(r["cohort"] == "guarded" for r in lines) == guarded
    # the control cohort is sent like the plain client: round-robin over both replicas, one attempt each
    control = [r for r in lines if r["cohort"] == "control"]
    assert {r["replica"] for r in control} == set(cluster.urls) and {len(r["attempts"]) for r in control} == {1}

    assert cli.main(["compare", str(records), "--min-calls", "5"]) == 0
    report = capsys.readouterr().out
    assert "40 records (0 other lines skipped); rollout fraction compared: 0.5" in " ".join(report.split())
    assert report.split("\n\n")[-1].startswith("verdict: ")  # the last paragraph (it wraps to the width)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--records", "x.jsonl"], "--records needs the rollout client"),
        (["--rollout", "1.5"], "--rollout: must be from 0.0 to 1.0"),
        (["--rollout", "0.1", "--records", "/no/such/dir/out.jsonl"], "does not exist"),
    ],
)
def test_bench_rollout_bad_input(extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--target", "http://127.0.0.1:1", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err
