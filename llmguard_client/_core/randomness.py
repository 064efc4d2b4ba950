"""The guard's own random sources (backoff jitter, routing's random choices, cohort draws), drawn afresh in a
forked child.

A `random.Random()` seeds itself once, when it is built; Python reseeds only the module-level `random` functions in
a forked child. A Guard built before a fork (gunicorn ``--preload``, a prefork pool) would have every worker draw
what its parent and siblings draw: the same retry jitter at the same moments after a shared failure, the very
herd the jitter is there to break up.
"""

from __future__ import annotations

import os
import random
import weakref

__all__ = ["process_random"]

_sources: weakref.WeakSet[random.Random] = weakref.WeakSet()


def process_random() -> random.Random:
    """A `random.Random` seeded from the operating system, and again in each child process forked from this one."""
    source = random.Random()
    _sources.add(source)
    return source


def _reseed_in_child() -> None:
    for source in list(_sources):
        source.seed()


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_reseed_in_child)
