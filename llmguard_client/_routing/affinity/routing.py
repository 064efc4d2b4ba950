"""Cache-aware routing: each call's affinity key, and the replica a key prefers among those the router allows.

A call's key is explicit (the ``x-llmguard-session`` header, else ``with guard.session(key)``) or, under
``AffinityPolicy(auto=True)``, derived from a chat body's system prompt and first user message
(`llmguard_client._routing.affinity.hashing.auto_key`). Among the replicas the router would send it to at all (not
excluded, circuit closed, not drained as degraded, not cooling after a Retry-After, with rate-limit / KV-cache
room, and not straggling: calls in flight and no first token for 3 x its TTFT estimate, and 0.1 s more than it:
`llmguard_client._routing.health.straggling`), a keyed call goes to

- its key's home: the replica that answered the key's last call (this guard remembers the last `HOMES` keys),
  which holds the longest cached prefix of it;
- for a key without a home, among the replicas the router counts as tied for the least cost (`Router.cheapest`:
  all of them while the load is even), the first in the key's rendezvous order (`affinity_order`: the same in
  every process) whose recent calls stay within ``load_factor`` x the mean plus ``load_slack``
  (`affinity.place`): a first call finds nothing cached anywhere, so placing it by load costs nothing, and
  placing it by the order alone on a replica with a longer queue raised the TTFT p95 of single-turn traffic
  under overload;
- then the key's rendezvous order;

taking the first that would hold at most ``load_factor`` x the mean calls in flight plus ``load_slack``
(`affinity.choose`; no slack for a key without a home: nothing of it is cached anywhere). When none qualifies,
the router's own least-cost choice stands. Hedges and retries exclude the replicas the call already used, so
they go to the key's next replica.

A call sent to its key's home is *expected to hit* the server's prefix cache (`expected_hit`): the hedge delay
then comes from the replicas' TTFTs of such calls (`llmguard_client._routing.ttft_stats`).
"""

from __future__ import annotations

import contextlib
import functools
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

from llmguard_client._routing.affinity.hashing import affinity_order, auto_key, choose, document_key, place
from llmguard_client._routing.health import Routable, no_room, recent_calls, straggling
from llmguard_client.config import AffinityPolicy
from llmguard_client.errors import GuardConfigError

__all__ = ["AffinityRouting", "Prefer", "ignored_session", "resolve_affinity", "session_for"]

S = TypeVar("S", bound=Routable)
Prefer = Callable[[list[S]], S | None]
"""Chooses among the replicas the router allows, or None to leave the choice to the router."""
Cheapest = Callable[[list[Any], float], Sequence[Routable]]
"""The router's candidates tied for its least cost at ``now`` (`Router.cheapest`)."""

_ORDERS = 4096
"""Keys whose replica order is remembered (cleared when full): a hash per replica per call saved."""


