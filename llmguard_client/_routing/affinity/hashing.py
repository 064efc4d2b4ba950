"""Which replica a keyed request prefers: rendezvous hashing with bounded load (pure functions, no I/O).

`affinity_order` ranks every replica by a weight hashed from (key, replica) — highest-random-weight hashing —
so a key always prefers the same replica, in every process, and removing a replica moves only the keys that
preferred it. `choose` walks that order and skips replicas that refused the call or already carry more than
their share: ``ceil(c * (total + 1) / n)`` calls, the bound of "consistent hashing with bounded loads"
(Mirrokni, Thorup, Zadimoghaddam), so a hot key spills over instead of piling onto one replica. `place` puts a
key that has no replica yet on the first one in its order whose share of the recent calls is within ``c`` x the
mean: its first call finds nothing cached anywhere, so where it goes costs nothing, and the replicas' shares of
calls stay within ``c`` x the mean however the keys happen to hash. `auto_key`
derives a key from a chat request's system prompt and first user message, the prefix a replica's prompt cache
can reuse.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Container, Mapping, Sequence

__all__ = ["affinity_order", "auto_key", "choose", "document_key", "load_bound", "place"]

_DIGEST = 8


def _weight(key: bytes, replica: str) -> int:
    digest = hashlib.blake2b(replica.encode(), digest_size=_DIGEST, key=key).digest()
    return int.from_bytes(digest, "big")


def affinity_order(key: str, replicas: Sequence[str]) -> list[str]:
    """Every replica, most preferred first for ``key``; the same in every process (blake2b, not ``hash()``)."""
    if not isinstance(key, str):
        raise TypeError(f"an affinity key must be a str, got {type(key).__name__}")
    # blake2b keys are at most 64 bytes: longer keys are hashed down first.
    raw = key.encode()
    bkey = raw if len(raw) <= 64 else hashlib.blake2b(raw, digest_size=32).digest()
    return sorted(replicas, key=lambda replica: (_weight(bkey, replica), replica), reverse=True)


def load_bound(load: Mapping[str, int], n: int, c: float, slack: int = 0) -> int:
    """Most calls a replica may hold after this one is placed: ``ceil(c * (total + 1) / n) + slack``."""
    total = sum(load.values())
    return math.ceil(c * (total + 1) / n) + slack


def choose(
    order: Sequence[str], load: Mapping[str, int], refused: Container[str], c: float = 1.25, slack: int = 0
) -> str | None:
    """The first replica of ``order`` not ``refused`` whose load is under the bound; None if all refused.

    ``load`` maps a replica to its calls in flight (absent: 0), not counting this one. A replica is taken if
    its load plus this call stays within `load_bound` (``slack`` calls more than ``c`` x the mean: a few calls
    more on a lightly loaded replica cost less than a cache miss); when every non-refused replica is over it (possible
    only when refusals shrink the choice), the least loaded of them is taken, first in ``order`` on ties.
    """
    if not (isinstance(c, (int, float)) and math.isfinite(c) and c >= 1):
        raise ValueError(f"c must be a finite number >= 1 (1 = perfectly even load), got {c!r}")
    candidates = [replica for replica in order if replica not in refused]
    if not candidates:
        return None
    if isinstance(slack, bool) or not isinstance(slack, int) or slack < 0:
        raise ValueError(f"slack must be an int >= 0 (calls in flight), got {slack!r}")
    bound = load_bound(load, len(order), c, slack)
    for replica in candidates:
        if load.get(replica, 0) + 1 <= bound:
            return replica
    return min(candidates, key=lambda replica: load.get(replica, 0))


def place(order: Sequence[str], recent: Mapping[str, float], c: float = 1.25, slack: int = 0) -> str | None:
    """Where a key with no replica yet goes: the first of ``order`` whose recent calls (``recent``, absent: 0),
    with this one, stay within ``c * (total + 1) / n + slack``; when none does, the one with the fewest (first
    in ``order`` on ties); None when ``order`` is empty.

    A replica with fewer recent calls than the mean / ``c`` counts as having that many: one that was drained or
    refused for a while takes new keys in their order, instead of every new key until it has caught up (it may
    be slow, which is why it had few)."""
    if not order:
        return None
    floor = sum(recent.get(replica, 0.0) for replica in order) / len(order) / c
    load = {replica: max(floor, recent.get(replica, 0.0)) for replica in order}
    bound = c * (sum(load.values()) + 1.0) / len(order) + slack
    for replica in order:
        if load[replica] + 1.0 <= bound:
            return replica
    return min(order, key=lambda replica: load[replica])


def auto_key(body: bytes) -> str | None:
    """A key for a chat request body: a hash of its system prompt and first user message.

    None when the body is not a JSON object with a ``messages`` list holding a system or user message with
    text. The key is a hex digest, so it never carries prompt text.
    """
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return document_key(doc)


def document_key(document: object) -> str | None:
    """`auto_key` of a body already parsed (its JSON value)."""
    messages = document.get("messages") if isinstance(document, dict) else None
    if not isinstance(messages, list):
        return None
    system = user = None
    for message in messages:
        if not isinstance(message, dict):
            continue
        role, text = message.get("role"), _text(message.get("content"))
        if system is None and role in ("system", "developer") and text:
            system = text
        elif user is None and role == "user" and text:
            user = text
        if system is not None and user is not None:
            break
    if system is None and user is None:
        return None
    digest = hashlib.blake2b(digest_size=16)
    for part in (system or "", user or ""):
        data = part.encode()
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def _text(content: object) -> str:
    """A message content's text: a string, or the ``text`` of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""
