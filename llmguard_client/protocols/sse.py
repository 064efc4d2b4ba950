"""Server-sent events framing (``text/event-stream``), shared by the event-stream readers.

`SSEReader` splits the bytes into lines (LF, CRLF or bare CR, also when split across chunks), joins the
``data:`` lines of an event, remembers its ``event:`` name, and hands each complete event (on its
blank line) to `SSEReader.event`. Comments, ``id:``/``retry:`` fields and events with no or empty
data are skipped. At EOF an unterminated last event is still handed over (lenient: a server that omits the
final blank line is not judged truncated for it).

A stream asked for and answered without the ``text/event-stream`` content type (a proxy that labels it
``application/json``, a server that says ``application/x-ndjson``, no label at all) is judged by its first
bytes, as the SDKs read it regardless of the label (`SSEReader.unlabelled`): a body that opens with an event
field (``data:``, ``event:``, ``id:``, ``retry:`` or a ``:`` comment, after blank lines) is read as events;
any other body is a plain one where a stream was asked for (`NotAStreamReader`: a failure). An answer labelled
``text/event-stream`` where no stream was asked for is judged the same way: events are read as events, any
other body as the JSON answer it is (a gateway's label; the SDKs parse a non-streaming answer as JSON).
"""

from __future__ import annotations

import json
from abc import abstractmethod
from typing import Any

from llmguard_client.protocols.base import StreamFailure, StreamReader
from llmguard_client.protocols.body import NotAStreamReader
from llmguard_client.protocols.errors import error_failure, malformed

_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")
_SNIFF_LIMIT = 1024
"""Bytes of blank lines an unlabelled body may open with before it is judged not to be an event stream."""


def opens_like_events(head: bytes) -> bool | None:
    """Whether an unlabelled body that opens with ``head`` is an event stream; None while it cannot tell."""
    head = head.lstrip(b"\r\n")
    if any(head.startswith(field) for field in _FIELDS):
        return True
    if not head or any(field.startswith(head) for field in _FIELDS):
        return None
    return False


class _Unlabelled:
    """The opening of an unlabelled body, held until it shows what the body is."""

    __slots__ = ("head", "plain", "reads_plain")

    def __init__(self, reads_plain: StreamReader) -> None:
        self.head = b""
        self.reads_plain = reads_plain
        """The reader of the body if it is not an event stream."""
        self.plain: StreamReader | None = None


