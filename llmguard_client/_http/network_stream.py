"""The ``network_stream`` response extension as the guard hands it to its caller: what the connection is, not the
connection.

httpx puts the connection's network stream on every response, for callers to read ``get_extra_info("server_addr")``
(the peer that answered) and for an HTTP ``CONNECT`` or ``Upgrade`` to read and write it directly. Through the
guard the connection is its pool's and its body reader's: a caller's read would take bytes from the stream the guard
checks (a break it would answer with a continuation, counted against a healthy replica), a close would drop a pooled
connection under the guard. So the caller gets `NetworkStreamInfo`: ``get_extra_info`` of the connection that
answered, and nothing that reads, writes or closes it.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, NoReturn, TypeVar

EXTENSION = "network_stream"

_INFO = frozenset({"client_addr", "server_addr", "ssl_object", "is_readable"})
"""The extra info a caller may ask for: httpx's documented keys but ``socket`` (a handle to close the connection)."""

_Extensions = TypeVar("_Extensions", bound=MutableMapping[str, Any])

_IO = frozenset({"read", "write", "aclose", "close", "start_tls"})


class NetworkStreamInfo:
    """The ``get_extra_info`` of a connection the guard owns (httpcore's network stream, kept, never used else)."""

    __slots__ = ("_stream",)

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def get_extra_info(self, info: str) -> Any:
        """``client_addr``, ``server_addr``, ``ssl_object`` or ``is_readable`` as httpx answers it; None for any
        other key (``socket`` included), and for an address of a connection closed since."""
        if info not in _INFO:
            return None
        try:
            return self._stream.get_extra_info(info)
        except OSError:  # the socket was closed since: asked of it, its address is gone
            return None

    def __getattr__(self, name: str) -> NoReturn:
        if name in _IO:
            raise AttributeError(
                f"the guard's response offers only get_extra_info() on its network_stream, not {name}(): "
                "the connection belongs to the guard's pool"
            )
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"<NetworkStreamInfo of {self._stream!r}>"


def for_caller(extensions: _Extensions) -> _Extensions:
    """``extensions`` (a caller's response's own, or a copy to build one from) with the network stream in them
    as `NetworkStreamInfo`, changed in place."""
    stream = extensions.get(EXTENSION)
    if stream is not None and not isinstance(stream, NetworkStreamInfo):
        extensions[EXTENSION] = NetworkStreamInfo(stream)
    return extensions
