"""Whose rate limit a call draws on: a provider's 429 refuses that limit, not the replica.

A hosted API limits each key, organisation or project on its own: a 429 is about the limit of the request that got
it, its `limit_scope`. Its cool-down and its run of refusals hold for the calls of that scope only
(`ReplicaState.holder`), while a 503, a 529 or a failure to connect is the replica's, for every caller. The model is
no part of the scope: a server with several models behind one URL (TGI's, LoRA adapters) answers 429 for all of
them when its queue is full, and a limit may cover several models. The retry layer runs each call's route as its
scope (`calling_as`), so every reader of a cool-down on that route (the router, the hedges, admission) sees the
ones that hold for it. Outside any call (a snapshot, the fleet mirror) every cool-down holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import httpx

from llmguard_client._core.redact import CREDENTIALS, credential_key

__all__ = ["calling_as", "caller", "holds_for_caller", "limit_scope", "scopes", "united"]

ACCOUNT_HEADERS = (b"openai-organization", b"openai-project")
"""Headers that name the account a key bills (an OpenAI key may serve several organisations, projects)."""

_CALLER: ContextVar[str | None] = ContextVar("llmguard_limit_scope", default=None)


def limit_scope(headers: httpx.Headers, signed: bool) -> str | None:
    """A short hash of the rate limit a request draws on: the keys its `CREDENTIALS` headers carry (`credential_key`:
    a key sent as ``api-key`` and as ``Authorization: Bearer`` is one) and its `ACCOUNT_HEADERS`; never the key
    itself. "" for a request that carries none of them. None, every caller's, for a ``signed`` one (AWS SigV4,
    a Google HMAC): its ``Authorization`` is a signature, new on every request, not the credential it stands for."""
    if signed:
        return None
    keys = sorted({credential_key(v) for k, v in headers.raw if k.lower() in CREDENTIALS})
    accounts = sorted(k.lower() + b"=" + v.strip() for k, v in headers.raw if k.lower() in ACCOUNT_HEADERS)
    if not keys and not accounts:
        return ""
    return hashlib.blake2b(b"\0".join([*keys, b"", *accounts]), digest_size=8).hexdigest()


def caller() -> str | None:
    """The limit scope of the call running here (None: outside any call)."""
    return _CALLER.get()


@contextmanager
def calling_as(scope: str | None) -> Iterator[None]:
    """Run the block as a call of ``scope`` (`limit_scope`); None: as no call, every cool-down holding."""
    token = _CALLER.set(scope)
    try:
        yield
    finally:
        _CALLER.reset(token)


def scopes(holder: str) -> list[str]:
    """The limit scopes a cool-down or refusal run holds for: ``holder`` names one, or several joined by commas
    (`united`: several keys' limits refused at once)."""
    return holder.split(",")


def united(holder: str, other: str) -> str:
    """One holder for the scopes of both: a cool-down or run of several keys' 429s holds for each of them."""
    return ",".join(sorted({*scopes(holder), *scopes(other)}))


def holds_for_caller(holder: str | None) -> bool:
    """Whether a cool-down or refusal run held for ``holder`` (`scopes`; None: every caller) holds for the call
    running here."""
    if holder is None:
        return True
    current = _CALLER.get()
    return current is None or current == holder or ("," in holder and current in scopes(holder))
