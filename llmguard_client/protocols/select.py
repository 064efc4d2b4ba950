"""Which reader judges a response: chosen by the request's method and path and the answer's content type.

==============================  ===============  ==============================================
request                          answer           reader
==============================  ===============  ==============================================
POST .../chat/completions        event stream     `ChatReader`
POST .../completions             event stream     `CompletionsReader`
POST .../responses               event stream     `ResponsesReader`
POST .../messages                event stream     `MessagesReader`
one of those, ``stream: true``   anything else    the protocol's, if the body opens with an event field;
                                                 else `NotAStreamReader` (always a failure)
one of those, not streaming      JSON             `BodyReader` (the protocol's body facts)
one of those, not streaming      event stream     the protocol's, if the body opens with an event field; else
                                                 `BodyReader` (a JSON answer mislabelled by a gateway)
POST .../embeddings              JSON             `EmbeddingsReader`: passed through, model and usage noted
anything else                    anything         `PassthroughReader` (first bytes = first token)
any request                      a redirect, or   `PassthroughReader`: no generation to judge; the
                                 204 / 205        client follows the redirect as without a guard
==============================  ===============  ==============================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmguard_client._http.urlpath import names_endpoint
from llmguard_client.protocols.base import StreamReader
from llmguard_client.protocols.body import Absorb, BodyReader
from llmguard_client.protocols.chat import ChatReader, absorb_chat_body
from llmguard_client.protocols.completions import CompletionsReader, absorb_completions_body
from llmguard_client.protocols.embeddings import EmbeddingsReader
from llmguard_client.protocols.messages import MessagesReader, absorb_message_body
from llmguard_client.protocols.passthrough import PassthroughReader
from llmguard_client.protocols.responses import ResponsesReader, absorb_response
from llmguard_client.protocols.sse import SSEReader


@dataclass(frozen=True, slots=True)
class WireProtocol:
    """One wire protocol: the path suffix that names it, its stream reader (given the choices the request asks
    for: only Chat Completions and Completions have more than one) and its body's facts."""

    name: str
    suffix: str
    stream: Callable[[int], SSEReader]
    absorb: Absorb


PROTOCOLS: tuple[WireProtocol, ...] = (
    WireProtocol("chat", "/chat/completions", ChatReader, absorb_chat_body),
    WireProtocol("completions", "/completions", CompletionsReader, absorb_completions_body),
    WireProtocol("responses", "/responses", lambda _choices: ResponsesReader(), absorb_response),
    WireProtocol("messages", "/messages", lambda _choices: MessagesReader(), absorb_message_body),
)
"""In matching order (``/chat/completions`` before ``/completions``)."""
_SUFFIXES = tuple(protocol.suffix for protocol in PROTOCOLS)


def protocol_for(method: str, path: str) -> WireProtocol | None:
    """The protocol of a request, or None (only POSTs to a known path suffix have one)."""
    if method != "POST" or not names_endpoint(path, _SUFFIXES):
        return None
    path = path.rstrip("/")
    return next(protocol for protocol in PROTOCOLS if path.endswith(protocol.suffix))


NO_GENERATION = frozenset({204, 205})
"""Success statuses that carry no body (`reader_for` passes them through, as the 3xx)."""


def reader_for(
    method: str, path: str, content_type: str, requested_stream: bool, status: int = 200, choices: int = 1
) -> StreamReader:
    """A fresh reader for one answer (``status`` below 400, ``choices`` the request's ``n``); see the module
    docstring for the table."""
    protocol = protocol_for(method, path)
    if 300 <= status < 400 or status in NO_GENERATION:
        return PassthroughReader()
    if protocol is None:
        embeddings = method == "POST" and path.rstrip("/").endswith("/embeddings") and "json" in content_type.lower()
        return EmbeddingsReader() if embeddings else PassthroughReader()
    content_type = content_type.lower()
    if "text/event-stream" in content_type:
        reader = protocol.stream(choices)
        if not requested_stream:  # the SDKs read a non-streaming answer as JSON whatever its label
            reader.unlabelled(plain=BodyReader(protocol.absorb))
        return reader
    if requested_stream:
        reader = protocol.stream(choices)
        reader.unlabelled(json_body="json" in content_type)
        return reader
    if "json" in content_type:
        return BodyReader(protocol.absorb)
    return PassthroughReader()
