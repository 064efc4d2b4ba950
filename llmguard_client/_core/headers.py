"""The guard's own header names, and `CallerHeaders`: a caller's headers read once per call."""

from __future__ import annotations

import httpx

from llmguard_client._http.signed import Signed, signature_of

__all__ = [
    "CAUSE_HEADER",
    "COHORT_HEADER",
    "KEY_HEADER",
    "MAX_ATTEMPTS_HEADER",
    "SESSION_HEADER",
    "TIER_HEADER",
    "KNOWN_HEADERS",
    "CallerHeaders",
]

TIER_HEADER = "x-llmguard-tier"
COHORT_HEADER = "x-llmguard-cohort"
KEY_HEADER = "x-llmguard-key"
CAUSE_HEADER = "x-llmguard-cause"
SESSION_HEADER = "x-llmguard-session"
"""The call's cache-affinity key; never forwarded, like the other headers a caller sends the guard."""
MAX_ATTEMPTS_HEADER = "x-llmguard-max-attempts"
"""The most requests the call may send (over its tier's ``max_attempts`` and the retry policy's)."""
_GUARD_HEADERS = (
    TIER_HEADER.encode(),
    COHORT_HEADER.encode(),
    KEY_HEADER.encode(),
    SESSION_HEADER.encode(),
    MAX_ATTEMPTS_HEADER.encode(),
)
_ANSWER_HEADERS = (CAUSE_HEADER.encode(), b"x-llmguard-stream-failure", b"x-llmguard-chaos")
"""Headers the guard puts on answers: one copied back onto a request (a proxy, a client replaying an answer's
headers) is dropped, not taken for a misspelt header of the guard's."""
_STRIPPED = frozenset({b"host", b"content-length", b"transfer-encoding", *_GUARD_HEADERS, *_ANSWER_HEADERS})
_OWN_PREFIX = b"x-llmguard-"
KNOWN_HEADERS = ", ".join(h.decode() for h in _GUARD_HEADERS)
"""The guard's own request headers, for messages."""
_AUTHORIZATION = b"authorization"
_SIGNATURE_INPUT = b"signature-input"
_SDK_PREFIX = b"x-stainless-"
"""Headers the Stainless-built SDKs (openai, anthropic) send with every request."""
_GOOGLE_CLIENT = b"x-goog-api-client"
"""The header Google's SDKs (google-genai) send with every request."""
_USER_AGENT = b"user-agent"
_SDK_AGENTS = (b"mistral-client-python/", b"speakeasy-sdk/")
"""The ``User-Agent`` beginnings of SDKs that send no header of their own: mistralai's, Speakeasy-built ones'."""
_HF_AGENT = b"hf_hub/"
"""What huggingface_hub's ``User-Agent`` holds (after the application's name)."""


class CallerHeaders:
    """The caller's headers, read once per call in a single pass (an SDK sends a dozen or more; asking
    them each question apart cost ~100k instructions a call, this ~40k): the ones forwarded to replicas, a ``Host``
    the caller set, whether a Stainless-built SDK sent them, what a signature of the client's covers, and the values
    of the guard's own headers (None when absent)."""

    __slots__ = (
        "cohort",
        "forwarded",
        "from_sdk",
        "from_typed_sdk",
        "host",
        "key",
        "max_attempts",
        "session",
        "signed",
        "tier",
        "unknown",
    )

    def __init__(self, request: httpx.Request) -> None:
        forwarded: list[tuple[bytes, bytes]] = []
        has_own = from_sdk = typed = False
        unknown: str | None = None
        host: bytes | None = None
        authorization = signature_input = None
        dropped_own = False  # an x-llmguard-* header was left out of the forwarded ones
        for key, value in request.headers.raw:
            low = key.lower()
            if low == _AUTHORIZATION:
                authorization = value
            elif low == _SIGNATURE_INPUT:
                signature_input = value
            if low in _STRIPPED:
                has_own = has_own or low in _GUARD_HEADERS
                dropped_own = dropped_own or low.startswith(_OWN_PREFIX)
                if low == b"host":
                    host = value
                continue
            if low.startswith(_OWN_PREFIX):  # a misspelt header of the guard's: refused, never forwarded
                dropped_own = True
                unknown = unknown or low.decode("latin-1")
                continue
            if not from_sdk and low[:12] == _SDK_PREFIX:
                from_sdk = True
            elif not (typed or from_sdk) and _names_typed_sdk(low, value):
                typed = True
            forwarded.append((key, value))
        query = request.url.query
        signed = (
            signature_of(authorization, signature_input, query) if authorization or signature_input or query else None
        )
        if signed is not None and dropped_own:
            kept = signed.headers  # a signed header of the guard's is read, and forwarded as it was signed
            forwarded = [
                (k, v)
                for k, v in request.headers.raw
                if k.lower() in kept or (k.lower() not in _STRIPPED and not k.lower().startswith(_OWN_PREFIX))
            ]
        self.signed: Signed | None = signed
        """What the client's signature covers (`llmguard_client._http.signed`); None: the request is not signed."""
        self.forwarded = forwarded
        """The caller's headers minus the guard's own and those rebuilt per attempt, in order; a signed one is kept
        (the guard's own too: read, and forwarded as it was signed)."""
        self.from_sdk = from_sdk
        """An ``x-stainless-*`` header was sent (the openai and anthropic SDKs send several)."""
        self.from_typed_sdk = from_sdk or typed
        """The request comes from an SDK that raises an error of its own for an HTTP error answer and does not retry a
        refusal answered to it by default: a Stainless-built one (openai, anthropic, groq, together, which read
        ``x-should-retry``), google-genai, mistralai (and other Speakeasy-built ones) or huggingface_hub. Not cohere:
        it retries every 429 and 5xx twice, so a refusal raised to it fails at once instead."""
        self.unknown = unknown
        """The first ``x-llmguard-*`` header that is none of the guard's (a typo such as ``x-llmguard-teir``)."""
        self.host = host if host is not None and host.lower() != request.url.netloc.lower() else None
        """The ``Host`` the caller set itself (None: none, or the one httpx writes from the request's URL): forwarded
        to every replica, as any other header of the caller's, where httpx's is replaced by the replica's."""
        get = request.headers.get if has_own else _absent
        self.tier: str | None = get(TIER_HEADER)
        """``x-llmguard-tier``: the tier to use (over ``guard.tier()`` and the default)."""
        self.cohort: str | None = get(COHORT_HEADER)
        """``x-llmguard-cohort``: the rollout cohort the call is pinned to."""
        self.key: str | None = get(KEY_HEADER)
        """``x-llmguard-key``: the call's rollout key (one cohort per key)."""
        self.session: str | None = get(SESSION_HEADER)
        """``x-llmguard-session``: the call's cache-affinity key."""
        self.max_attempts: str | None = get(MAX_ATTEMPTS_HEADER)
        """``x-llmguard-max-attempts``: the most requests the call may send (checked by `max_attempts`)."""


def _absent(name: str) -> None:
    return None


def _names_typed_sdk(name: bytes, value: bytes) -> bool:
    """Whether the header ``name: value`` (name lowercase) marks a request of an SDK other than a Stainless-built one
    that raises errors of its own (`CallerHeaders.from_typed_sdk`)."""
    if name == _USER_AGENT:
        return value.startswith(_SDK_AGENTS) or _HF_AGENT in value
    return name == _GOOGLE_CLIENT
