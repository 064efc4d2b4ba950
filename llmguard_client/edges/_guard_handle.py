"""What the edges need of a Guard, as a protocol: the Guard builds the edges, so they must not import it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import httpx
    import httpx2

    from llmguard_client._core.transport import GuardTransport
    from llmguard_client._routing.replicas import ReplicaSet


class GuardHandle(Protocol):
    """A `Guard` as the edges see it: its core transport, its pools, and the ways to close it or build clients."""

    _replica_set: ReplicaSet

    @property
    def transport(self) -> GuardTransport: ...

    async def aclose(self, grace: float = 0.0) -> None: ...

    def _refuse_if_closed(self) -> None: ...

    def http_client(self, **kwargs: Any) -> httpx.AsyncClient: ...

    def sync_http_client(self, **kwargs: Any) -> httpx.Client: ...

    def httpx2_client(self, **kwargs: Any) -> httpx2.AsyncClient: ...

    def sync_httpx2_client(self, **kwargs: Any) -> httpx2.Client: ...
