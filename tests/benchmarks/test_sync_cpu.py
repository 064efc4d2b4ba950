"""benchmarks/sync_cpu.py: chunks at once and paced, each on the sync and the async path, plain beside guarded."""

from __future__ import annotations

import pytest

from benchmarks.sync_cpu import main


def test_the_script_prints_plain_and_guarded_per_gap_and_path(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--calls", "2", "--concurrency", "2", "--tokens", "3", "--gaps", "0,0.001", "--rounds", "1"])
    table = capsys.readouterr().out.splitlines()[3:]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    assert [row[:2] for row in cells] == [
        ["at once", "sync"],
        ["at once", "async"],
        ["1 ms apart", "sync"],
        ["1 ms apart", "async"],
    ]
    for _, _, plain, guarded, difference, ratio, switches in cells:
        plain_ms, guarded_ms = float(plain.removesuffix(" ms")), float(guarded.removesuffix(" ms"))
        assert plain_ms > 0 and guarded_ms > 0
        assert float(difference.removesuffix(" ms")) == pytest.approx(guarded_ms - plain_ms, abs=0.011)
        assert float(ratio.removesuffix("x")) == pytest.approx(guarded_ms / plain_ms, abs=0.01 + 0.01 * guarded_ms)
        plain_switches, guarded_switches = (int(n) for n in switches.split(" / "))
        assert plain_switches > 0 and guarded_switches > 0  # every call waits for the network at least once
