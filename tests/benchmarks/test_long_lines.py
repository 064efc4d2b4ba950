"""benchmarks/long_lines.py: both readers read the long event whole, and the script prints a row per size."""

from __future__ import annotations

import pytest

from benchmarks.long_lines import _guard, _sdk, _stream, main


def test_both_readers_read_a_long_event_in_many_chunks() -> None:
    chunks = _stream(1)
    assert len(chunks) > 16
    _guard(chunks)  # each asserts what it read: the event and the end marker
    _sdk(chunks)


def test_the_script_prints_a_row_per_size(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--sizes", "1,2", "--rounds", "1"])
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [row.split()[:2] for row in rows] == [["1", "MB"], ["2", "MB"]]
    assert all(row.endswith("x") for row in rows)
