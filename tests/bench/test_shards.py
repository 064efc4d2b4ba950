"""A client's replay split over worker processes: each sends its share of the plan, on the plan's clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from llmguard_tools import cli
from llmguard_tools.bench.measure import Replayed
from llmguard_tools.bench.shards import merge, shard_plan
from llmguard_tools.bench.traffic import make_plan
from tests.bench.reports import sample
from tests.loopback import LoopbackCluster
from tests.redis_server import RedisServer
from tests.test_cli import SMALL


def test_the_shares_cover_the_plan_once_with_its_arrival_times() -> None:
    plan = make_plan(50, seed=1, rate=20.0)
    shares = [shard_plan(plan, k, 3) for k in range(3)]
    sent = sorted((r for share in shares for r in share.requests), key=lambda r: r.index)
    assert sent == list(plan.requests)
    assert [len(s) for s in shares] == [17, 17, 16]


def test_a_closed_loop_plan_cannot_be_split() -> None:
    with pytest.raises(ValueError, match="open-loop"):
        shard_plan(make_plan(10, seed=1, concurrency=2), 0, 2)


def test_the_replays_are_joined_in_plan_order_furthest_behind_and_longest() -> None:
    a = Replayed([sample(0), sample(2)], wall=3.0, behind=0.1)
    b = Replayed([sample(1), sample(3)], wall=2.5, behind=0.4)
    joined = merge([a, b])
    assert [s.index for s in joined.samples] == [0, 1, 2, 3]
    assert (joined.wall, joined.behind) == (3.0, 0.4)


def test_bench_replays_a_baseline_from_several_processes(
    cluster: LoopbackCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    js = tmp_path / "r.json"
    argv = ["bench", "--target", ",".join(cluster.urls), "--clients", "plain", "--client-processes", "2"]
    assert cli.main([*argv, *SMALL, "--json", str(js)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    doc = json.loads(js.read_text())
    assert sorted(s["index"] for s in doc["samples"]["plain"]) == list(range(20))
    assert all(s["status"] == "ok" for s in doc["samples"]["plain"])
    assert len(cluster.bodies()) == 20  # each call sent once, by one of the two processes
    assert "plain: replayed from 2 processes" in out


def test_guarded_clients_in_several_processes_share_a_fleet_store(
    cluster: LoopbackCluster, redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    js = tmp_path / "r.json"
    store = redis.Redis.from_url(redis_server.url)
    connections = int(store.info("stats")["total_connections_received"])
    argv = ["bench", "--target", ",".join(cluster.urls), "--clients", "guarded", "--guard-processes", "2"]
    assert cli.main([*argv, *SMALL, "--fleet", redis_server.url, "--json", str(js)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    doc = json.loads(js.read_text())
    assert sorted(s["index"] for s in doc["samples"]["guarded"]) == list(range(20))
    assert "guarded: replayed from 2 processes" in out and "its Guards share their fleet state through Redis" in out
    # both processes' Guards connected to the store (ours, the counter's reader, is one more)
    assert int(store.info("stats")["total_connections_received"]) >= connections + 3
