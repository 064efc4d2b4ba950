"""Secrets never printed: URL userinfo, credential-looking query values and header values; the credential headers."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping

import httpx

MASK = "***"
CREDENTIALS = frozenset({b"authorization", b"api-key", b"x-api-key", b"x-goog-api-key"})
"""Headers that carry an API credential (lowercase). A replica that replaces one of the caller's also drops the
caller's others that carry the same key (`llmguard_client._core.call.Call.attempt_request`): openai 1.x's
``AzureOpenAI`` sends its key as ``api-key`` and as ``Authorization: Bearer`` both, and a replica setting only its
own ``api-key`` would otherwise carry the other resource's key in the Bearer header; and those that carry a key
another replica is configured with, under whatever name (anthropic sends its key as ``Authorization: Bearer``
where the replicas set ``x-api-key``). Another credential (a gateway's user token) is kept. A `Replica` may not set
one empty (`llmguard_client.config`). A replica URL's userinfo is its ``Authorization`` (`basic_credential`)."""
_SECRET_QUERY_KEYS = frozenset(
    {
        *("key", "api_key", "apikey", "api-key", "x-api-key", "subscription-key", "code"),  # Azure APIM, Functions
        *("token", "access_token", "auth", "password", "secret", "client_secret"),
        *("sig", "signature", "x-amz-signature", "x-amz-credential", "x-amz-security-token"),  # SAS, AWS presigned
    }
)


def redact_url(url: str | httpx.URL) -> str:
    """``url`` with its userinfo and credential-looking query values masked."""
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
    except Exception:
        return MASK
    if parsed.userinfo:
        parsed = parsed.copy_with(username=MASK, password=MASK if parsed.password else None)
    if parsed.query:
        params = [(k, MASK if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in parsed.params.multi_items()]
        parsed = parsed.copy_with(params=params)
    return str(parsed).replace("%2A%2A%2A", MASK)


def mask_url_secrets(text: str) -> str:
    """``text`` (a URL as given, valid or not, or a message quoting one) with every ``//user:password@`` masked, and
    the values of credential-looking query parameters (``?api-key=...``, ``&sig=...``)."""
    return _SECRET_QUERY.sub(lambda m: m.group(1) + MASK, _USERINFO.sub("//" + MASK + "@", text))


_USERINFO = re.compile(r"//[^/?#@]*@")
_SECRET_QUERY = re.compile(
    r"([?&](?:" + "|".join(sorted(map(re.escape, _SECRET_QUERY_KEYS), key=len, reverse=True)) + r")=)[^&#'\"\s]*",
    re.IGNORECASE,
)


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Header names kept, every value masked."""
    return {name: MASK for name in headers}


def credential_key(value: bytes) -> bytes:
    """The key a credential header's value carries: the token of an ``Authorization: Bearer ...``, else the value."""
    scheme, _, token = value.strip().partition(b" ")
    return token.strip() if token and scheme.lower() == b"bearer" else value.strip()


def basic_credential(url: httpx.URL) -> bytes | None:
    """The ``Authorization`` value ``url``'s userinfo stands for, as httpx builds it from a client URL's
    (``Basic`` and the base64 of ``user:password``, UTF-8); None without userinfo."""
    if not (url.username or url.password):
        return None
    return b"Basic " + base64.b64encode(f"{url.username}:{url.password}".encode())
