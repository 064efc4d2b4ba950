"""One worker of a client's replay split over processes (`llmguard_tools.bench.shards`):
``python -m llmguard_tools.bench.shard_worker JOBFILE``.

It reads its pickled `ShardJob`, starts its client, says ``ready`` on stdout, reads the common start instant on
stdin, replays its share of the plan from then and writes the pickled `Replayed` on stdout.
"""

from __future__ import annotations

import pickle
import sys
import time

import anyio

from llmguard_tools.bench.measure import Replayed
from llmguard_tools.bench.runner import client_for, replay
from llmguard_tools.bench.shards import ShardJob


async def _work(job: ShardJob) -> Replayed:
    spec = job.spec
    client = client_for(job.client, job.urls, job.model, spec)
    await client.start()
    try:
        sys.stdout.buffer.write(b"ready\n")
        sys.stdout.buffer.flush()
        start_at = float(await anyio.to_thread.run_sync(sys.stdin.buffer.readline))
        start = time.perf_counter() + (start_at - time.time())
        return await replay(client, spec.plan, job.model, start=start)
    finally:
        await client.aclose()


def main() -> None:
    with open(sys.argv[1], "rb") as f:
        job: ShardJob = pickle.load(f)
    result = anyio.run(_work, job)
    sys.stdout.buffer.write(pickle.dumps(result))


if __name__ == "__main__":
    main()
