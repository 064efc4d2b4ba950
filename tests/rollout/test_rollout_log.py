"""The one INFO line a Guard logs when it is built: whether it is on, and for which fraction of calls."""

from __future__ import annotations

import logging

import pytest

from llmguard_client import Guard
from llmguard_client.errors import GuardConfigError

URLS = ["http://127.0.0.1:9", "http://127.0.0.1:10"]


async def built_lines(caplog: pytest.LogCaptureFixture, **kwargs: object) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="llmguard_client"):
        await Guard(replicas=URLS, **kwargs).aclose()  # type: ignore[arg-type]
    return [r.getMessage() for r in caplog.records if r.name == "llmguard_client" and r.levelno == logging.INFO]


async def test_the_fraction_is_logged_once(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMGUARD_DISABLED", raising=False)
    assert await built_lines(caplog, rollout=0.05) == [
        "llmguard guard on: 5% of calls guarded (rollout=0.05), 2 replica(s)"
    ]
    assert await built_lines(caplog) == ["llmguard guard on: 100% of calls guarded (rollout=1), 2 replica(s)"]


@pytest.mark.parametrize("bad", [{"fleet": "http://x", "name": "a"}, {"admission": True}, {"instrumentation": 5}])
async def test_a_guard_refused_at_construction_logs_nothing(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, bad: dict[str, object]
) -> None:
    monkeypatch.delenv("LLMGUARD_DISABLED", raising=False)
    with pytest.raises(GuardConfigError):
        await built_lines(caplog, **bad)
    assert not [r for r in caplog.records if r.name == "llmguard_client"]


async def test_a_fraction_of_zero_says_no_call_is_guarded(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMGUARD_DISABLED", raising=False)
    (line,) = await built_lines(caplog, rollout=0.0)
    assert line.startswith("llmguard guard on for no calls (rollout=0)")


async def test_a_flag_source_is_named(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMGUARD_DISABLED", raising=False)

    def from_flags() -> float:
        return 0.1

    (line,) = await built_lines(caplog, rollout=from_flags)
    assert line.startswith("llmguard guard on: 10% of calls guarded (rollout=0.1, from <function")
    assert "from_flags" in line


@pytest.mark.parametrize("value", ["1", "true", "on"])
async def test_the_kill_switch_is_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("LLMGUARD_DISABLED", value)
    assert await built_lines(caplog, rollout=0.5) == [
        "llmguard guard OFF: LLMGUARD_DISABLED is set; every call is passed through unguarded (control)"
    ]
