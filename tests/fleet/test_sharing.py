"""Four processes against one replica that answers 429 + Retry-After: with the fleet, that replica hears from
the whole fleet at most twice during its window; without it, at least once per process (one run, both)."""

from __future__ import annotations

import subprocess
import sys

from tests.loopback import LoopbackServer, Script
from tests.redis_server import RedisServer

PROCESSES = 4
CALLS = 8
INTERVAL = 0.1
STAGGER = 0.15
RETRY_AFTER = 30


def start_processes(url: str, replicas: list[str]) -> list[subprocess.Popen[str]]:
    """The processes, each connected and waiting for the common start (a line on its stdin)."""
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fleet.fleet_process",
                "calls",
                url,
                "checkout",
                "-",
                f"{i * STAGGER:.3f}",
                str(CALLS),
                str(INTERVAL),
                *replicas,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    # Processes take 1-5 s to import and connect on a busy machine: each says when it is ready, and they all
    # start together once every one has (a barrier, not a start time guessed ahead).
    for p in procs:
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    return procs


def finish(procs: list[subprocess.Popen[str]]) -> list[str]:
    outputs = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
        outputs.append(out)
    return outputs


def test_a_retry_after_learned_by_one_process_holds_for_the_fleet(
    redis_server: RedisServer, servers: list[LoopbackServer]
) -> None:
    limited, healthy = servers[0], servers[1]
    # A hosted API's 429: its rate-limit headers report the limit spent for every caller, so it cools at once.
    spent = {"retry-after": str(RETRY_AFTER), "x-ratelimit-remaining-requests": "0"}
    limited.script = Script(status=429, headers=spent, body={"error": "slow down"})
    replicas = [limited.url, healthy.url]
    counts = {}
    for mode, url in (("fleet", redis_server.url), ("local", "none")):
        limited.reset_counters()
        healthy.reset_counters()
        procs = start_processes(url, replicas)
        outputs = finish(procs)
        assert all("done" in out for out in outputs), outputs
        statuses = [s for out in outputs for s in out.split("done ", 1)[1].strip().split(",")]
        assert statuses.count("200") == PROCESSES * CALLS  # every call answered: its retry went to the other
        counts[mode] = len(limited.received)
    print(f"requests to the limited replica during its {RETRY_AFTER} s window: {counts}")
    assert counts["fleet"] <= 2, counts
    assert counts["local"] >= PROCESSES, counts
