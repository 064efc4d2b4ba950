"""The fleet budget's membership, on the Redis server's clock: which processes synced lately.

Each sync runs `SCRIPT` on the sorted set of process ids (in the sync's one pipelined round trip): it scores this
process with the server's ``TIME`` and drops the ids not scored for ``gone`` seconds, so that no host's wall clock
decides who counts. The server's time comes back with the members, and each process keeps its offset from its own
monotonic clock (`ServerClock`) to place its counts in the budget's buckets on the same clock.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

__all__ = ["SCRIPT", "SCRIPT_SHA", "ServerClock", "is_noscript", "parse"]

SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {t[1], t[2], redis.call('ZRANGE', KEYS[1], 0, -1)}
"""
"""KEYS[1]: the sorted set of process ids; ARGV: this process's id, ``gone`` in seconds, the set's TTL in ms.
Returns the server's time (seconds, microseconds) and the ids that synced within ``gone``."""
SCRIPT_SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()


def is_noscript(reply: object) -> bool:
    """Whether ``reply`` is Redis's refusal of an ``EVALSHA`` of a script it does not have (first use, restart)."""
    return isinstance(reply, Exception) and (type(reply).__name__ == "NoScriptError" or "NOSCRIPT" in str(reply))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def parse(reply: object) -> tuple[float, list[str]] | None:
    """The server's time and the sorted member ids from the script's reply; None for a reply of another shape."""
    if not isinstance(reply, (list, tuple)) or len(reply) != 3 or not isinstance(reply[2], (list, tuple)):
        return None
    try:
        server = int(_text(reply[0])) + int(_text(reply[1])) / 1e6
    except ValueError:
        return None
    return server, sorted(_text(m) for m in reply[2])


class ServerClock:
    """The Redis server's time as seen from this process: a reading of its monotonic clock (the Guard's) plus the
    offset the last sync measured (the server's ``TIME`` against the middle of the round trip that read it: off by
    at most half of it). A step of the host's wall clock (NTP, a resumed VM) does not move it; only before the first
    measurement is the host's wall clock the guess."""

    __slots__ = ("_wall", "offset")

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        self.offset: float | None = None
        """Server time minus the monotonic clock's; None before the first sync."""

    def at(self, now: float) -> float:
        """The server's time when the monotonic clock reads ``now``."""
        return self._wall() if self.offset is None else now + self.offset

    def measured(self, server: float, sent: float, received: float) -> None:
        """The server's ``TIME`` read by a round trip sent and received at these monotonic readings."""
        self.offset = server - (sent + received) / 2
