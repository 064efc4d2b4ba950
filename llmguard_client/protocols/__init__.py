"""One reader per wire protocol: what a first content token, an in-stream error and a complete answer are.

`reader_for` picks the reader of an answer (see `llmguard_client.protocols.select`); `read_opening`
reads it to its first content token or failure; the transport keeps feeding the same reader after the
first token and asks it at EOF (`StreamReader.end_of_body`). Modules: `chat`, `completions`,
`responses`, `messages` (event streams), `body` (plain bodies), `passthrough` (everything else),
`sse` (event-stream framing), `errors` (error objects), `raising` (failures as exceptions).
"""

from __future__ import annotations

from llmguard_client.protocols.base import FailureKind, ResponseFacts, StreamFailure, StreamReader
from llmguard_client.protocols.opening import Opening, read_opening
from llmguard_client.protocols.raising import stream_error
from llmguard_client.protocols.select import PROTOCOLS, WireProtocol, protocol_for, reader_for

__all__ = [
    "PROTOCOLS",
    "FailureKind",
    "Opening",
    "ResponseFacts",
    "StreamFailure",
    "StreamReader",
    "WireProtocol",
    "protocol_for",
    "read_opening",
    "reader_for",
    "stream_error",
]
