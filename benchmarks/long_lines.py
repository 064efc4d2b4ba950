"""CPU to frame one long SSE event (a base64 image in one line) arriving in 64 KB chunks: the guard's reader
against the openai SDK's own SSE decoder, the two reading the same bytes in the same run.

The guard reads a stream's bytes on the event loop before the SDK parses them, so its framing is paid on top of
the SDK's: it should cost no more than the SDK's and grow as the line does, not as its square.

    python -m benchmarks.long_lines [--sizes 1,4,16] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from openai._streaming import SSEDecoder

from llmguard_client.protocols.chat import ChatReader

CHUNK = 65536


def _stream(megabytes: int) -> list[bytes]:
    text = "A" * (megabytes << 20)
    event = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}
    raw = b"data: " + json.dumps(event).encode() + b"\n\ndata: [DONE]\n\n"
    return [raw[i : i + CHUNK] for i in range(0, len(raw), CHUNK)]


def _guard(chunks: list[bytes]) -> None:
    reader = ChatReader()
    for chunk in chunks:
        reader.feed(chunk)
    assert reader.end_of_body() is None and reader.first_token


def _sdk(chunks: list[bytes]) -> None:
    assert sum(1 for _ in SSEDecoder().iter_bytes(iter(chunks))) == 2


def _seconds(read: Callable[[list[bytes]], None], chunks: list[bytes]) -> float:
    started = time.process_time()
    read(chunks)
    return time.process_time() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,4,16", help="line sizes in MB, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"{'line':>6} {'guard ms':>9} {'SDK ms':>8} {'guard/SDK':>9}  (median of {args.rounds} rounds, CPU time)")
    for size in (int(s) for s in args.sizes.split(",")):
        chunks = _stream(size)
        guard, sdk = [], []
        for _ in range(args.rounds):  # interleaved, so that a busy moment of the machine hits both
            guard.append(_seconds(_guard, chunks))
            sdk.append(_seconds(_sdk, chunks))
        g, s = statistics.median(guard), statistics.median(sdk)
        print(f"{size:>4} MB {g * 1000:>9.1f} {s * 1000:>8.1f} {g / s:>8.2f}x")


if __name__ == "__main__":
    main()
