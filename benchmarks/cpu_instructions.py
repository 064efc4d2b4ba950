"""Client instructions per streamed call, guarded vs plain: a load-independent companion to cpu_per_call.

On a shared 2-core machine CPU time per call swings by several per cent from run to run (cpu_per_call's
"plain-again" noise floor), more than the guard's own cost. Instruction counts do not: each client runs
the same streamed calls under valgrind's callgrind in its own process, and the count per call is
``(run with N calls - run with none) / N``. The servers are separate processes, started with ``spawn``
so that they run natively, not under valgrind; the SDK, the guard and the hedging set-up are those of
``benchmarks.cpu_per_call``. Instructions are not time (cache misses and branch mispredictions are not
counted), so the figure complements the CPU-time benchmark rather than replacing it.

Each token is sent ``--gap`` seconds after the last, so that under valgrind's ~50x slowdown the client
still reads one event per chunk, as it does at full speed.

    python -m benchmarks.cpu_instructions [--calls 20] [--gap 0.004]   # needs valgrind; ~4 minutes
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

MODES = ("none", "plain", "guarded")


def _serve(queue: Any, tokens: int, gap: float) -> None:
    from tests.loopback import LoopbackServer, Script

    server = LoopbackServer("instructions")
    server.script = Script(tokens=tokens, gap=gap)
    server.start()
    queue.put(server.url)
    while True:
        time.sleep(3600)


def _child(mode: str, calls: int, tokens: int, gap: float) -> None:
    """Warm both clients up, then make ``calls`` calls with one of them (none: only the warm-up)."""
    import anyio
    import httpx
    import openai

    from benchmarks.cpu_per_call import one_call
    from llmguard_client import Guard, Tier

    context = multiprocessing.get_context("spawn")  # the servers run natively, outside valgrind
    processes, urls = [], []
    for _ in range(2):
        queue = context.Queue()
        process = context.Process(target=_serve, args=(queue, tokens, gap), daemon=True)
        process.start()
        processes.append(process)
        urls.append(queue.get(timeout=120))

    async def main() -> None:
        guard = Guard(urls, tiers={"i": Tier(ttft=60, total=600, stall=60)})  # valgrind is slow
        clients = {
            "plain": openai.AsyncOpenAI(
                base_url=urls[0] + "/v1", api_key="x", http_client=httpx.AsyncClient(timeout=None)
            ),
            "guarded": openai.AsyncOpenAI(base_url=urls[0] + "/v1", api_key="x", http_client=guard.http_client()),
        }
        for client in clients.values():
            for _ in range(5):
                await one_call(client)
        if mode != "none":
            for _ in range(calls):
                await one_call(clients[mode])
        for client in clients.values():
            await client.close()
        await guard.aclose()

    anyio.run(main)
    for process in processes:
        process.terminate()


def _instructions(mode: str, calls: int, tokens: int, gap: float) -> int:
    command = [
        "valgrind", "--tool=callgrind", "--trace-children=no", "--callgrind-out-file=/dev/null",
        sys.executable, "-m", "benchmarks.cpu_instructions", "--child", mode,
        "--calls", str(calls), "--tokens", str(tokens), "--gap", str(gap),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    found = re.search(r"Collected : (\d+)", result.stderr)
    if result.returncode != 0 or found is None:
        raise SystemExit(f"the {mode} run under valgrind failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20, help="measured calls per client")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--gap", type=float, default=0.004, help="seconds between the server's tokens")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.calls < 1 or args.tokens < 1 or args.gap < 0:
        parser.error("--calls and --tokens must be >= 1, --gap >= 0")
    if args.child is not None:
        _child(args.child, args.calls, args.tokens, args.gap)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: this benchmark counts instructions with its callgrind tool")
    counts = {mode: _instructions(mode, args.calls, args.tokens, args.gap) for mode in MODES}
    per_call = {mode: (counts[mode] - counts["none"]) / args.calls for mode in ("plain", "guarded")}
    print(f"{args.calls} streamed calls of {args.tokens} tokens per client through the openai SDK, under callgrind")
    print("| client | instructions per call | / plain |")
    print("|---|---|---|")
    for mode, count in per_call.items():
        print(f"| {mode} | {count / 1e6:.3f} M | {count / per_call['plain']:.4f}x |")
    print(f"(the guard's own: {(per_call['guarded'] - per_call['plain']) / 1e6:.3f} M instructions per call)")


if __name__ == "__main__":
    main()
