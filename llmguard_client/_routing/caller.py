"""Whose call reads the replicas' cool-downs: a provider's 429 refuses the credential that got it, not the replica.

A 429 (a rate limit, a quota) is about the API key, organisation or project of the request that got it
(`llmguard_client._core.redact.credential_hash`): its cool-down and its run of refusals hold for that credential's
calls only (`ReplicaState.holder`), while a 503, a 529 or a failure to connect is the replica's, for every caller.
The retry layer runs each call's route as its credential (`calling_as`), so every reader of a cool-down on that
route (the router, the hedges, admission) sees the ones that hold for it. Outside any call (a snapshot, the fleet
mirror) every cool-down holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["calling_as", "caller", "holds_for_caller"]

_CALLER: ContextVar[str | None] = ContextVar("llmguard_caller_credential", default=None)


def caller() -> str | None:
    """The credential hash of the call running here (None: outside any call)."""
    return _CALLER.get()


@contextmanager
def calling_as(credential: str) -> Iterator[None]:
    """Run the block as a call with ``credential`` (its hash)."""
    token = _CALLER.set(credential)
    try:
        yield
    finally:
        _CALLER.reset(token)


def holds_for_caller(holder: str | None) -> bool:
    """Whether a cool-down or refusal run held for ``holder`` (None: every caller) holds for the call running here."""
    if holder is None:
        return True
    current = _CALLER.get()
    return current is None or current == holder
