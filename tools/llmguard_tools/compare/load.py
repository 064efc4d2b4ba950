"""Reading phase records: the JSON lines `RecordLogger` writes, from a file or stdin.

A line is one record if it holds a JSON object with ``cohort``, ``tier`` and ``status``;
anything before the first ``{`` is ignored, so lines under a logging prefix
(``2025-01-01 INFO llmguard_client.record {...}``) read as well. Other lines are counted
as skipped, never fatal.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

__all__ = ["Call", "Records", "read_path", "read_records"]


@dataclass(frozen=True, slots=True)
class Call:
    """What `compare` needs from one record."""

    cohort: str
    tier: str
    status: str
    http_status: int | None
    ttft: float | None
    e2e: float | None
    attempts: int
    sent: int
    """Attempts that reached a server (their request was written, or an answer came back)."""
    fraction: float | None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True, slots=True)
class Records:
    calls: list[Call]
    skipped: int
    """Lines that were not records (blank lines are not counted)."""
    lines: int = 0
    """Lines read, blank ones included."""
    objects: int = 0
    """Skipped lines that held a JSON object, just not a record (no cohort, tier or status)."""


def read_path(path: str, stdin: IO[str] | None = None) -> Records:
    """Records from ``path``, or from stdin when it is ``-``. OSError if the file cannot be read."""
    if path == "-":
        return read_records(stdin if stdin is not None else sys.stdin)
    with open(path, encoding="utf-8", errors="replace") as lines:
        return read_records(lines)


def read_records(lines: Iterable[str]) -> Records:
    calls: list[Call] = []
    skipped = objects = read = 0

    def counted() -> Iterator[str]:
        nonlocal read
        for line in lines:
            read += 1
            yield line

    for obj in _objects(counted()):
        call = _call(obj) if obj is not None else None
        if call is None:
            skipped += 1
            objects += obj is not None
        else:
            calls.append(call)
    return Records(calls, skipped, read, objects)


def _objects(lines: Iterable[str]) -> Iterator[dict[str, Any] | None]:
    for line in lines:
        start = line.find("{")
        if start < 0:
            if line.strip():
                yield None
            continue
        try:
            obj = json.loads(line[start:])
        except ValueError:
            yield None
            continue
        yield obj if isinstance(obj, dict) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _since_start(obj: dict[str, Any], key: str, end: str) -> float | None:
    value = _number(obj.get(key))
    if value is not None:
        return value
    start, stop = _number(obj.get("start")), _number(obj.get(end))
    return None if start is None or stop is None else stop - start


def _call(obj: dict[str, Any]) -> Call | None:
    cohort, tier, status = obj.get("cohort"), obj.get("tier"), obj.get("status")
    if cohort not in ("guarded", "control") or not isinstance(tier, str) or not isinstance(status, str):
        return None
    attempts = obj.get("attempts")
    attempts = [a for a in attempts if isinstance(a, dict)] if isinstance(attempts, list) else []
    reached = sum(
        1 for a in attempts if any(a.get(k) is not None for k in ("sent", "headers", "status_code", "first_token"))
    )
    code = obj.get("http_status")
    return Call(
        cohort=cohort,
        tier=tier,
        status=status,
        http_status=code if isinstance(code, int) and not isinstance(code, bool) else None,
        ttft=_since_start(obj, "ttft", "first_token"),
        e2e=_since_start(obj, "duration", "finish"),
        attempts=len(attempts),
        sent=reached,
        fraction=_number(obj.get("rollout_fraction")),
    )
