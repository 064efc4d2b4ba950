"""A guarded client's ``auth=``: held for the guard to run for each request it sends (`ClientAuth`)."""

from __future__ import annotations

from typing import Any, TypeVar

from llmguard_client._http.auth import ClientAuth

_C = TypeVar("_C")


def guard_runs_auth(client: _C, *, blocking: bool) -> _C:
    """``client`` with the auth it was built with (as httpx builds it from a tuple, a function or an `Auth`) run by
    the guard for each request it sends, each attempt on its own replica, rather than once per call above the
    guard; ``blocking`` for a sync client, whose flow runs in worker threads."""
    built: Any = client
    if built.auth is not None:
        built.auth = ClientAuth(built.auth, blocking=blocking)
    return client
