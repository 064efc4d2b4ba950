"""What an object of the guard's must do in a child process just forked from this one (only the forking thread
runs there): `in_forked_child` registers a method of it, called there for as long as the object lives."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["in_forked_child"]

_methods: set[weakref.WeakMethod[Callable[[], Any]]] = set()


def in_forked_child(method: Callable[[], Any]) -> None:
    """Call the bound ``method`` in every child forked from this process while its object lives (held weakly)."""
    _methods.add(weakref.WeakMethod(method, _methods.discard))


def _in_child() -> None:
    for reference in list(_methods):
        method = reference()
        if method is not None:
            method()


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_in_child)
