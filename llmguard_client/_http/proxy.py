"""The proxy the environment names for a URL, chosen as the SDKs' own httpx and httpx2 clients choose it.

An ``openai`` or ``anthropic`` client left to its defaults sends through the proxy that ``HTTP_PROXY``,
``HTTPS_PROXY`` or ``ALL_PROXY`` names (``NO_PROXY`` honoured): httpx reads the environment when the client is
built (``trust_env``), but only for a client without a transport of its own, and a guarded client's
transport is the guard. So the guard reads the environment itself, when it builds each replica's pool, with
the libraries' own rules: their reading of the variables, their patterns, and their order among them (the most
specific pattern that matches wins). Where the machine can reach the model only through a proxy, a guarded call
goes where the plain SDK's would.

A replica's pool serves every SDK, those on httpx (openai < 3) and those on httpx2 (openai >= 3, anthropic),
whose ``NO_PROXY`` rules differ: httpx2 also takes IP networks (``10.0.0.0/8``, ``fd00::/8``), ``*.domain`` and
bracketed IPv6 (``[::1]:8000``). A URL either library connects to directly is connected to directly; an entry a
library cannot read is skipped (as curl and Go skip it), never an error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

import httpx
from httpx._utils import URLPattern, get_environment_proxies

__all__ = ["environment_proxy"]

_Url = TypeVar("_Url", contravariant=True)


class _Pattern(Protocol[_Url]):
    """A library's ``URLPattern`` (httpx's or httpx2's), matching that library's URLs."""

    @property
    def priority(self) -> tuple[int, ...]: ...

    def matches(self, other: _Url) -> bool: ...


def environment_proxy(url: httpx.URL | str) -> httpx.Proxy | None:
    """The proxy the environment names for ``url`` (None: connect directly), as ``httpx.AsyncClient()`` would
    choose it, unless ``httpx2.AsyncClient()`` would connect directly."""
    url = httpx.URL(url)
    proxy = _chosen(get_environment_proxies(), URLPattern, url)
    if proxy is None or _httpx2_connects_directly(url):
        return None
    return httpx.Proxy(url=proxy)


def _chosen(mounts: Mapping[str, str | None], pattern: Callable[[str], _Pattern[_Url]], url: _Url) -> str | None:
    """The proxy of the most specific of a library's ``mounts`` that matches ``url`` (None: directly); a key the
    library cannot parse is skipped (httpx's own client raises for ``[::1]`` or ``fd00::/8``)."""
    patterns: list[tuple[_Pattern[_Url], str | None]] = []
    for key, proxy in mounts.items():
        try:
            patterns.append((pattern(key), proxy))
        except (httpx.InvalidURL, ValueError):  # ValueError: idna's errors, for a name it refuses
            continue
    for candidate, proxy in sorted(patterns, key=lambda item: item[0].priority):
        if candidate.matches(url):
            return proxy
    return None


def _httpx2_connects_directly(url: httpx.URL) -> bool:
    """Whether httpx2's ``NO_PROXY`` rules send ``url`` directly. False without httpx2, and where httpx2 cannot
    read ``NO_PROXY`` at all: an internationalised name there (``xn--mnchen-3ya.de``) raises in its reading, so
    its clients cannot be built and those on httpx, which read it, are the ones served."""
    try:
        import httpx2
        from httpx2._utils import URLPattern as Httpx2Pattern
        from httpx2._utils import get_environment_proxies as httpx2_environment_proxies
    except ImportError:
        return False
    try:
        return _chosen(httpx2_environment_proxies(), Httpx2Pattern, httpx2.URL(str(url))) is None
    except (httpx2.InvalidURL, ValueError):
        return False
