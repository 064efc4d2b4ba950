"""The guard's own random sources (backoff jitter, routing's random choices, cohort draws), drawn afresh in a
forked child.

A `random.Random()` seeds itself once, when it is built; Python reseeds only the module-level `random` functions in
a forked child. A Guard built before a fork (gunicorn ``--preload``, a prefork pool) would have every worker draw
what its parent and siblings draw: the same retry jitter at the same moments after a shared failure, the very
herd the jitter is there to break up.
"""

from __future__ import annotations

import random

from llmguard_client._core.forks import in_forked_child

__all__ = ["jitter", "process_random"]


def process_random() -> random.Random:
    """A `random.Random` seeded from the operating system, and again in each child process forked from this one."""
    source = random.Random()
    in_forked_child(source.seed)
    return source


_shared = process_random()


def jitter(low: float, high: float) -> float:
    """A factor drawn evenly from [``low``, ``high``] (a wait's jitter), from a source of this process's own."""
    return _shared.uniform(low, high)
