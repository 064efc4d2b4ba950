"""Which replicas a request's URL can go to.

A request under a replica's base URL (origin and path prefix) means the same under every replica's base: any
replica may take it (`llmguard_client._routing.replicas.rebase` swaps the prefix). A request on a replica's origin
but outside its base path (an Azure client whose base is ``/openai/deployments/dep1`` asking for
``/openai/files``, ``/openai/models`` or another deployment's ``/openai/deployments/emb/embeddings``) means
something only on that origin: it goes there with the path the client built, to the replicas on that origin. A
request on an origin no replica has (a virtual base URL such as ``http://llm.internal/v1``) may go to any.
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx

_CACHE = 256
"""Distinct (method, URL) pairs remembered (cleared when full)."""


def same_origin(url: httpx.URL, base: httpx.URL) -> bool:
    return url.host == base.host and url.port == base.port and url.scheme == base.scheme


def relative(path: str, base: httpx.URL) -> str | None:
    """``path`` after ``base``'s path prefix ("" for the base itself), or None when it is not under it."""
    prefix = base.path.rstrip("/")
    if path == prefix or path.startswith(prefix + "/"):
        return path[len(prefix) :]
    return None


def outside(method: str, url: httpx.URL, bases: Sequence[httpx.URL]) -> tuple[int, ...]:
    """The indices of the ``bases`` a request for ``url`` must not go to (see the module's docstring)."""
    path = url.raw_path.split(b"?", 1)[0].decode("ascii")
    if any(same_origin(url, base) and relative(path, base) is not None for base in bases):
        return ()
    on_origin = [i for i, base in enumerate(bases) if same_origin(url, base)]
    if not on_origin:
        return ()
    kept = set(on_origin)
    return tuple(i for i in range(len(bases)) if i not in kept)


class Reach:
    """`outside` for one replica set's bases, cached: a service calls few distinct paths."""

    def __init__(self, bases: Sequence[httpx.URL]) -> None:
        self._bases = tuple(bases)
        self._cache: dict[tuple[str, str, str, int | None, bytes], tuple[int, ...]] = {}

    def outside(self, method: str, url: httpx.URL) -> tuple[int, ...]:
        if len(self._bases) < 2:
            return ()
        key = (method, url.scheme, url.host, url.port, url.raw_path)
        found = self._cache.get(key)
        if found is None:
            if len(self._cache) >= _CACHE:
                self._cache.clear()
            found = self._cache[key] = outside(method, url, self._bases)
        return found
