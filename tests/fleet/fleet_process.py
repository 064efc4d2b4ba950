"""One process of a fleet, for the multi-process tests: ``python -m tests.fleet.fleet_process MODE ...``.

``rollout URL NAME POLL``: a Guard at rollout 0 following the fleet's flag; prints ``ready`` once connected,
then ``fraction <value>`` each time its rollout changes, until stdin closes.

``calls URL|none NAME START OFFSET N INTERVAL REPLICA...``: a Guard over the replicas (fleet off with
``none``); prints ``ready`` once connected, waits for wall time START (or, with ``-``, for a line on stdin: the
test's common start once every process is ready) and then OFFSET s, makes N calls INTERVAL s apart, prints
``done <statuses>``.
"""

from __future__ import annotations

import sys
import time

import anyio

from llmguard_client import Guard, RetryPolicy


def _connected(guard: Guard) -> bool:
    fleet = guard.snapshot().fleet
    return fleet is None or fleet.connected


async def _ready(guard: Guard) -> None:
    await guard.__aenter__()
    with anyio.fail_after(30):
        while not _connected(guard):  # noqa: ASYNC110 (polled state has no event)
            await anyio.sleep(0.01)
    print("ready", flush=True)


async def rollout(url: str, name: str, poll: float) -> None:
    guard = Guard(["http://127.0.0.1:9"], fleet=url, name=name, rollout=0.0, rollout_poll_interval=poll)
    try:
        await _ready(guard)
        stdin = anyio.wrap_file(sys.stdin)
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                last = None
                while True:
                    if guard.rollout != last:
                        last = guard.rollout
                        print(f"fraction {last}", flush=True)
                    await anyio.sleep(0.01)

            tg.start_soon(watch)
            await stdin.read()  # until the test closes it
            tg.cancel_scope.cancel()
    finally:
        await guard.aclose()


async def calls(url: str, name: str, start: str, offset: float, n: int, interval: float, replicas: list[str]) -> None:
    fleet = None if url == "none" else url
    guard = Guard(replicas, fleet=fleet, name=name, hedge=None, retry=RetryPolicy(max_attempts=2))
    statuses: list[int] = []
    try:
        await _ready(guard)
        if start == "-":
            await anyio.wrap_file(sys.stdin).readline()
            await anyio.sleep(offset)
        else:
            await anyio.sleep(max(0.0, float(start) + offset - time.time()))
        async with guard.http_client() as client:
            for _ in range(n):
                body = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
                async with client.stream("POST", replicas[0] + "/v1/chat/completions", json=body) as response:
                    await response.aread()
                    statuses.append(response.status_code)
                await anyio.sleep(interval)
        print("done " + ",".join(map(str, statuses)), flush=True)
    finally:
        await guard.aclose()


def main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "rollout":
        anyio.run(rollout, argv[1], argv[2], float(argv[3]))
    elif mode == "calls":
        url, name, start, offset, n, interval = argv[1:7]
        anyio.run(calls, url, name, start, float(offset), int(n), float(interval), argv[7:])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
