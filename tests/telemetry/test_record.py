"""The plain phase record and its `logging` adapter, `RecordLogger`."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest

from llmguard_client.telemetry.record import AttemptRecord, PhaseRecord
from llmguard_client.telemetry.record_logger import RecordLogger


def make_record() -> PhaseRecord:
    record = PhaseRecord(
        request_id="req-42",
        tier="interactive",
        cohort="guarded",
        method="POST",
        path="/v1/chat/completions",
        start=100.0,
        start_unix=1_700_000_000.0,
        model="gpt-4o",
        stream=True,
        max_tokens=32,
        attempts=(AttemptRecord(index=0, replica="http://127.0.0.1:8000", kind="primary", start=100.0),),
    )
    return record


def finish(record: PhaseRecord) -> PhaseRecord:
    first = replace(
        record.attempts[0], sent=100.001, headers=100.01, finish=100.02, status_code=429, outcome="failed",
        error="http_429", retry_after=2.0,
    )  # fmt: skip
    retry = AttemptRecord(
        index=1, replica="http://127.0.0.1:8001", kind="retry", start=100.1, sent=100.101, headers=100.2,
        first_token=100.25, finish=100.5, status_code=200, outcome="won",
    )  # fmt: skip
    return replace(
        record, attempts=(first, retry), queued=100.0005, sent=100.101, headers=100.2, first_token=100.25,
        finish=100.5, status="ok", replica=retry.replica, http_status=200, prompt_tokens=9, completion_tokens=17,
        response_id="chatcmpl-1", response_model="gpt-4o-mini", finish_reasons=("stop",),
    )  # fmt: skip


def test_phases_are_none_until_reached() -> None:
    record = make_record()
    assert record.ttft is None and record.duration is None
    assert record.attempts[0].ttft is None
    assert not record.hedged and not record.retried
    assert record.status == "pending" and record.finish_reasons == ()


def test_derived_phases() -> None:
    record = finish(make_record())
    assert record.ttft == pytest.approx(0.25)
    assert record.duration == pytest.approx(0.5)
    assert record.attempts[1].ttft == pytest.approx(0.15)
    assert record.retried and not record.hedged
    hedge = AttemptRecord(index=2, replica="http://127.0.0.1:8002", kind="hedge", start=100.3)
    assert replace(record, attempts=(*record.attempts, hedge)).hedged


def test_to_dict_is_json_ready() -> None:
    record = finish(make_record())
    out = record.to_dict()
    assert json.loads(json.dumps(out)) == out  # plain JSON types only
    assert out["ttft"] == pytest.approx(0.25) and out["duration"] == pytest.approx(0.5)
    assert out["request_id"] == "req-42" and out["cohort"] == "guarded"
    assert [a["kind"] for a in out["attempts"]] == ["primary", "retry"]
    assert out["attempts"][0]["retry_after"] == 2.0
    assert out["finish_reasons"] == ["stop"]
    # to_dict copies: changing it leaves the record alone
    out["finish_reasons"].append("length")
    assert record.finish_reasons == ("stop",)


def test_record_logger_writes_one_json_line(caplog: pytest.LogCaptureFixture) -> None:
    record = finish(make_record())
    on_record = RecordLogger()
    with caplog.at_level(logging.INFO, logger="llmguard_client.record"):
        on_record(record)
    (entry,) = caplog.records
    assert entry.name == "llmguard_client.record"
    assert entry.levelno == logging.INFO
    line = entry.getMessage()
    assert "\n" not in line
    assert ": " not in line and ", " not in line  # compact separators
    assert json.loads(line) == json.loads(json.dumps(record.to_dict()))
    assert entry.llmguard is record  # type: ignore[attr-defined]  # for structured handlers


def test_record_logger_accepts_a_logger_and_a_level(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("myapp.llm")
    on_record = RecordLogger(logger, level=logging.WARNING)
    with caplog.at_level(logging.INFO, logger="myapp.llm"):
        on_record(make_record())
    (entry,) = caplog.records
    assert entry.name == "myapp.llm" and entry.levelno == logging.WARNING
    assert json.loads(entry.getMessage())["status"] == "pending"


def test_record_logger_does_no_work_when_disabled(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = make_record()
    calls: list[int] = []

    def to_dict(self: PhaseRecord) -> dict[str, object]:
        calls.append(1)
        return {}

    monkeypatch.setattr(PhaseRecord, "to_dict", to_dict)
    on_record = RecordLogger(logger="llmguard_client.quiet", level=logging.DEBUG)
    with caplog.at_level(logging.INFO, logger="llmguard_client.quiet"):
        on_record(record)
    assert caplog.records == [] and calls == []


def test_record_logger_serialises_anything_odd(caplog: pytest.LogCaptureFixture) -> None:
    record = replace(make_record(), cause=object())  # not JSON: falls back to str()
    with caplog.at_level(logging.INFO, logger="llmguard_client.record"):
        RecordLogger()(record)
    assert json.loads(caplog.records[0].getMessage())["cause"].startswith("<object object")


def test_no_header_or_body_field() -> None:
    """The record has no place for a prompt, a completion or a header value."""
    out = finish(make_record()).to_dict()
    names = set(out) | set(out["attempts"][0])
    forbidden = {"prompt", "completion", "messages", "content", "body", "authorization", "api_key", "url", "query"}
    assert names.isdisjoint(forbidden)
    assert isinstance(out["headers"], float)  # "headers" is a phase timestamp, not header values
    assert {"prompt_tokens", "completion_tokens"} <= names  # counts only
