"""The layer protocol, the composition of a pipeline, and the `Pipeline` that declares it whole.

Every layer is an object with one method::

    async def __call__(self, call: Call, route: Route, call_next: Next) -> Outcome

It may act before and after ``call_next``, call it several times (retry), concurrently
(hedge), or not at all (a bulkhead that refuses). The innermost handler (the attempt)
takes ``(call, route)`` only. `GuardTransport` declares the order once, in a `Pipeline`, beside
the stream stages that run after the first token (`StreamStages`).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from llmguard_client._core.call import Call
from llmguard_client._core.outcome import Outcome, Route

if TYPE_CHECKING:
    import httpx

    from llmguard_client._core.clock import TimeSource
    from llmguard_client._stream.continuation import Continuer
    from llmguard_client._stream.watchdog import ReadWatchdog

Next = Callable[[Call, Route], Awaitable[Outcome]]


class Watch(Protocol):
    """Bounds the reads of a live stream by ``stall`` and ``total_at`` with a watchdog over ``response``'s
    socket; None where the body must bound each read with a cancel scope instead."""

    def __call__(
        self, response: httpx.Response, stall: float, total_at: float, time_source: TimeSource
    ) -> ReadWatchdog | None: ...


@dataclass(frozen=True, slots=True)
class StreamStages:
    """The stages after the first token, in the order a chunk meets them (`llmguard_client._stream.body`):

    1. ``deadlines``: the tier's stall and total limits on every read (``watch``: a read watchdog, or a
       cancel scope per read where it returns None);
    2. the protocol reader: the winner's own (`Win.reader`, chosen by the attempt), fed every chunk;
       an in-stream error or an EOF before the end marker is a break;
    3. ``continuation``: a break handed to the call's continuation (None: no tier has one), which sends a
       continuation route through `Pipeline.continuation`.
    """

    watch: Watch
    continuation: Continuer | None = None
    """Mid-stream failover (`llmguard_client._stream.continuation`), or None."""


class Layer(Protocol):
    """One resilience concern, wrapped around the rest of the pipeline."""

    async def __call__(self, call: Call, route: Route, call_next: Next) -> Outcome: ...


def compose(layers: Sequence[Layer], innermost: Next) -> Next:
    """``layers[0]`` outermost, ``innermost`` last: one handler for the whole pipeline.

    Each layer is bound to the rest with `functools.partial`, not a wrapping coroutine: a call
    then runs through one frame per layer, and every resumption of a waiting attempt passes
    through that many frames, not twice as many."""
    handler = innermost
    for layer in reversed(layers):
        handler = functools.partial(layer.__call__, call_next=handler)
    return handler


class Pipeline:
    """The whole pipeline of a guarded call, declared once: the layers before the first token (outermost
    first) and the innermost attempt; the layers a continuation route goes through (a subset of the same
    layer objects: no second copy of any of them); and the stages of the stream after the first token.

    ``handle`` runs a call's first route; ``continuation`` runs a continuation route (kind
    ``continuation``) through its layers and the same attempt."""

    __slots__ = ("attempt", "continuation", "continuation_layers", "handle", "layers", "stream")

    def __init__(
        self,
        layers: Sequence[Layer],
        attempt: Next,
        continuation_layers: Sequence[Layer],
        stream: StreamStages,
    ) -> None:
        missing = [layer for layer in continuation_layers if layer not in layers]
        if missing:
            raise ValueError(f"continuation layers must be layers of the pipeline; not in it: {missing!r}")
        self.layers = tuple(layers)
        self.attempt = attempt
        self.continuation_layers = tuple(continuation_layers)
        self.stream = stream
        self.handle: Next = compose(self.layers, attempt)
        self.continuation: Next = compose(self.continuation_layers, attempt)
