"""The proxy the environment names for a URL, chosen as the SDKs' own httpx clients choose it.

An ``openai`` or ``anthropic`` client left to its defaults sends through the proxy that ``HTTP_PROXY``,
``HTTPS_PROXY`` or ``ALL_PROXY`` names (``NO_PROXY`` honoured): httpx reads the environment when the client is
built (``trust_env``), but only for a client without a transport of its own, and a guarded client's
transport is the guard. So the guard reads the environment itself, when it builds each replica's pool, with
httpx's own rules: its reading of the variables, its patterns, and its order among them (the most specific
pattern that matches wins). Where the machine can reach the model only through a proxy, a guarded call goes
where the plain SDK's would.
"""

from __future__ import annotations

import httpx
from httpx._utils import URLPattern, get_environment_proxies

__all__ = ["environment_proxy"]


def environment_proxy(url: httpx.URL | str) -> httpx.Proxy | None:
    """The proxy the environment names for ``url`` (None: connect directly), as ``httpx.AsyncClient()``
    would choose it."""
    url = httpx.URL(url)
    patterns = sorted(((URLPattern(key), proxy) for key, proxy in get_environment_proxies().items()), key=_first)
    for pattern, proxy in patterns:
        if pattern.matches(url):
            return None if proxy is None else httpx.Proxy(url=proxy)
    return None


def _first(item: tuple[URLPattern, str | None]) -> URLPattern:
    return item[0]
