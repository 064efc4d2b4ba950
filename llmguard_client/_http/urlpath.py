"""An URL's path as it is sent: its percent-escapes kept, and compared in the form that means the same to a server.

httpx's ``URL.path`` decodes them (``/gw%2Fx/v1`` reads ``/gw/x/v1``, ``/dep%3Fx`` reads ``/dep?x``), and
``copy_with(path=...)`` encodes only what is not an escape already: a path read with one and written with the
other is another path, or none (a ``?``). Paths cut and joined as sent mean what their client meant.

Two spellings of one path are taken for the same: ``team@corp`` and ``team%40corp``, ``~me`` and ``%7Eme``,
``%c3%a8`` and ``%C3%A8``. (RFC 3986 6.2.2 makes that so for letters, digits, ``-._~`` and the case of hex digits; the
guard takes the escapes of the other characters a path segment may hold as they are, ``:``, ``@``, ``+``, ``;``..., for
them too, as servers mostly read them: it only matches a request to its replica's base with it, and sends each
replica its own spelling.) Paths are compared segment by segment (split on a literal ``/``) in their
`normal_segment` form.
"""

from __future__ import annotations

import functools
import re
import string

import httpx

_LITERAL = frozenset(string.ascii_letters + string.digits + "-._~" + "!$&'()*+,;=" + ":@")
"""What a path segment may hold literally (RFC 3986 ``pchar`` but escapes): unreserved, sub-delims, ':' and '@'.
An escape of one of these means the character; an escape of anything else (``%2F``, ``%3F``, ``%23``, ``%25``,
non-ASCII) is not the character, and stays an escape."""
_HEX = frozenset(string.hexdigits)


def sent_path(url: httpx.URL) -> str:
    """``url``'s path as sent, without its query: ``/gw%2Fx/v1`` stays ``/gw%2Fx/v1``."""
    return url.raw_path.split(b"?", 1)[0].decode("ascii")


def with_sent_path(url: httpx.URL, path: str, query: bytes = b"") -> httpx.URL:
    """``url`` with ``path`` as sent (`sent_path`'s form) and ``query`` (none when empty)."""
    raw = path.encode("ascii")
    return url.copy_with(raw_path=raw + b"?" + query if query else raw)


@functools.lru_cache(maxsize=4096)  # a replica's base segments are compared on every call not yet cached
def normal_segment(segment: str) -> str:
    """One path segment as sent, in the form its other spellings share: an escape of a character it may hold
    literally decoded (``%40`` is ``@``, ``%7e`` is ``~``), every other escape upper-cased (``%2f`` is ``%2F``), and a
    character it may not hold literally escaped (``|`` is ``%7C``, a ``%`` starting no escape is ``%25``)."""
    if _LITERAL.issuperset(segment):  # no escape, nothing to escape: its own form (most segments)
        return segment
    out: list[str] = []
    i = 0
    while i < len(segment):
        char = segment[i]
        if char == "%" and i + 2 < len(segment) and segment[i + 1] in _HEX and segment[i + 2] in _HEX:
            code = segment[i + 1 : i + 3].upper()
            decoded = chr(int(code, 16))
            out.append(decoded if decoded in _LITERAL else "%" + code)
            i += 3
            continue
        out.append(char if char in _LITERAL else "".join(f"%{b:02X}" for b in char.encode()))
        i += 1
    return "".join(out)


def normal_path(path: str) -> str:
    """``path`` as sent with each segment in its `normal_segment` form: equal for two spellings of one path."""
    return "/".join(normal_segment(segment) for segment in path.split("/"))


def path_under(path: str, prefix: str) -> str | None:
    """What follows ``prefix`` in ``path`` ("" for the prefix itself), as ``path`` spells it; None when ``path`` is
    not under it. Both as sent, compared in their `normal_path` form whole segment by segment: ``/team@corp/v1/x``
    is under ``/team%40corp/v1`` (its rest ``/x``), ``/gw/x/v1`` is not under ``/gw%2Fx``."""
    if "%" not in path and "%" not in prefix:  # no escape: one spelling each, compared as they are (most paths)
        if path == prefix:
            return ""
        return path[len(prefix) :] if path.startswith(prefix + "/") else None
    segments, head = path.split("/"), prefix.split("/")
    if len(segments) < len(head) or any(
        a != b and normal_segment(a) != normal_segment(b) for a, b in zip(segments, head, strict=False)
    ):
        return None
    rest = segments[len(head) :]
    return "/" + "/".join(rest) if rest else ""


def names_endpoint(path: str, suffixes: tuple[str, ...]) -> bool:
    """Whether ``path`` (a trailing ``/`` aside) ends with one of the endpoints' ``suffixes``, as a generation call's
    does (``/v1/messages``, ``/openai/deployments/d/chat/completions``), and is not a message of the Assistants API's
    threads: ``/v1/threads/{id}/messages`` stores a message in a thread, it is no Messages call."""
    path = path.rstrip("/")
    if not path.endswith(suffixes):
        return False
    if not path.endswith(_MESSAGES):
        return True
    before = path[: -len(_MESSAGES)].split("/")
    return not (len(before) >= 2 and before[-2] == "threads" and not _API_VERSION.fullmatch(before[-1]))


_MESSAGES = "/messages"
_API_VERSION = re.compile(r"v\d+[a-z0-9]*")
"""``v1``, ``v1beta``: the segment before ``/messages`` in a Messages call behind a base path ending ``/threads``."""
