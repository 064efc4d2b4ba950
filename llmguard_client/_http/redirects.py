"""Redirects to an origin that is no replica's: the request that follows one is sent there, not to a replica.

A client that follows redirects sends a new request to the answer's ``Location``. The guard sends every request
to its replicas (a client's base URL may name no host at all), so a redirect to another origin (``http://`` to
``https://``, another host) would go back to a replica, be redirected again, and so on until the client gives up.
`RedirectTargets` remembers each such target from the answer that names it until the request that follows it
comes, for a short while: the transport sends that request where it points, as the SDK's own client would.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

import httpx

from llmguard_client._http.origin import OriginKey, origin, origin_key

logger = logging.getLogger("llmguard_client")

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
KEEP_FOR = 60.0
"""Seconds a target is remembered: a client follows a redirect at once, so this only bounds the memory."""
MOST = 1024
"""Targets remembered at once; beyond it the oldest are forgotten (their requests go to the replicas)."""

Tag = TypeVar("Tag")


class RedirectTargets(Generic[Tag]):
    """Targets of redirects to origins that are no replica's, each with a ``Tag`` (what the answer's call was),
    taken once by the request that follows it."""

    def __init__(self, replicas: Iterable[httpx.URL], *, keep_for: float = KEEP_FOR, most: int = MOST) -> None:
        self._replicas = frozenset(origin_key(url) for url in replicas)
        self._keep_for = keep_for
        self._most = most
        self._pending: deque[tuple[float, OriginKey, bytes, Tag]] = deque()
        """(noted at, origin, path and query, tag) in the order noted; each answer's is taken once."""
        self._warned: set[str] = set()

    def __len__(self) -> int:
        return len(self._pending)

    def note(self, request: httpx.Request, response: httpx.Response, tag: Tag, now: float, *, own: bool) -> None:
        """Remember where ``response`` redirects ``request`` if that origin is no replica's. ``own``: the
        request's origin is the guard's (its base URL, rebased onto the replicas), so a target there is too."""
        if response.status_code not in REDIRECT_STATUSES or "location" not in response.headers:
            return
        url = _followed_url(request.url, response.headers["location"])
        if url is None:
            return
        key = origin_key(url)
        if key in self._replicas or (own and key == origin_key(request.url)):
            return
        self._forget_expired(now)
        if len(self._pending) >= self._most:
            self._pending.popleft()
        self._pending.append((now, key, url.raw_path, tag))
        name = origin(url)
        if name not in self._warned and len(self._warned) < self._most:
            self._warned.add(name)
            logger.warning(
                "llmguard: a server redirected a call to %s, which is no replica's origin: the request that "
                "follows it is sent there as it is, with no retry, hedge or deadline of the guard's; if the "
                "model is served there, give that URL as the replica",
                name,
            )

    def take(self, url: httpx.URL, now: float) -> Tag | None:
        """The tag of a redirect to ``url`` noted in the last ``keep_for`` seconds (taken: once per answer)."""
        self._forget_expired(now)
        key, path = origin_key(url), url.raw_path
        for index, (_, origin_of, path_of, tag) in enumerate(self._pending):
            if origin_of == key and path_of == path:
                del self._pending[index]
                return tag
        return None

    def _forget_expired(self, now: float) -> None:
        while self._pending and self._pending[0][0] <= now - self._keep_for:
            self._pending.popleft()


def _followed_url(request_url: httpx.URL, location: str) -> httpx.URL | None:
    """The URL a client follows ``location`` to, as httpx resolves it (None: not a URL)."""
    try:
        url = httpx.URL(location)
    except httpx.InvalidURL:
        return None
    if url.scheme and not url.host:
        url = url.copy_with(host=request_url.host)
    if url.is_relative_url:
        url = request_url.join(url)
    if url.scheme not in ("http", "https") or not url.host:
        return None
    return url
