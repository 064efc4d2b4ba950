"""The phase records of SDK calls, within reach: ``with guard.capture() as calls:``.

An SDK such as openai returns its own objects, so a call's `PhaseRecord` is not on
anything the caller holds. A capture collects the records of the calls made inside
the block (in tasks started there too: they inherit the context) that end before the
block exits; a streamed call ends when its stream is read to the end or closed::

    with guard.capture() as calls:
        stream = await client.chat.completions.create(..., stream=True)
        async for chunk in stream:
            ...
    record = calls[-1]          # the PhaseRecord: ttft, attempts, cause...

The core calls `deliver_to_captures` once per call, when the record is final. The
captures a call belongs to are read from ``request.extensions`` when an edge put them
there (the sync edges do: their calls run on another thread), else from the context
the core calls it in.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from llmguard_client.telemetry.record import PhaseRecord

CAPTURES_EXTENSION = "llmguard.captures"
"""The request extension under which an edge passes the open captures to the core."""


class Capture(list[PhaseRecord]):
    """The records of one ``capture()`` block, in the order the calls ended."""

    __slots__ = ("open",)

    def __init__(self) -> None:
        super().__init__()
        self.open = True


_active: ContextVar[tuple[Capture, ...]] = ContextVar("llmguard_captures", default=())


@contextmanager
def capture() -> Iterator[Capture]:
    """Collect the `PhaseRecord` of every guarded call that is made and ends inside the block.

    Blocks nest (an inner call lands in every enclosing capture). The list may be read
    inside the block; after the block no more records are added to it.
    """
    calls = Capture()
    token = _active.set((*_active.get(), calls))
    try:
        yield calls
    finally:
        calls.open = False
        _active.reset(token)


def active_captures() -> tuple[Capture, ...]:
    """The captures open in the current context (for an edge to pass on to another thread)."""
    return _active.get()


def deliver_to_captures(record: PhaseRecord, request: Any = None) -> None:
    """Hand a final record to the captures its call belongs to (the core calls this once per call).

    ``request``: the caller's request as the core received it; its ``extensions`` may carry
    the captures (see `CAPTURES_EXTENSION`), else the current context's are used.
    """
    extensions = getattr(request, "extensions", None)
    captures = extensions.get(CAPTURES_EXTENSION) if isinstance(extensions, Mapping) else None
    for calls in captures if captures is not None else _active.get():
        if calls.open:
            calls.append(record)
