"""Each replica's connection pool: httpx's, with httpcore 1.0's connection assignment done in one pass.

httpcore 1.0's ``AsyncConnectionPool`` hands a still-idle connection to *every* request queued in the
same pass: requests released together all get the first idle connection, one sends on it and the
others fail with ``ConnectionNotAvailable``, re-queue, and get the next idle connection together, and
so on. While any connection is idle it creates no new one, so a burst on a warm pool is served a few
requests at a time over the connections it kept (encode/httpcore#822), and each of those passes
rescans every connection and request. httpcore2, the pool under openai >= 3's own client, fixed this
(a connection handed to a waiting request is reserved; one scan per pass).

`replica_transport` is httpx's ``AsyncHTTPTransport`` whose pool runs `_assign_once` instead: the same
fix, on httpcore 1.0's own pool (so everything else, including mocking with respx, is unchanged).
HTTP/1.1 only, which is what these pools speak: an idle connection takes one request.
"""

from __future__ import annotations

import ssl

import httpcore
import httpx

_FIXED_VERSIONS = ("1.0.",)
"""httpcore releases whose pool `ReplicaPool` is written against (their private assignment pass)."""


class ReplicaPool(httpcore.AsyncConnectionPool):
    """httpcore's HTTP/1.1 connection pool whose assignment never hands one connection to two requests."""

    def _assign_requests_to_connections(self) -> list[httpcore.AsyncConnectionInterface]:
        return _assign_once(self)


def _assign_once(pool: httpcore.AsyncConnectionPool) -> list[httpcore.AsyncConnectionInterface]:
    """Drop closed connections, close expired and surplus idle ones, then give each queued request an idle
    connection no other request holds, or a new one: one scan of connections and requests. Returns the
    connections to close (the pool closes them outside its lock)."""
    closing: list[httpcore.AsyncConnectionInterface] = []
    reserved = {r.connection for r in pool._requests if r.connection is not None}
    kept: list[httpcore.AsyncConnectionInterface] = []
    idle: list[httpcore.AsyncConnectionInterface] = []
    for connection in pool._connections:
        if connection.is_closed():
            continue
        held = connection in reserved
        if not held and connection.has_expired():  # an idle socket is probed: only for unheld ones
            closing.append(connection)
            continue
        kept.append(connection)
        if not held and connection.is_idle():
            idle.append(connection)
    surplus = len(idle) - pool._max_keepalive_connections
    if surplus > 0:  # keep-alive limits idle connections, oldest closed first
        evicted = set(idle[:surplus])
        closing.extend(idle[:surplus])
        kept = [c for c in kept if c not in evicted]
        idle = idle[surplus:]
    pool._connections = kept
    budget = pool._max_connections - len(kept)
    for request in pool._requests:
        if not idle and budget <= 0:
            break  # nothing left to hand out
        if not request.is_queued():
            continue
        origin = request.request.url.origin
        found = next((c for c in idle if c.can_handle_request(origin)), None)
        if found is not None:
            idle.remove(found)
            connection = found
        else:
            if budget > 0:
                budget -= 1
            else:  # full: an idle connection to another origin makes room
                victim = idle.pop(0)
                kept.remove(victim)
                closing.append(victim)
            connection = pool.create_connection(origin)
            kept.append(connection)
        request.assign_to_connection(connection)
    return closing


def replica_transport(limits: httpx.Limits, verify: ssl.SSLContext) -> httpx.AsyncHTTPTransport:
    """httpx's transport (no transport-level retries: the guard decides), its pool a `ReplicaPool` when the
    installed httpcore is one `ReplicaPool` is written for (else httpcore's own pool, unchanged)."""
    transport = httpx.AsyncHTTPTransport(limits=limits, retries=0, verify=verify)
    pool = transport._pool
    if type(pool) is httpcore.AsyncConnectionPool and httpcore.__version__.startswith(_FIXED_VERSIONS):
        pool.__class__ = ReplicaPool  # the same pool, built by httpx with its settings; only the pass differs
    return transport
