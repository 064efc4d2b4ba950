"""Loaded with ``-p`` (pyproject addopts) before pytest imports its entry-point plugins: keeps pytest from
assertion-rewriting third-party packages only because they ship a pytest plugin.

pytest marks every package of a distribution with a ``pytest11`` entry point for rewriting, so every
process of the suite (the xdist controller and each worker) re-compiled anyio, respx, pytest-asyncio,
xdist and all of hypothesis from source instead of loading their bytecode (the environment here does not
write bytecode, so nothing caches a rewrite). Their own asserts need no introspection; our tests and
conftests are still rewritten. A no-op with ``--assert=plain`` or if a pytest version keeps the set elsewhere.
"""

from __future__ import annotations

import sys

NOT_REWRITTEN = frozenset({
    "anyio", "respx", "pytest_asyncio", "xdist",
    "hypothesis", "_hypothesis_pytestplugin", "_hypothesis_globals", "_hypothesis_ftz_detector",
})  # fmt: skip


def _skip_third_party_rewrite() -> None:
    # pytest has no public switch for this: drop the names from its import hook's set.
    for finder in sys.meta_path:
        marked = getattr(finder, "_must_rewrite", None)
        if isinstance(marked, set):
            marked.difference_update(NOT_REWRITTEN)
            getattr(finder, "_marked_for_rewrite_cache", {}).clear()


_skip_third_party_rewrite()
