"""`RecordLogger(path)`: records appended to a file with no logging set up, rotation-safe, closed with the Guard."""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import warnings
from pathlib import Path

import pytest

from llmguard_client import Guard, GuardConfigError, Tier
from llmguard_client.telemetry.record import PhaseRecord
from llmguard_client.telemetry.record_logger import RecordLogger
from llmguard_tools import cli
from llmguard_tools.compare.load import read_path
from tests.loopback import LoopbackCluster
from tests.virtual import BACKENDS, FakeReplica, Plan, run_virtual


def record(i: int, cohort: str = "guarded", ttft: float = 0.05) -> PhaseRecord:
    rec = PhaseRecord(
        request_id=f"r{i}",
        tier="interactive",
        cohort=cohort,  # type: ignore[arg-type]
        method="POST",
        path="/v1/chat/completions",
        start=10.0,
        start_unix=1.7e9,
        rollout_fraction=0.5,
        first_token=10.0 + ttft,
        finish=10.5,
        status="ok",
        http_status=200,
    )
    return rec


def open_fds_to(path: Path) -> int:
    """How many of this process's file descriptors point at ``path`` (Linux /proc)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                count += 1
        except OSError:
            continue
    return count


def test_lines_are_json_that_compare_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "records.jsonl"
    writer = RecordLogger(str(path))
    assert writer.path == str(path)
    for i in range(40):
        writer(record(i, "guarded" if i % 2 else "control", ttft=0.05 + 0.001 * (i % 7)))
    writer.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 40
    assert [json.loads(line)["request_id"] for line in lines] == [f"r{i}" for i in range(40)]
    assert len(read_path(str(path)).calls) == 40
    assert cli.main(["compare", str(path), "--min-calls", "10"]) == 0
    assert "verdict:" in capsys.readouterr().out


def test_each_line_is_flushed_as_written(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    writer = RecordLogger(path)
    writer(record(1))
    assert json.loads(path.read_text(encoding="utf-8"))["request_id"] == "r1"  # readable before any close
    writer.close()


def test_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text('{"earlier": true}\n', encoding="utf-8")
    writer = RecordLogger(path)
    writer(record(1))
    writer.close()
    assert path.read_text(encoding="utf-8").splitlines()[0] == '{"earlier": true}'
    assert len(path.read_text(encoding="utf-8").splitlines()) == 2


def test_a_rotated_file_is_followed_by_a_fresh_one(tmp_path: Path) -> None:
    path, rotated = tmp_path / "records.jsonl", tmp_path / "records.jsonl.1"
    writer = RecordLogger(path)
    writer(record(1))
    path.rename(rotated)  # what logrotate (without copytruncate) does
    writer(record(2))
    path.unlink()  # removed outright
    writer(record(3))
    writer.close()
    assert [json.loads(x)["request_id"] for x in rotated.read_text(encoding="utf-8").splitlines()] == ["r1"]
    assert [json.loads(x)["request_id"] for x in path.read_text(encoding="utf-8").splitlines()] == ["r3"]
    assert open_fds_to(rotated) == 0 and open_fds_to(path) == 0


def test_close_then_write_reopens(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    writer = RecordLogger(path)
    writer(record(1))
    writer.close()
    writer.close()  # idempotent
    assert open_fds_to(path) == 0
    writer(record(2))
    assert open_fds_to(path) == 1
    writer.close()
    assert len(path.read_text(encoding="utf-8").splitlines()) == 2


@pytest.mark.parametrize("where", ["missing_dir", "a_directory"])
def test_a_bad_path_is_a_clear_error_at_once(tmp_path: Path, where: str) -> None:
    path = tmp_path / "no" / "such" / "dir" / "records.jsonl" if where == "missing_dir" else tmp_path
    with pytest.raises(GuardConfigError, match="RecordLogger cannot append to") as info:
        RecordLogger(path)
    message = str(info.value)
    assert str(path) in message and "existing, writable directory" in message


@pytest.mark.parametrize("bad", [42, b"", ""])
def test_a_path_of_the_wrong_type_is_refused(bad: object) -> None:
    with pytest.raises(GuardConfigError, match="RecordLogger path must be a file path"):
        RecordLogger(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [123, object(), ["myapp"]], ids=["int", "object", "list"])
def test_a_logger_of_the_wrong_type_is_refused(bad: object) -> None:
    """``RecordLogger(logger=123)`` was accepted, then every record was lost with a logged traceback."""
    with pytest.raises(GuardConfigError, match=r"RecordLogger logger must be a logging\.Logger") as info:
        RecordLogger(logger=bad)  # type: ignore[arg-type]
    assert repr(bad) in str(info.value) and "or None" in str(info.value)


@pytest.mark.parametrize("bad", ["info", "LOUD", "", 0, -5, 2.5, None, True], ids=repr)
def test_a_level_that_is_not_a_logging_level_is_refused(bad: object) -> None:
    """``RecordLogger(level=...)`` must be a logging level: every record was lost with a traceback otherwise."""
    with pytest.raises(GuardConfigError, match="RecordLogger level must be a logging level") as info:
        RecordLogger(level=bad)  # type: ignore[arg-type]
    message = str(info.value)
    assert repr(bad) in message and "logging.INFO" in message and "'INFO'" in message


def test_a_level_name_is_taken_as_logging_takes_it(caplog: pytest.LogCaptureFixture) -> None:
    """``level="INFO"`` (a name logging knows) logs as ``level=logging.INFO`` does; each record is logged."""
    writer = RecordLogger(logger="llmguard_client.record.test", level="WARNING")
    with caplog.at_level(logging.INFO, logger="llmguard_client.record.test"):
        writer(record(1))
    assert [r.levelno for r in caplog.records if r.name == "llmguard_client.record.test"] == [logging.WARNING]
    assert not [r for r in caplog.records if r.exc_info]


def test_a_logger_adapter_logs_the_records(caplog: pytest.LogCaptureFixture) -> None:
    """A `logging.LoggerAdapter` (an app's context-adding logger) logs as its logger does."""
    adapter = logging.LoggerAdapter(logging.getLogger("llmguard_client.record.adapted"), {"app": "x"})
    writer = RecordLogger(logger=adapter)
    with caplog.at_level(logging.INFO, logger="llmguard_client.record.adapted"):
        writer(record(1))
    assert [r.name for r in caplog.records] == ["llmguard_client.record.adapted"]


def test_a_path_and_a_logger_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(GuardConfigError, match="a file path or a logger, not both"):
        RecordLogger(tmp_path / "r.jsonl", logger="myapp")


def test_a_write_that_fails_is_logged_once_and_never_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    path = folder / "records.jsonl"
    writer = RecordLogger(path)
    path.unlink()
    folder.rmdir()  # the directory went away: reopening fails
    with caplog.at_level(logging.INFO, logger="llmguard_client"):
        writer(record(1))
        writer(record(2))
        folder.mkdir()
        writer(record(3))
    writer.close()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot write to" in m for m in messages) == 1
    assert any("writes to" in m and "again" in m for m in messages)
    assert [json.loads(x)["request_id"] for x in path.read_text(encoding="utf-8").splitlines()] == ["r3"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device every write to fails, ENOSPC)")
def test_a_full_disk_is_logged_once_and_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    """Each write to a full disk fails, and so does the flush of closing the file after it: neither reaches the
    call, and the failure is logged once, not once per call with a traceback."""
    writer = RecordLogger("/dev/full")
    with caplog.at_level(logging.INFO, logger="llmguard_client"):
        for i in range(3):
            writer(record(i))
    writer.close()
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["RecordLogger cannot write to /dev/full"]
    assert not [r for r in caplog.records if r.exc_info]


def test_a_dropped_writer_closes_its_file_without_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    writer = RecordLogger(path)
    writer(record(1))
    assert open_fds_to(path) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a ResourceWarning would fail here
        del writer
        gc.collect()
    assert open_fds_to(path) == 0


def test_a_logger_instance_still_selects_logging(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("myapp.records")
    writer = RecordLogger(logger)
    assert writer.path is None
    with caplog.at_level(logging.INFO, logger="myapp.records"):
        writer(record(1))
    assert json.loads(caplog.records[0].getMessage())["request_id"] == "r1"


async def test_a_guard_writes_every_call_and_closes_the_file(cluster: LoopbackCluster, tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    async with Guard(replicas=cluster.urls, rollout=0.5, on_record=RecordLogger(path)) as guard:
        async with guard.http_client() as client:
            for i in range(6):
                headers = {"x-llmguard-cohort": "guarded" if i % 2 else "control"}
                url = cluster.urls[0] + "/v1/chat/completions"
                async with client.stream("POST", url, json=body, headers=headers) as response:
                    await response.aread()
        assert open_fds_to(path) == 1
    assert open_fds_to(path) == 0  # closed with the Guard
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    assert [x["cohort"] for x in lines] == ["control", "guarded"] * 3
    assert all(x["status"] == "ok" and x["rollout_fraction"] == 0.5 for x in lines)


URL = "http://a"


def _no_infinity(token: str) -> float:
    raise AssertionError(f"{token} is no JSON: a record carried a deadline that is not a number")


@BACKENDS
def test_records_of_calls_without_deadlines_are_valid_json(backend: str, tmp_path: Path) -> None:
    """Calls of tiers without a ttft or total deadline (the default tier's, or ``math.inf`` given) are written as
    strict JSON lines (no ``Infinity``), which ``llmguard compare`` reads."""
    path = tmp_path / "records.jsonl"
    tiers = {"default": Tier(ttft=math.inf, total=math.inf), "long": Tier(ttft=1.0, total=math.inf, stall=5.0)}

    async def main() -> None:
        fake = FakeReplica("a", [Plan(first_token_after=0.5, tokens=3, gap=2.0)])
        async with (
            Guard(
                [URL], tiers=tiers, instrumentation=None, on_record=RecordLogger(path), transport_factory=lambda r: fake
            ) as guard,
            guard.http_client() as client,
        ):
            for tier in ("default", "long"):
                body = {"model": "m", "stream": True}
                async with client.stream(
                    "POST", URL + "/v1/chat/completions", json=body, headers={"x-llmguard-tier": tier}
                ) as r:
                    await r.aread()
            await client.post(URL + "/v1/chat/completions", json={"model": "m"})

    run_virtual(main, backend)
    lines = path.read_text(encoding="utf-8").splitlines()
    records = [json.loads(line, parse_constant=_no_infinity) for line in lines]
    assert [(r["tier"], r["status"], r["stream"]) for r in records] == [
        ("default", "ok", True),
        ("long", "ok", True),
        ("default", "ok", False),
    ]
    assert len(read_path(str(path)).calls) == 3
