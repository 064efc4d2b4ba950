"""benchmarks/sync_threads.py: many threads' non-streamed calls, plain beside guarded, per round and as medians."""

from __future__ import annotations

import pytest

from benchmarks.sync_threads import main


def test_the_script_prints_plain_and_guarded_per_round_and_their_medians(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--threads", "3", "--calls", "2", "--delay", "0.001", "--rounds", "2"])
    table = capsys.readouterr().out.splitlines()[3:]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    assert [row[0] for row in cells] == ["1", "2", "median"]
    for _, calls, calls_ratio, cpu, cpu_ratio, on_loop, p50, switches in cells:
        plain_calls, guarded_calls = (float(n) for n in calls.split(" / "))
        assert plain_calls > 0 and guarded_calls > 0
        assert float(calls_ratio.removesuffix("x")) == pytest.approx(guarded_calls / plain_calls, rel=0.05, abs=0.01)
        plain_ms, guarded_ms = (float(n) for n in cpu.removesuffix(" ms").split(" / "))
        assert plain_ms > 0 and guarded_ms > 0
        assert float(cpu_ratio.removesuffix("x")) == pytest.approx(guarded_ms / plain_ms, rel=0.05, abs=0.01)
        assert 0 < float(on_loop.removesuffix(" ms")) <= guarded_ms  # the guarded calls ran on the Guard's thread
        assert all(float(n) > 0 for n in p50.removesuffix(" ms").split(" / "))
        assert all(float(n) > 0 for n in switches.split(" / "))  # every call waits for the network at least once
