"""What an object of the guard's must do in a child process just forked from this one: `in_forked_child` registers
a method of it (or a module's function), called there for as long as it lives.

Python calls them as it forks (``os.register_at_fork``), before anything else runs in the child. A process forked
from C runs no at-fork hooks (uWSGI's workers, unless ``--py-call-osafterfork``): there `catch_up_with_fork` calls
them, once, at the first call's entry, where it sees a process id that is not the one they last ran for, or as an
object of the guard's is built there (its own callback is for the children it will have, not for this one).
"""

from __future__ import annotations

import gc
import inspect
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["catch_up_with_fork", "in_forked_child"]

_callbacks: set[weakref.ref[Callable[[], Any]]] = set()
_pid = os.getpid()
"""The process the callbacks last ran for (this one, unless it was forked without them)."""
_catching_up: dict[int, threading.Lock] = {}
"""One lock per process that caught up: a lock of the parent's could have been held by another of its threads at
the fork."""
_running_in: int | None = None
"""The thread running the callbacks, if any: what they reach (a finalizer, an object built) does not catch up."""


def in_forked_child(callback: Callable[[], Any]) -> None:
    """Call ``callback`` in every child forked from this process while it lives (held weakly): a bound method, or a
    module's function. It runs at a call's entry, before that call, so it must not make a call of the guard's or
    catch up itself."""
    catch_up_with_fork()  # the callbacks registered before a fork without hooks are this process's, not this one's
    held = weakref.WeakMethod if inspect.ismethod(callback) else weakref.ref
    _callbacks.add(held(callback, _callbacks.discard))


def catch_up_with_fork() -> None:
    """At a call's entry: in a process forked without Python's at-fork hooks, run the callbacks first (once, while
    the process's other threads wait for them). Elsewhere it costs one ``getpid``."""
    pid = os.getpid()
    if pid == _pid or _running_in == threading.get_ident():
        return
    with _catching_up.setdefault(pid, threading.Lock()):
        if _pid != pid:
            _in_child(pid)


def _in_child(pid: int) -> None:
    """Run the callbacks, with no garbage collection meanwhile: a Guard's finalizer, run halfway through, would find
    some of its objects as the parent left them."""
    global _pid, _running_in
    collecting = gc.isenabled()
    gc.disable()
    _running_in = threading.get_ident()
    try:
        for reference in list(_callbacks):
            callback = reference()
            if callback is not None:
                callback()
    finally:
        _running_in = None
        if collecting:
            gc.enable()
    _pid = pid  # last: another thread's call waits until every callback has run


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=lambda: _in_child(os.getpid()))
