"""Records are built inside telemetry only, and the caller gets them frozen (and final once the call ended)."""

from __future__ import annotations

import ast
from dataclasses import FrozenInstanceError, fields
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmguard_client import AttemptRecord, Guard, PhaseRecord, Tier
from llmguard_client.telemetry._record_builder import CallRecordBuilder
from tests.loopback import LoopbackServer, Script

PACKAGE = Path(__file__).resolve().parents[2] / "llmguard_client"
TELEMETRY = PACKAGE / "telemetry"
CHAT = "/v1/chat/completions"
STREAM = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
TIERS = {"interactive": Tier(ttft=10, total=30, stall=10)}
PRIVATE = {"_fields", "from_fields"}
"""The builders' storage and the frozen records' fast constructor: telemetry's alone."""


def builder() -> CallRecordBuilder:
    return CallRecordBuilder(
        request_id="r", tier="t", cohort="guarded", method="POST", path=CHAT, start=1.0, start_unix=2.0,
        model=None, stream=True, max_tokens=None, rollout_fraction=1.0,
    )  # fmt: skip


def test_a_builder_field_cannot_be_assigned() -> None:
    """Every record field reads on a builder but is written only through its methods (also a mypy error)."""
    call = builder()
    attempt = call.attempt_started("http://r", "primary", 1.5)
    for obj, record_class in ((call, PhaseRecord), (attempt, AttemptRecord)):
        for field in fields(record_class):
            with pytest.raises(AttributeError):
                setattr(obj, field.name, None)
    attempt.attempt_headers(1.6, 200)
    assert (attempt.sent, attempt.headers, attempt.status_code) == (1.6, 1.6, 200)


def offences(tree: ast.AST) -> list[str]:
    """Writes to a record outside the builder: its storage or fast constructor, ``setattr`` or
    ``object.__setattr__`` (which would get past a frozen record), or a record built from fields."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.alias) and node.name in PRIVATE:
            found.append(f"line {getattr(node, 'lineno', '?')}: import {node.name}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            on_self = bool(node.args) and isinstance(node.args[0], ast.Name) and node.args[0].id == "self"
            # (a class setting its own attribute is fine; no class outside telemetry is a record)
            if name in ("PhaseRecord", "AttemptRecord") or (name in ("__setattr__", "setattr") and not on_self):
                found.append(f"line {node.lineno}: {name}()")
    return found


def test_no_module_outside_telemetry_writes_a_record() -> None:
    outside = {
        str(path.relative_to(PACKAGE)): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if TELEMETRY not in path.parents
        and any(word in (text := path.read_text()) for word in ("_fields", "Record(", "setattr"))  # else no offence
        and (found := offences(ast.parse(text, str(path))))
    }
    assert outside == {}


def test_the_scan_finds_each_kind_of_write() -> None:
    source = (
        "a._fields['sent'] = 1\n"
        "from llmguard_client.telemetry.record import from_fields\n"
        "PhaseRecord(request_id='r')\n"
        "object.__setattr__(record, 'status', 'ok')\n"
        "setattr(attempt, 'outcome', 'won')\n"
        "object.__setattr__(self, 'headers', {})\n"  # a class's own attribute: not a record
    )
    assert sorted(line.split(":")[0] for line in offences(ast.parse(source))) == [f"line {n}" for n in range(1, 6)]


def assert_frozen(record: Any) -> None:
    assert isinstance(record, PhaseRecord) and isinstance(record.attempts, tuple)
    with pytest.raises(FrozenInstanceError):
        record.status = "ok"
    for attempt in record.attempts:
        with pytest.raises(FrozenInstanceError):
            attempt.outcome = "won"


@pytest.mark.parametrize("rollout", [1.0, 0.0], ids=["guarded", "control"])
async def test_a_streamed_call_hands_a_snapshot_then_the_final_record(
    servers: list[LoopbackServer], rollout: float
) -> None:
    servers[0].script = Script(tokens=3)
    records: list[PhaseRecord] = []
    async with (
        Guard([servers[0].url], tiers=TIERS, instrumentation=None, rollout=rollout, on_record=records.append) as guard,
        guard.http_client() as client,
    ):
        async with client.stream("POST", servers[0].url + CHAT, json=STREAM) as response:
            early = response.extensions["llmguard"]
            assert_frozen(early)
            assert early.status == "pending" and early.finish is None and records == []
            await response.aread()
        final = response.extensions["llmguard"]
    (delivered,) = records
    assert final is delivered and final is not early
    assert_frozen(final)
    assert final.status == "ok" and final.finish is not None and final.first_token is not None
    assert final.attempts[0].outcome == "won" and final.request_id == early.request_id
    assert early.status == "pending"  # the snapshot itself never changes


async def test_a_failure_carries_the_final_record(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(status=503, body={"error": "busy"})
    records: list[PhaseRecord] = []
    async with (
        Guard([servers[0].url], tiers=TIERS, instrumentation=None, retry=None, on_record=records.append) as guard,
        guard.http_client() as client,
    ):
        response = await client.post(servers[0].url + CHAT, json={**STREAM, "stream": False})
    (delivered,) = records
    assert response.status_code == 503 and response.extensions["llmguard"] is delivered
    assert_frozen(delivered)
    assert delivered.status == "http_error" and delivered.http_status == 503


async def test_a_raised_guard_failure_carries_the_final_record(servers: list[LoopbackServer]) -> None:
    servers[0].script = Script(stall_before_first=5.0)
    records: list[PhaseRecord] = []
    tiers = {"interactive": Tier(ttft=0.2, total=30, stall=10)}
    async with (
        Guard([servers[0].url], tiers=tiers, instrumentation=None, hedge=None, on_record=records.append) as guard,
        guard.http_client() as client,
    ):
        with pytest.raises(httpx.TimeoutException) as caught:
            await client.post(servers[0].url + CHAT, json=STREAM)
    (delivered,) = records
    record = caught.value.record  # type: ignore[attr-defined]
    assert record is delivered and record.status == "timeout" and record.finish is not None
    assert_frozen(record)
