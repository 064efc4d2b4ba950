"""Any body no protocol reader claims (another path, another content type): passed through.

Its first non-empty bytes count as the first token, so it is handed to the caller at once, never
buffered to the end and never killed by ``ttft`` while it flows (``stall`` and ``total`` still apply);
it has no failures and no facts, and it is complete at EOF.
"""

from __future__ import annotations

from llmguard_client.protocols.base import StreamFailure, StreamReader


class PassthroughReader(StreamReader):
    """See the module docstring."""

    __slots__ = ()
    protocol = "passthrough"

    def feed(self, chunk: bytes) -> bool:
        if chunk:
            self.first_token = True
        return self.first_token

    def end_of_body(self) -> StreamFailure | None:
        self.complete = True
        return None
