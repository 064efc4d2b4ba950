"""How often one guarded call enters each of the package's modules.

    python scripts/call_trace.py [--folders] [--callers]

Runs one streamed chat completion through ``guard.http_client()`` against a two-replica loopback server
(stdlib ``http.server``; the answer written in one piece, so the count does not depend on how the socket
splits it) under ``sys.setprofile``: the Guard's first call, so that no timing measured before it (a slow
warm-up on a busy machine marks a replica degraded) changes the route it takes. For the call's own path (the
event-loop thread, from sending the request to closing the read response), it counts how many times each
``llmguard_client`` module is *entered* from another module: a function of the module starting while its
caller runs elsewhere (in httpx, the event loop or another of the package's modules). Consecutive frames in
one module are one stay; a coroutine resumed after a wait is not a new entry. Prints ``module entries``, most
entered first, then the totals; ``--callers`` lists under each module the function entered and the one it
was entered from.
"""

from __future__ import annotations

import argparse
import collections
import dis
import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmguard_client import Guard, Tier

PACKAGE = "llmguard_client"
REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 5}


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _answer() -> bytes:
    def chunk(delta: dict[str, str], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}

    events = [chunk({"role": "assistant"}), *(chunk({"content": f" t{i}"}) for i in range(5)), chunk({}, "stop")]
    return b"".join(_event(e) for e in events) + b"data: [DONE]\n\n"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the traced call reuses the warm-up's connection
    answer = _answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@contextmanager
def _servers(n: int) -> Iterator[list[str]]:
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Handler) for _ in range(n)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    try:
        yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


class EntryCounter:
    """A ``sys.setprofile`` function counting entries into the package's modules (see the module docstring)."""

    def __init__(self, folders: bool = False) -> None:
        self.folders = folders
        self.entries: collections.Counter[str] = collections.Counter()
        self.callers: dict[str, list[str]] = collections.defaultdict(list)
        self._starts: dict[CodeType, int | None] = {}

    def _unit(self, frame: FrameType | None) -> str | None:
        name = frame.f_globals.get("__name__", "") if frame is not None else ""
        if not isinstance(name, str) or not name.startswith(PACKAGE + "."):
            return None
        parts = name[len(PACKAGE) + 1 :].split(".")
        return parts[0] if self.folders and len(parts) > 1 else ".".join(parts)

    def _fresh(self, frame: FrameType) -> bool:
        """The frame starts (a call), rather than a coroutine or generator resuming after a wait."""
        code = frame.f_code
        if code not in self._starts:  # the offset of RESUME 0 (3.11+), where every fresh frame stands
            starts = [i.offset for i in dis.get_instructions(code) if i.opname == "RESUME" and i.arg == 0]
            self._starts[code] = starts[0] if starts else None
        start = self._starts[code]
        return frame.f_lasti == start if start is not None else frame.f_lasti <= 0

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        unit = self._unit(frame)
        if unit is None or not self._fresh(frame):
            return
        caller = frame.f_back
        if self._unit(caller) != unit:
            self.entries[unit] += 1
            where = f"{caller.f_globals.get('__name__')}.{caller.f_code.co_name}" if caller is not None else "?"
            self.callers[unit].append(f"{frame.f_code.co_name} <- {where}")


async def _call(client: Any) -> int:
    size = 0
    async with client.stream("POST", "/v1/chat/completions", json=REQUEST) as response:
        async for chunk in response.aiter_bytes():
            size += len(chunk)
    return size


async def trace(urls: list[str], folders: bool) -> EntryCounter:
    counter = EntryCounter(folders)
    tiers = {"interactive": Tier(ttft=5.0, total=30.0, stall=5.0)}
    async with Guard(urls, tiers, instrumentation=None) as guard, guard.http_client(base_url=urls[0]) as client:
        sys.setprofile(counter)
        try:
            size = await _call(client)
        finally:
            sys.setprofile(None)
    if size != len(_Handler.answer):
        raise SystemExit(f"the traced call read {size} bytes, expected {len(_Handler.answer)}")
    return counter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folders", action="store_true", help="count a subpackage (e.g. _layers) as one unit")
    parser.add_argument("--callers", action="store_true", help="list each entry: function <- its caller")
    args = parser.parse_args()
    with _servers(2) as urls:
        counter = anyio.run(trace, urls, args.folders)
    entries = counter.entries
    for unit, count in sorted(entries.items(), key=lambda item: (-item[1], item[0])):
        print(f"{unit:36} {count}")
        for line in counter.callers[unit] if args.callers else ():
            print(f"    {line}")
    print(f"{sum(entries.values())} stays in {len(entries)} {'units' if args.folders else 'modules'}")


if __name__ == "__main__":
    main()
