"""Run inside a fresh venv that holds the llmguard-client wheel with its ``[fleet]`` extra (redis-py at the extra's
declared minimum): a ``Guard(fleet=URL)`` stays connected to an idle redis-server, and ``llmguard-rollout set``
and ``get`` work against it.

    python -I wheel_smoke_fleet.py redis://127.0.0.1:PORT/0

``scripts/wheel_smoke.py`` starts the redis-server, copies this file out of the checkout and runs it with
``python -I``, so the installed wheel is the only llmguard_client it can import. Standard library plus the wheel
and redis-py only. The Guard must stay connected, with no transition, while nothing is published for ``IDLE``
seconds, several times the fleet store's socket timeout (1 s): a listener whose read gave up at that timeout
degraded and reconnected about once a second (redis-py before 8.1). Then ``llmguard-rollout set 0.25`` and
``get`` must exit 0 (with redis-py 5.0.0, which has no ``aclose()``, both failed after their write) and the
announcement of ``set`` must not disturb the Guard's connection.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import sys
from pathlib import Path

IDLE = 4.0
"""Seconds the connected Guard is left idle: four times the fleet store's socket timeout."""

SAMPLE = 0.05
"""Seconds between two reads of the Guard's fleet state while it is idle."""


async def rollout(*args: str) -> str:
    """``llmguard-rollout ARGS`` (this venv's); its output, or SystemExit naming its exit status and output."""
    command = Path(sys.executable).with_name("llmguard-rollout")
    proc = await asyncio.create_subprocess_exec(
        command, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=30.0)
    text = out.decode().strip()
    if proc.returncode != 0:
        raise SystemExit(f"llmguard-rollout {' '.join(args)} exited {proc.returncode}: {text}")
    return text


async def fleet(url: str) -> str:
    from llmguard_client import Guard

    async with Guard(replicas=["http://127.0.0.1:9"], fleet=url, name="smoke") as guard:
        snapshot = guard.snapshot().fleet
        assert snapshot is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while snapshot.state != "connected":
            assert loop.time() < deadline, f"not connected within 10 s: {snapshot}"
            await asyncio.sleep(SAMPLE)
            snapshot = guard.snapshot().fleet
            assert snapshot is not None
        seen: set[str] = set()
        idle_until = loop.time() + IDLE
        while loop.time() < idle_until:
            await asyncio.sleep(SAMPLE)
            snapshot = guard.snapshot().fleet
            assert snapshot is not None
            seen.add(snapshot.state)
        assert seen == {"connected"} and snapshot.transitions == 0 and snapshot.resyncs == 1, (
            f"idle for {IDLE:g} s against a healthy redis-server: states {sorted(seen)}, {snapshot}"
        )
        await rollout("set", "0.25", "--fleet", url, "--name", "smoke")
        got = await rollout("get", "--fleet", url, "--name", "smoke")
        assert "0.25 of calls guarded" in got, got
        snapshot = guard.snapshot().fleet
        assert snapshot is not None and snapshot.state == "connected" and snapshot.transitions == 0, snapshot
    return got


def main() -> None:
    import llmguard_client

    where = Path(llmguard_client.__file__).resolve()
    assert where.is_relative_to(Path(sys.prefix).resolve()), f"imported from {where}, not from the venv"
    got = asyncio.run(fleet(sys.argv[1]))
    print(
        f"fleet connected, idle {IDLE:g} s, no transition; llmguard-rollout set/get ok ({got!r}) with "
        f"redis {importlib.metadata.version('redis')}"
    )


if __name__ == "__main__":
    main()
