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
from dataclasses import dataclass, replace
from typing import IO, Any

__all__ = ["Call", "Records", "read_path", "read_records", "sdk_calls"]


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
    start: float | None = None
    start_unix: float | None = None
    """The wall-clock start (`PhaseRecord.start_unix`): which records are the newest."""
    sdk_call: str | None = None
    """The SDK call the record's request belongs to (`PhaseRecord.sdk_call`), if an SDK sent it."""
    sdk_retry: int = 0

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
    return Records(sdk_calls(calls), skipped, read, objects)


def sdk_calls(requests: list[Call]) -> list[Call]:
    """One `Call` per call the caller made: an SDK's retry (a record of the same ``sdk_call`` with a higher
    ``sdk_retry``, after it) is folded into the call it retries, which takes the last request's outcome, the time
    from the first request's start, and every request's attempts, in the first request's cohort and tier. A
    control call's retries are the SDK's, one record each; a guarded call's are the guard's, inside its record."""
    calls: list[Call] = []
    index_of: dict[str, int] = {}
    """Each SDK call's place in ``calls`` (its ``sdk_retry`` is that of its last request so far)."""
    for request in requests:  # in the order written: a request's record is written once it ended
        key = request.sdk_call
        index = index_of.get(key) if key is not None else None
        if index is not None and request.sdk_retry > calls[index].sdk_retry:
            calls[index] = _folded(calls[index], request)
            continue
        if key is not None:
            index_of[key] = len(calls)
        calls.append(request)
    return calls


def _folded(first: Call, retry: Call) -> Call:
    """``first`` (the call so far) with the SDK's ``retry`` of it after."""
    shift = (retry.start - first.start) if retry.start is not None and first.start is not None else None

    def since_first(seconds: float | None) -> float | None:
        return None if seconds is None or shift is None else shift + seconds

    return replace(
        first,
        status=retry.status,
        http_status=retry.http_status,
        ttft=since_first(retry.ttft),
        e2e=since_first(retry.e2e),
        attempts=first.attempts + retry.attempts,
        sent=first.sent + retry.sent,
        sdk_retry=retry.sdk_retry,
    )


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
        start=_number(obj.get("start")),
        start_unix=_number(obj.get("start_unix")),
        sdk_call=obj.get("sdk_call") if isinstance(obj.get("sdk_call"), str) else None,
        sdk_retry=retry if isinstance(retry := obj.get("sdk_retry"), int) and not isinstance(retry, bool) else 0,
    )