class AffinityRouting:
    """The keys of calls, and each key's preferred replica; one per `Guard` with affinity on."""

    HOMES = 16_384
    """Keys whose home (the replica that answered their last call) is remembered, least recently used dropped."""

    def __init__(self, names: Sequence[str], policy: AffinityPolicy, cheapest: Cheapest | None = None) -> None:
        """``cheapest(candidates, now)``: the candidates the router counts as tied for its least cost (None: all)."""
        self.policy = policy
        self._cheapest = cheapest
        self._names = list(names)
        self._ranks: dict[str, dict[str, int]] = {}
        self._homes: OrderedDict[str, str] = OrderedDict()
        self._session: ContextVar[str | None] = ContextVar(f"llmguard_session_{id(self)}", default=None)

    def key_for(self, explicit: str | None, body: bytes, document: object = None) -> str | None:
        """A call's key: ``explicit`` (its header), else the current `session`, else one derived from ``body``
        (under ``auto``; from ``document``, the body's JSON value, when the caller has parsed it already), else
        None."""
        key = explicit if explicit is not None else self._session.get()
        if key is None and self.policy.auto and body:
            key = document_key(document) if document is not None else auto_key(body)
        return key

    @contextlib.contextmanager
    def session(self, key: str) -> Iterator[None]:
        """Calls made inside carry ``key`` (a request's ``x-llmguard-session`` header still wins)."""
        _check_key(key)
        token = self._session.set(key)
        try:
            yield
        finally:
            self._session.reset(token)

    def rank(self, key: str) -> dict[str, int]:
        """Each replica's place in ``key``'s order (0: its first choice)."""
        ranks = self._ranks.get(key)
        if ranks is None:
            if len(self._ranks) >= _ORDERS:
                self._ranks.clear()
            order = affinity_order(key, self._names)
            ranks = self._ranks[key] = {name: i for i, name in enumerate(order)}
        return ranks

    def prefer(self, key: str | None, now: float) -> Prefer[S] | None:
        """The chooser for a call keyed ``key`` at ``now`` (None for an unkeyed call)."""
        return None if key is None else functools.partial(self.choose, key, now)

    def choose(self, key: str, now: float, candidates: list[S]) -> S | None:
        """The first of ``candidates`` not refused, within the load bound: the key's home (or, for a key without
        one, where `place` puts it), then the key's order."""
        eligible = [s for s in candidates if not self.refused(s, now)]
        if not eligible:
            return None
        ranks = self.rank(key)
        eligible.sort(key=lambda s: ranks.get(s.name, len(ranks)))
        policy = self.policy
        home, slack = self._homes.get(key), policy.load_slack
        if home is None:  # nothing of it cached anywhere: no slack, a spill costs no cache hit
            if self._cheapest is not None and len(eligible) > 1:
                tied = {s.name for s in self._cheapest(eligible, now)}
                eligible = [s for s in eligible if s.name in tied] or eligible
            recent = {s.name: recent_calls(s.health, now) for s in eligible}
            home, slack = place([s.name for s in eligible], recent, policy.load_factor, policy.load_slack), 0
        eligible.sort(key=lambda s: s.name != home)  # stable: the rest keep the key's order
        by_name = {s.name: s for s in eligible}
        name = choose(list(by_name), {s.name: s.in_flight for s in eligible}, (), policy.load_factor, slack)
        return None if name is None else by_name[name]

    def expected_hit(self, key: str | None, name: str) -> bool:
        """Whether a call keyed ``key`` sent to replica ``name`` should find its prefix cached: ``name`` answered
        the key's last call."""
        return key is not None and self._homes.get(key) == name

    def served(self, key: str | None, name: str) -> bool | None:
        """Replica ``name`` answered a call keyed ``key``: it becomes the key's home. Returns whether the call was
        `expected_hit` (None for an unkeyed call)."""
        if key is None:
            return None
        homes = self._homes
        hit = homes.get(key) == name
        homes[key] = name
        homes.move_to_end(key)
        if len(homes) > self.HOMES:
            homes.popitem(last=False)
        return hit

    def refused(self, s: Routable, now: float) -> bool:
        """Health first: degraded, cooling, without room, or straggling."""
        h = s.health
        return h.drained or s.cooling(now) or no_room(h, now) or straggling(s, now, h.ttft)


def session_for(affinity: AffinityRouting | None, key: str) -> contextlib.AbstractContextManager[None]:
    """``guard.session(key)``: ``affinity``'s session, or with affinity off a checked key that changes nothing."""
    return affinity.session(key) if affinity is not None else ignored_session(key)


@contextlib.contextmanager
def ignored_session(key: str) -> Iterator[None]:
    """``guard.session(key)`` with affinity off: the key is checked, then ignored."""
    _check_key(key)
    yield


def _check_key(key: object) -> None:
    if not isinstance(key, str) or not key:
        # GuardConfigError, as guard.rollout_key() raises for a bad key
        raise GuardConfigError(f"guard.session needs a non-empty str (e.g. a conversation id), got {key!r}")


def resolve_affinity(value: object) -> AffinityPolicy | None:
    """``Guard(affinity=...)`` checked: ``"auto"``, ``"explicit"``, an `AffinityPolicy`, or None (off)."""
    if value is None or isinstance(value, AffinityPolicy):
        return value
    if value == "auto":
        return AffinityPolicy()
    if value == "explicit":
        return AffinityPolicy(auto=False)
    raise GuardConfigError(
        f"affinity must be 'auto' (keys from the conversation, or explicit ones), 'explicit' (only the "
        f"x-llmguard-session header or guard.session()), an AffinityPolicy, or None (off); got {value!r}"
    )
