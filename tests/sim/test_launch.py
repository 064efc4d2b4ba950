"""The cluster as a subprocess: ``python -m llmguard_tools.sim`` and `spawn_cluster`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

import httpx
import pytest

from llmguard_client._http.tls import default_tls_context
from llmguard_tools.sim.launch import ClusterStartError, spawn_cluster

TLS = default_tls_context()
"""One TLS context for the module's calls (each ``httpx.get`` would otherwise load the CA bundle)."""


def test_spawn_cluster_serves_and_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)  # what spawn_cluster starts its cluster with
    with spawn_cluster("healthy", replicas=2, seed=3) as urls:
        assert len(urls) == 2 and all(u.startswith("http://127.0.0.1:") for u in urls)
        for url in urls:
            assert httpx.get(url + "/v1/models", verify=TLS).json()["data"][0]["id"] == "sim-model"
        body = {"messages": [{"role": "user", "content": "a b"}], "max_tokens": 2, "ignore_eos": True}
        reply = httpx.post(urls[0] + "/v1/chat/completions", json=body, verify=TLS).json()
        assert reply["usage"]["completion_tokens"] == 2
        [cluster] = started
        assert cluster.poll() is None
    # Stopped and reaped when the block ends. (Not "its port refuses a connection": another test's server may
    # be given that port as soon as it is free.)
    assert cluster.returncode is not None


def test_spawn_cluster_reports_a_failed_start() -> None:
    with pytest.raises(ClusterStartError, match="invalid choice"), spawn_cluster("no-such-scenario", timeout=10):
        pass


def test_module_prints_the_ready_line_and_exits_on_sigterm() -> None:
    cmd = [sys.executable, "-m", "llmguard_tools.sim", "--scenario", "overload"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        urls = json.loads(line)["urls"]
        assert len(urls) == 3
        assert httpx.get(urls[2] + "/sim/stats", verify=TLS).json()["kv_total"] == 1408
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
