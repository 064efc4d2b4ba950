"""The fleet-wide bucket's Lua script, run in Redis once per admission (`llmguard_client._ratelimit.buckets`):
its text, its SHA for ``EVALSHA``, loading it, and its arguments."""

from __future__ import annotations

import hashlib
import math
from typing import Any

from llmguard_client.config import RateLimit

__all__ = ["FLEET_SCRIPT", "SCRIPT_SHA", "load_script", "run_script", "script_args"]

FLEET_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local s = redis.call('HMGET', KEYS[1], 'r', 't', 'ts', 'n')
local cap = {tonumber(ARGV[1]), tonumber(ARGV[3])}
local rate = {tonumber(ARGV[2]), tonumber(ARGV[4])}
local level = {tonumber(s[1]) or cap[1], tonumber(s[2]) or cap[2]}
local cost = {tonumber(ARGV[5]), tonumber(ARGV[6])}
local adjust = {tonumber(ARGV[8]), tonumber(ARGV[9])}
local room = {ARGV[10], ARGV[11]}
local elapsed = math.max(0, now - (tonumber(s[3]) or now))
local wait = 0
for i = 1, 2 do
  level[i] = math.min(cap[i], math.min(cap[i], level[i] + elapsed * rate[i]) + adjust[i])
  if room[i] ~= '' and rate[i] > 0 then level[i] = math.min(level[i], tonumber(room[i])) end
  if rate[i] > 0 then wait = math.max(wait, (math.min(cost[i], cap[i]) - level[i]) / rate[i]) end
end
local admitted = 0
local n = tonumber(s[4]) or 0
if wait <= tonumber(ARGV[7]) then
  admitted = 1
  n = n + 1
  for i = 1, 2 do level[i] = level[i] - cost[i] end
end
redis.call('HSET', KEYS[1], 'r', tostring(level[1]), 't', tostring(level[2]), 'ts', tostring(now), 'n', tostring(n))
redis.call('PEXPIRE', KEYS[1], ARGV[12])
return {admitted, tostring(wait), tostring(n)}
"""
"""The fleet-wide admission: refill on the server's clock, apply this process's pending corrections and the
provider's reported room, then admit (reserving the cost) if the wait is within ``max_wait``, counting the
admissions (``n``, returned with the decision and the wait: each process's share). KEYS[1]: the bucket's hash;
ARGV: capacity and rate of requests, then of tokens; the cost (requests, tokens); max_wait;
pending adjustments (requests, tokens); reported room (requests, tokens; '' for none); the key's TTL in ms."""
SCRIPT_SHA = hashlib.sha1(FLEET_SCRIPT.encode()).hexdigest()


_PROBE = "return 0"
_PROBE_SHA = hashlib.sha1(_PROBE.encode()).hexdigest()


async def load_script(redis: Any) -> None:
    """Cache the script in Redis, and check that this user may run it (EVALSHA, of a script Redis lacks: no
    effect): an ACL that refuses it fails the connection here, saying so once, rather than the first call of each
    session. (EVAL, the fallback after Redis lost the script, is not probed: it runs a script.)"""
    await redis.script_load(FLEET_SCRIPT)
    await _ignoring_noscript(redis.evalsha(_PROBE_SHA, 0))


async def _ignoring_noscript(reply: Any) -> Any:
    """``await reply``, None if Redis does not have the script (a refusal by the ACL comes first and is raised)."""
    try:
        return await reply
    except Exception as exc:
        if type(exc).__name__ != "NoScriptError" and "NOSCRIPT" not in str(exc):
            raise
        return None


async def run_script(redis: Any, key: str | None, args: list[str]) -> Any:
    """The script on ``key``: by its SHA, or by its text when Redis does not have it (first use, a restart)."""
    try:
        return await redis.evalsha(SCRIPT_SHA, 1, key, *args)
    except Exception as exc:
        if type(exc).__name__ != "NoScriptError" and "NOSCRIPT" not in str(exc):
            raise
        return await redis.eval(FLEET_SCRIPT, 1, key, *args)


NO_DEADLINE_WAIT = 1e12
"""``max_wait`` for a call without a deadline (``Tier(ttft=math.inf)``), as a finite number: Lua's ``tonumber`` reads
``"inf"`` only where the server's C library does."""


def script_args(
    limit: RateLimit, tokens: float, max_wait: float, pending: list[float], room: list[int | None]
) -> list[str]:
    rates = [(x or 0.0) / 60.0 for x in (limit.requests_per_minute, limit.tokens_per_minute)]
    ttl_ms = int(max(60.0, 2 * limit.burst) * 1000)  # an idle bucket refills to full well before it expires
    return [
        repr(rates[0] * limit.burst),
        repr(rates[0]),
        repr(rates[1] * limit.burst),
        repr(rates[1]),
        "1",
        repr(float(tokens)),
        repr(max_wait if math.isfinite(max_wait) else NO_DEADLINE_WAIT),
        repr(pending[0]),
        repr(pending[1]),
        "" if room[0] is None else str(room[0]),
        "" if room[1] is None else str(room[1]),
        str(ttl_ms),
    ]
