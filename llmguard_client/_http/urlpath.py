"""An URL's path as it is sent: its percent-escapes kept.

httpx's ``URL.path`` decodes them (``/gw%2Fx/v1`` reads ``/gw/x/v1``, ``/dep%3Fx`` reads ``/dep?x``), and
``copy_with(path=...)`` encodes only what is not an escape already: a path read with one and written with the
other is another path, or none (a ``?``). Paths compared, cut and joined as sent mean what their client meant.
"""

from __future__ import annotations

import httpx


def sent_path(url: httpx.URL) -> str:
    """``url``'s path as sent, without its query: ``/gw%2Fx/v1`` stays ``/gw%2Fx/v1``."""
    return url.raw_path.split(b"?", 1)[0].decode("ascii")


def with_sent_path(url: httpx.URL, path: str, query: bytes = b"") -> httpx.URL:
    """``url`` with ``path`` as sent (`sent_path`'s form) and ``query`` (none when empty)."""
    raw = path.encode("ascii")
    return url.copy_with(raw_path=raw + b"?" + query if query else raw)
