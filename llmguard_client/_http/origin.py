"""An URL's origin: as a record names it, and as a key that compares default ports equal."""

from __future__ import annotations

import httpx

OriginKey = tuple[str, str, int | None]


def origin(url: httpx.URL) -> str:
    """scheme://host[:port], never credentials (what ``record.replica`` names)."""
    port = f":{url.port}" if url.port is not None else ""
    host = f"[{url.host}]" if ":" in url.host else url.host
    return f"{url.scheme}://{host}{port}"


def origin_key(url: httpx.URL) -> OriginKey:
    """(scheme, host, port): ``http://h`` and ``http://H:80`` are one origin."""
    default = {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, url.host.lower(), url.port if url.port is not None else default
