"""``python -m llmguard_tools.sim --scenario NAME [--replicas N] [--seed S] [--ready-file PATH] [--port P]``.

Starts the scenario's replicas in this process, prints ``{"urls": [...]}`` on one stdout line once they
accept connections (and writes it to ``--ready-file``), and runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from llmguard_tools.sim.cluster import SimCluster
from llmguard_tools.sim.scenarios import SCENARIOS, get_scenario


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m llmguard_tools.sim",
        description="Serve a simulated OpenAI-compatible cluster on 127.0.0.1 until SIGTERM/SIGINT; print "
        '{"urls": [...]} on one stdout line once every replica accepts connections.',
    )
    parser.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    parser.add_argument("--replicas", type=int, default=None, metavar="N", help="override the replica count")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed of every random draw (default 0)")
    parser.add_argument("--ready-file", type=Path, default=None, metavar="PATH", help="also write the line here")
    parser.add_argument(
        "--port",
        type=int,
        default=0,
        metavar="P",
        help="replica i listens on port P+i (default: free ports the system picks, new at each start)",
    )
    args = parser.parse_args(argv)
    if args.replicas is not None and args.replicas < 1:
        parser.error("--replicas must be >= 1")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be a TCP port (1-65535), or 0 for free ports; got {args.port}")
    return args


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def _serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with SimCluster(get_scenario(args.scenario, args.replicas), seed=args.seed, port=args.port) as cluster:
        line = json.dumps({"urls": cluster.urls})
        if args.ready_file is not None:
            _write_atomically(args.ready_file, line + "\n")
        print(line, flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    """Run the cluster until a signal; return the exit status (2: a port it cannot listen on)."""
    try:
        asyncio.run(_serve(_parse(argv)))
    except OSError as exc:  # a --port taken by another process
        print(f"python -m llmguard_tools.sim: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
