"""What the fleet needs of a Redis ACL user, and which of it a refusal (``NoPermissionError``) says is missing.

A refusal is a configuration problem, not an outage: reconnecting does not cure it. The store's message for one
names the permission to grant (`explain`), and the fleet docs show `RULES` as an ``ACL SETUSER`` line.
"""

from __future__ import annotations

import re

__all__ = ["CLUSTER_RULES", "COMMANDS", "RULES", "explain"]

COMMANDS = (
    "select",
    "ping",
    "subscribe",
    "unsubscribe",
    "publish",
    "get",
    "mget",
    "set",
    "del",
    "pttl",
    "pexpire",
    "hincrby",
    "hmget",
    "hset",
    "zadd",
    "zrange",
    "zremrangebyscore",
    "eval",
    "evalsha",
    "script|load",
    "time",
)
"""Every command the fleet sends, or runs inside its Lua scripts (the scripts' commands are checked too).
``select``: redis-py picks a database other than 0 with it on each new connection."""
RULES = "resetchannels ~llmguard:* &llmguard:* -@all " + " ".join(f"+{c}" for c in COMMANDS)
"""The ACL rules of a user that may do all the fleet does and nothing else (Redis 7.2 and later may add
``+client|setinfo``, with which redis-py names its connections, ignoring a refusal)."""
CLUSTER_RULES = "+cluster|slots +command"
"""What a Redis Cluster's nodes also grant: redis-py's `RedisCluster` reads the slots' layout and the commands'
key positions with them."""

_COMMAND = re.compile(r"no permissions to run the '([^']+)' command")


def explain(exc: BaseException) -> str | None:
    """For a refusal by the server's ACL: what to grant the fleet's Redis user; None for any other error."""
    if type(exc).__name__ != "NoPermissionError":
        return None
    text = str(exc)
    if "channel" in text:
        grant = "the channels &llmguard:* (Redis 7 gives a new user no channels: resetchannels)"
    elif "key" in text:
        grant = "the keys ~llmguard:*"
    elif (command := _COMMAND.search(text)) is not None:
        grant = f"the command +{command.group(1)}"
    else:
        grant = "what the fleet needs"
    return f"the Redis user lacks a permission the fleet needs: grant {grant} (the fleet docs' Redis permissions)"
