"""Leak checks as test infrastructure: every Guard a test builds must end the test holding nothing."""

from __future__ import annotations

import functools
import gc
import weakref
from collections.abc import Iterator

import pytest

from llmguard_client import Guard


@pytest.fixture(autouse=True)
def no_leaks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail a test that leaves a call, an attempt's in-flight count, a bulkhead slot or a pending
    budget ticket behind on any Guard it built (read through the public ``guard.snapshot()``)."""
    built: list[weakref.ref[Guard]] = []
    original = Guard.__init__

    @functools.wraps(original)  # Guard's own signature and docstring, for tests that read them
    def tracking_init(self: Guard, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        built.append(weakref.ref(self))

    monkeypatch.setattr(Guard, "__init__", tracking_init)
    yield
    # An unclosed body dropped by the test is released by its finalizer: collect, then freeze what
    # survives so the next test's collection walks only the objects created since (a full walk of
    # the session's heap took ~0.2 s per test, two thirds of the suite's time).
    gc.collect()
    gc.freeze()
    for ref in built:
        guard = ref()
        if guard is not None:
            snapshot = guard.snapshot()
            assert snapshot.idle, f"the test left {guard!r} holding resources: {snapshot}"
