"""One client process of ``llmguard bench --processes``, against a real simulated cluster with a provider limit:
every call it makes is counted once, as completed or as failed with its cause, and the table shows the causes."""

from __future__ import annotations

import time

import pytest

from llmguard_tools.bench.fleet_worker import _main
from llmguard_tools.bench.processes import render
from llmguard_tools.sim.cluster import SimCluster
from llmguard_tools.sim.scenarios import get_scenario


@pytest.mark.asyncio
async def test_every_call_is_completed_or_failed_with_its_cause() -> None:
    # 1 request of burst and 2 a second against 60 calls a second for 0.5 s, with 2 s to a first token: 4-5 calls
    # get a share in time, the guard refuses the rest, and the ones let through complete. (With 4 a second, a busy
    # machine whose load generator launched only 13 of the 30 calls had every one of them served, none refused.)
    async with SimCluster(get_scenario("ratelimited")) as cluster:
        spec = {
            "urls": cluster.urls,
            "mode": "local",
            "seed": 1,
            "rate": 60.0,
            "duration": 0.5,
            "ttft": 2.0,
            "total": 10.0,
            "start_at": time.time(),
            "run_id": "t",
            "fleet_url": None,
            "connect": "early",
            "limit": {"requests_per_minute": 120.0, "tokens_per_minute": None, "burst": 1.0},
        }
        result = await _main(spec)
    failed: dict[str, int] = result["failed"]
    assert result["ok"] >= 4, result
    assert failed.get("rate_limited") == result["refused"] > 0, result
    assert result["calls"] == result["ok"] + sum(failed.values())
    assert cluster.provider is not None and cluster.provider.counters.limited == 0  # the guard kept within it


def test_the_table_shows_failures_other_than_the_limits_by_cause() -> None:
    row = {
        "mode": "guarded fleet",
        "calls": 10,
        "provider_429": 1,
        "server_requests": 6,
        "refused_by_guard": 3,
        "failed": {"rate_limited": 3, "http_429": 1, "ttft_timeout": 2, "ReadTimeout": 1},
        "goodput": 0.5,
        "ttft_p50": 0.02,
        "ttft_p99": None,
    }
    line = render([row], "title").splitlines()[-1]
    assert "| 3 | 1 ReadTimeout, 2 ttft_timeout | 0.50 | 20 ms | - |" in line
    clean = render([{**row, "failed": {"rate_limited": 3}}], "title").splitlines()[-1]
    assert "| 3 | 0 | 0.50 |" in clean
