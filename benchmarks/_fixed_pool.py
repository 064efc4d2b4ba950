"""A diagnostic for `pool_burst.py`: httpcore 1.0.9's pool with its assignment pass done in one scan.

httpcore 1.0.9's ``AsyncConnectionPool._assign_requests_to_connections`` runs on every request
arrival, every re-queue and every response close, and

- for each idle connection rebuilds a list of *all* connections to compare with
  ``max_keepalive_connections`` (so a pass costs idle x connections, and the limit is checked
  against all connections, not the idle ones);
- for each queued request rebuilds the lists of available and idle connections (queued x
  connections);
- hands the same still-IDLE connection to every request assigned before the first of them starts
  on it; the others fail with ``ConnectionNotAvailable`` and go round again (a herd, each round
  another full pass).

`use_single_pass_assignment` replaces that method *on one pool instance* by a pass that scans the
connections once, counts idle connections once, and never hands a connection that is already
reserved by a waiting request (or already handed out in this pass) to another one. HTTP/1.1 only,
which is what the guard's pools speak. It exists to test the explanation above, not to ship:
the same fixes are in httpx2's pool (pydantic/httpx2 PRs 974 and 1075).
"""

from __future__ import annotations

import types
from typing import Any

import httpx


def _single_pass_assign(self: Any) -> list[Any]:
    closing: list[Any] = []
    reserved = {r.connection for r in self._requests if r.connection is not None}
    kept: list[Any] = []
    for connection in self._connections:
        if connection.is_closed():
            continue
        if connection not in reserved and connection.has_expired():
            closing.append(connection)
        else:
            kept.append(connection)
    idle = [c for c in kept if c.is_idle() and c not in reserved]
    surplus = len(idle) - self._max_keepalive_connections
    if surplus > 0:
        evicted = set(idle[:surplus])
        closing.extend(idle[:surplus])
        kept = [c for c in kept if c not in evicted]
        idle = idle[surplus:]
    self._connections = kept
    available = [c for c in kept if c.is_available() and c not in reserved]
    for pool_request in [r for r in self._requests if r.is_queued()]:
        origin = pool_request.request.url.origin
        connection = next((c for c in available if c.can_handle_request(origin)), None)
        if connection is not None:
            available.remove(connection)  # HTTP/1.1: one request per connection
            if connection in idle:
                idle.remove(connection)
        elif len(self._connections) < self._max_connections:
            connection = self.create_connection(origin)
            self._connections.append(connection)
        elif idle:
            victim = idle.pop(0)
            self._connections.remove(victim)
            closing.append(victim)
            connection = self.create_connection(origin)
            self._connections.append(connection)
        else:
            continue
        pool_request.assign_to_connection(connection)
    return closing


def use_single_pass_assignment(transport: httpx.AsyncHTTPTransport) -> httpx.AsyncHTTPTransport:
    """``transport`` with its pool's assignment pass replaced (see the module docstring)."""
    pool = transport._pool
    pool._assign_requests_to_connections = types.MethodType(_single_pass_assign, pool)  # type: ignore[method-assign]
    return transport
