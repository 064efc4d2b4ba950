"""benchmarks/chaos.py: its schedule keeps its rules, its verdict blames each failure on what explains it, and its
partition proxy holds bytes while partitioned; one short run of the whole harness behind ``-m slow``."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from benchmarks._partition_proxy import PartitionProxy, ProxyThread
from benchmarks.chaos import KINDS, REDIS_KINDS, REPLICA_KINDS, SETTLE, TTFT, Fault, Plan, judge, make_faults

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("seed", range(1, 21))
def test_the_schedule_overlaps_faults_but_keeps_its_rules(seed: int) -> None:
    duration = 180.0
    faults = make_faults(duration, 4.0, seed, 3, KINDS)
    assert faults == make_faults(duration, 4.0, seed, 3, KINDS)  # seeded
    *rest, final = faults
    assert (final.kind, final.end) == ("redis_kill", duration - SETTLE)  # the last fault: Redis killed
    assert all(f.end <= final.start for f in rest)
    assert {f.kind for f in faults} == set(KINDS)
    overlapping = 0
    for i, a in enumerate(faults):
        assert a.start < a.end
        during = [b for b in faults[i + 1 :] if b.start < a.end and a.start < b.end]
        overlapping += len(during)
        assert not (a.kind in REDIS_KINDS and any(b.kind in REDIS_KINDS for b in during))
        if a.kind in REPLICA_KINDS:
            assert all(b.target != a.target for b in during if b.kind in REPLICA_KINDS)
    assert overlapping > 0  # faults in combination
    own_redis = tuple(k for k in KINDS if k not in ("redis_kill", "redis_stop"))  # --redis: partitions only
    assert make_faults(duration, 4.0, seed, 3, own_redis)[-1].kind == "redis_partition"
    for t in (f.start for f in faults):
        down = {f.target for f in faults if f.kind in REPLICA_KINDS and f.start <= t < f.end}
        assert len(down) < 3  # never every replica at once


def call(start: float, took: float, ok: bool = False, **kw: Any) -> dict[str, Any]:
    return {"start": start, "end": start + took, "ok": ok, "first_token": ok, **kw}


def test_the_verdict_blames_redis_only_for_failures_nothing_else_explains() -> None:
    url = "http://127.0.0.1:1"
    plan = Plan(
        t0=0.0,
        duration=60.0,
        urls=[url, "http://127.0.0.1:2"],
        redis="",
        callers=1,
        seed=1,
        faults=[Fault(10, 12, "replica_kill", 0), Fault(30, 33, "redis_partition"), Fault(40, 43, "redis_kill")],
        last_fault_end=43.0,
    )
    calls = [
        call(1.0, 0.1, ok=True),
        call(2.0, 0.2, attempts=[[url, ["status_429"], "http_429", "failed"]], cause="budget_exhausted"),
        call(11.0, 0.5, attempts=[[url, [], None, "cancelled"]], cause="ttft_timeout"),  # during the kill
        call(20.0, 0.1, attempts=[[url, [], "read_error", "failed"]], cause="budget_exhausted"),  # its own error
        call(31.0, 0.01, attempts=[], cause="rate_limited"),  # nothing but Redis was failing
        call(50.0, TTFT + 0.2, attempts=[[url, [], None, "cancelled"]], cause="ttft_timeout"),  # late, and why?
    ]
    out = {
        "index": 0,
        "calls": calls,
        "stalls": [[50.0 + TTFT + 0.1, 0.1]],  # the loop stalled 0.1 s of the 0.2 s overshoot
        "samples": [[43.5, True, 0.0], [44.0, True, 29.0]],
        "probe_cooling": 29.5,
        "idle": True,
        "calls_in_flight": 0,
        "attempts_in_flight": 0,
        "budget_pending": 0,
        "open_connections_after_close": 0,
        "fleet": None,
    }
    report = judge(plan, [out], bound=0.05, agree_within=2.0)
    assert report["failed_by"] == {
        "injected (chaos-marked attempt)": 1,
        "replica fault": 2,
        "of which outside a scheduled replica fault": 1,
        "redis": 1,
        "unexplained": 1,
    }
    (over,) = report["over_bound"]
    assert over["over_s"] == pytest.approx(0.1, abs=1e-6) and over["at_s"] == 50.0
    assert report["probe_seen_after_last_fault_s"] == [1.0]
    verdicts = list(report["verdicts"].values())
    assert verdicts == [False, False, True, True]


def _echo_server() -> tuple[socket.socket, threading.Thread]:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            while data := conn.recv(1024):
                conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def test_a_partitioned_proxy_holds_the_bytes_and_delivers_them_when_healed() -> None:
    listener, server = _echo_server()
    proxy = PartitionProxy("echo", listener.getsockname()[1])
    proxies = ProxyThread([proxy])
    proxies.start()
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as conn:
            conn.sendall(b"a")
            assert conn.recv(16) == b"a"
            proxy.partitioned = True
            conn.sendall(b"b")
            conn.settimeout(0.3)
            with pytest.raises(TimeoutError):
                conn.recv(16)  # held: neither delivered nor refused, the connection still open
            proxy.partitioned = False
            conn.settimeout(10)
            assert conn.recv(16) == b"b"
    finally:
        proxies.stop()
        listener.close()
        server.join(10)


@pytest.mark.slow  # 30 s of real processes and faults: a step of its own in CI (.ci/run)
def test_a_short_chaos_run_keeps_every_invariant() -> None:
    cmd = [sys.executable, "-m", "benchmarks.chaos", "--minutes", "0.5", "--processes", "2", "--callers", "2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