class SSEReader(StreamReader):
    """The framing half of an event-stream reader; subclasses give events their meaning."""

    __slots__ = ("_data", "_event", "_events", "_held", "_partial", "_skip_lf", "_unlabelled")

    end_marker: str = "its end marker"
    """How the protocol ends a complete answer (for the truncation message)."""

    def __init__(self) -> None:
        super().__init__()
        self._partial = b""
        """The bytes of a line begun but not ended (with `_held`)."""
        self._held: list[bytes] = []
        """Chunks that continue `_partial` without ending its line, joined once the line ends: a line of
        many chunks (a large base64 image in one event) is copied once, not once per chunk."""
        self._skip_lf = False
        self._data: list[bytes] = []
        self._event = b""
        self._events = 0
        self._unlabelled: _Unlabelled | None = None

    def unlabelled(self, *, json_body: bool = False, plain: StreamReader | None = None) -> None:
        """The answer's label may not say what it is (``json_body``: it said JSON): let its first bytes decide
        (see the module docstring). A body that is not an event stream is read by ``plain`` (its facts are this
        reader's), by default a `NotAStreamReader`. Called before the first chunk."""
        reads_plain = NotAStreamReader(json_body=json_body) if plain is None else plain
        reads_plain.facts = self.facts
        self._unlabelled = _Unlabelled(reads_plain)

    @property
    def chunks(self) -> int | None:
        return self._events

    def feed(self, chunk: bytes) -> bool:
        if self.failure is not None:
            return self.first_token
        if self._unlabelled is not None:
            return self._feed_unlabelled(chunk)
        if self.first_token and not self._partial and not self._data and not self._event and self.skippable(chunk):
            self._events += chunk.count(b"\n\n")  # whole events only, none of interest: just count them
            return True
        if self._partial:
            if 10 not in chunk and 13 not in chunk:  # the line goes on (ints: see the CR test below)
                self._held.append(chunk)
                return self.first_token
            if self._held:
                chunk = b"".join(self._held) + chunk
                self._held.clear()
            data = self._partial + chunk
        else:
            data = chunk
        if self._skip_lf:  # the previous chunk ended with CR: a leading LF completes that CRLF
            self._skip_lf = False
            if data.startswith(b"\n"):
                data = data[1:]
        # CRLF or bare-CR line endings (rare): normalise to LF. The CR is tested as an int: with a bytes
        # needle, bytes' `in` first tries it as an int and raises inside (~3x the cost).
        if 13 in data:
            self._skip_lf = data.endswith(b"\r")
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if not line:
                if self._data:
                    data = b"\n".join(self._data)
                    self._data = []
                    if data:  # an event with empty data is not dispatched (SSE spec)
                        self.event(self._event, data)
                        if self.failure is not None:
                            break
                self._event = b""
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            elif line.startswith(b"event:"):
                self._event = line[6:].strip()
        return self.first_token

    def _feed_unlabelled(self, chunk: bytes, *, ended: bool = False) -> bool:
        body = self._unlabelled
        assert body is not None
        if body.plain is None:
            body.head += chunk
            events = opens_like_events(body.head)
            if events is None and len(body.head) <= _SNIFF_LIMIT and not ended:
                return False
            chunk, body.head = body.head, b""
            if events:
                self._unlabelled = None
                return self.feed(chunk)
            body.plain = body.reads_plain
        body.plain.feed(chunk)
        self.failure = body.plain.failure
        return False

    def end_of_body(self) -> StreamFailure | None:
        if self._unlabelled is not None:
            self._feed_unlabelled(b"", ended=True)
            plain = None if self._unlabelled is None else self._unlabelled.plain
            if plain is not None:
                self.failure = plain.end_of_body()
                self.first_token, self.complete = plain.first_token, plain.complete
                return self.failure
        if self.failure is None and (self._partial or self._data):
            self.feed(b"\n\n")  # hand over an unterminated last event
        if self.failure is None and not self.complete and not self.whole_at_end():
            state = "after the first content token" if self.first_token else "before any content token"
            self.failure = StreamFailure(
                "truncated", f"the {self.protocol} stream ended {state}, without {self.end_marker}"
            )
        return self.failure

    def whole_at_end(self) -> bool:
        """At the body's end without the end marker: whether what came is a whole answer all the same. The
        default is never; readers override it."""
        return False

    def skippable(self, chunk: bytes) -> bool:
        """After the first token: True if ``chunk`` holds only whole events that need no decoding
        (then they are counted, not split). The default is never; readers override it."""
        return False

    @abstractmethod
    def event(self, name: bytes, data: bytes) -> None:
        """One complete event: its ``event:`` name (b"" if none) and its joined data."""

    # --- helpers for subclasses -------------------------------------------------------------

    def decode(self, data: bytes, what: str) -> dict[str, Any] | None:
        """``data`` as a JSON object; otherwise None, and before the first token a ``malformed`` failure
        (after it the event is passed through unjudged: the caller's parser sees it)."""
        try:
            obj = json.loads(data.decode())  # event streams are UTF-8: no encoding to detect
        except (ValueError, RecursionError):  # (a UnicodeDecodeError is a ValueError)
            obj = None
        if isinstance(obj, dict):
            return obj
        if not self.first_token:
            self.failure = malformed(what, data)
        return None

    def fail_with(self, error: object, error_type: object = None, envelope: dict[str, Any] | None = None) -> None:
        """Record an in-stream error event (``envelope``: see `error_failure`)."""
        self.failure = error_failure(error, "error_event", error_type, envelope)
