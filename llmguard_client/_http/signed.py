"""Requests whose headers the client signed: what the guard must send exactly as it came.

A cloud SDK signs its request, headers and URL, before the HTTP client sees it: AWS Signature Version 4
(``Authorization: AWS4-HMAC-SHA256 Credential=..., SignedHeaders=host;x-amz-date;..., Signature=...``; Google's
``GOOG4-HMAC-SHA256`` HMAC form is the same), a presigned URL (``X-Amz-SignedHeaders`` / ``X-Goog-SignedHeaders`` in
its query), or HTTP Message Signatures (RFC 9421: ``Signature-Input`` lists the covered components). The server
checks the signature against what arrives: a signed header changed, dropped or added to, or the request sent to
another host or path, and it answers 403. `signature_of` reads which headers are signed, and whether the URL is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl

__all__ = ["Signed", "signature_of"]

_SIGNED_HEADERS = re.compile(rb"signedheaders=([^,\s]*)", re.IGNORECASE)
_QUERY_SIGNED = ("x-amz-signedheaders", "x-goog-signedheaders")
_COMPONENT = re.compile(rb'"([^"]*)"')
_COMPONENTS = re.compile(rb"\(([^)]*)\)")
_URL_COMPONENTS = frozenset(
    {b"host", b"@authority", b"@target-uri", b"@scheme", b"@request-target", b"@path", b"@query", b"@query-param"}
)
"""RFC 9421 components (and ``host``) that sign where the request goes."""
_REBUILT = frozenset({b"host", b"content-length", b"transfer-encoding"})
"""Headers each attempt writes itself, from the same URL and body (the same bytes when the URL is kept)."""


@dataclass(frozen=True, slots=True)
class Signed:
    """What a signature covers: the headers to forward exactly as they came, and whether the URL is signed."""

    headers: frozenset[bytes]
    """Lower-case names of the headers to forward as they came: the signed ones and those carrying the signature
    (``Authorization``; ``Signature`` and ``Signature-Input``), never replaced, removed or rewritten."""
    url: bool
    """The host (and path) are signed: the request goes only to its own origin, its URL unchanged."""


def signature_of(authorization: bytes | None, signature_input: bytes | None, query: bytes) -> Signed | None:
    """The signature of a request, from its ``Authorization`` and ``Signature-Input`` headers and its URL's
    query; None when nothing signs it. A SigV4 signature (header or query) always covers the host and the path."""
    names: set[bytes] = set()
    url = False
    if authorization is not None:
        found = _SIGNED_HEADERS.search(authorization)
        if found is not None:
            names.update(n.strip().lower() for n in found.group(1).split(b";") if n.strip())
            names.add(b"authorization")
            url = True
    if query and b"signedheaders=" in query.lower():
        for key, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
            if key.lower() in _QUERY_SIGNED:
                names.update(n.strip().lower().encode("latin-1") for n in value.split(";") if n.strip())
                url = True
    if signature_input is not None:
        for inner in _COMPONENTS.findall(signature_input):
            for component in _COMPONENT.findall(inner):
                component = component.lower()
                if component in _URL_COMPONENTS:
                    url = True
                elif not component.startswith(b"@"):
                    names.add(component)
        names.update((b"signature", b"signature-input"))
    if not names and not url:
        return None
    return Signed(frozenset(names - _REBUILT), url or b"host" in names)
