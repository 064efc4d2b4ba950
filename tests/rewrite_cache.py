"""Loaded with ``-p`` (pyproject addopts): xdist workers share the assertion-rewritten test modules.

pytest rewrites a test module's asserts when it imports it, about 1.9 s of CPU for this suite, and keeps the
result in ``__pycache__`` only when bytecode writing is on. Every xdist worker collects the whole suite, so
under ``PYTHONDONTWRITEBYTECODE=1`` (as in this project's environment) and on any fresh checkout each worker
rewrote every module: four times the work with ``-n 4``. Here each worker first rewrites its own share of
the modules (worker i of n takes every n-th) into pytest's cache files; its collection then loads what the
others wrote (pytest checks each file's source hash) and rewrites only what is not there yet.

The cache files are pytest's own (``tests/**/__pycache__/*-pytest-*.pyc``, ignored by git), written even
when bytecode writing is off. It uses pytest's private rewrite functions; if they change, this does nothing
and each worker rewrites for itself as before. A serial run is left alone.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

import pytest


def _test_files(config: pytest.Config) -> list[Path]:
    """The test modules under the run's paths that pytest will import (and so rewrite)."""
    patterns = config.getini("python_files")
    found: set[Path] = set()
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::")[0])
        candidates = path.rglob("*.py") if path.is_dir() else [path]
        found.update(p for p in candidates if any(fnmatch.fnmatch(p.name, pattern) for pattern in patterns))
    return sorted(found)


def _my_share(files: list[Path]) -> list[Path]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if count < 2 or not worker.startswith("gw"):
        return []
    return files[int(worker[2:]) :: count]


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> None:
    config = session.config
    if config.getoption("assertmode") != "rewrite":
        return
    share = _my_share(_test_files(config))
    if not share:
        return
    try:
        from _pytest.assertion.rewrite import (
            PYC_TAIL,
            _read_pyc,
            _rewrite_test,
            _write_pyc,
            assertstate_key,
            get_cache_dir,
            try_makedirs,
        )
    except ImportError:  # another pytest: each worker rewrites for itself
        return
    state = config.stash[assertstate_key]
    for source in share:
        cache_dir = get_cache_dir(source)
        pyc = cache_dir / (source.name[:-3] + PYC_TAIL)
        if _read_pyc(source, pyc) is None and try_makedirs(cache_dir):
            try:
                source_key, code = _rewrite_test(source, config)
            except (OSError, SyntaxError):  # left to the collection, which reports it against the module
                continue
            _write_pyc(state, code, source_key, pyc)
