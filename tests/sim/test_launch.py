"""The cluster as a subprocess: ``python -m llmguard_tools.sim`` and `spawn_cluster`."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from typing import Any

import httpx
import pytest

from llmguard_client._http.tls import default_tls_context
from llmguard_tools.sim.__main__ import main as sim_main
from llmguard_tools.sim.cluster import SimCluster
from llmguard_tools.sim.launch import ClusterStartError, spawn_cluster
from llmguard_tools.sim.scenarios import get_scenario

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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_port_puts_replica_i_on_port_plus_i_and_a_taken_one_is_named() -> None:
    """``--port P``: a cluster a user's app can be pointed at once, the same ports at each start."""
    port = _free_port()
    async with SimCluster(get_scenario("healthy", 1), port=port) as cluster:
        assert cluster.urls == [f"http://127.0.0.1:{port}"]
        async with httpx.AsyncClient() as client:
            assert (await client.get(cluster.urls[0] + "/v1/models")).status_code == 200
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):  # taken: by the first cluster
            async with SimCluster(get_scenario("healthy", 1), port=port):
                pass


def test_the_command_refuses_a_port_that_is_none_and_names_a_taken_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        sim_main(["--scenario", "healthy", "--port", "70000"])
    assert "--port must be a TCP port (1-65535), or 0 for free ports; got 70000" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert sim_main(["--scenario", "healthy", "--replicas", "1", "--port", str(port)]) == 2
    assert capsys.readouterr().err == f"python -m llmguard_tools.sim: cannot listen on 127.0.0.1:{port} " + (
        "(Address already in use)\n"
    )
